//! Prints one example frame of every kind as `SPEC.md` shows them, ready to paste into its
//! "Example frames" section: `cargo run -p station-protocol --example spec_frames`.

use station_protocol::Response;
use station_protocol::spec_examples::{SpecMessage, spec_examples};

fn main() {
    for example in spec_examples() {
        let (role, message) = match &example.message {
            SpecMessage::Request(request) => ("A request", format!("{request:?}")),
            SpecMessage::Response(response @ Response::Notify(_)) => {
                ("A notification", format!("{response:?}"))
            }
            SpecMessage::Response(response) => ("An answer", format!("{response:?}")),
        };
        let dump = match example.dump() {
            Ok(dump) => dump,
            Err(error) => {
                eprintln!("{}: {error}", example.name);
                std::process::exit(1);
            }
        };
        println!("### {}\n", example.name);
        println!("{role}, request id {}: `{message}`\n", example.request_id);
        println!("```hex {}\n{dump}```\n", example.name);
    }
}

//! The trace of one seed: who did what when, in simulated milliseconds since the start. The same
//! seed gives the same trace byte for byte (a test runs a seed twice and compares).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// The trace, cheap to clone; every part of the simulation writes to it.
#[derive(Clone)]
pub struct Trace {
    shared: Arc<Mutex<Lines>>,
}

struct Lines {
    start: Instant,
    text: String,
    /// Printed as they come (`--trace`).
    echo: bool,
}

impl Trace {
    pub fn new(echo: bool) -> Trace {
        Trace {
            shared: Arc::new(Mutex::new(Lines {
                start: Instant::now(),
                text: String::new(),
                echo,
            })),
        }
    }

    /// Simulated milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        let start = self.shared.lock().unwrap().start;
        Instant::now().duration_since(start).as_millis() as u64
    }

    /// The simulation's start.
    pub fn start(&self) -> Instant {
        self.shared.lock().unwrap().start
    }

    pub fn note(&self, line: impl AsRef<str>) {
        let now = Instant::now();
        let mut lines = self.shared.lock().unwrap();
        let at = now.duration_since(lines.start);
        let start = lines.text.len();
        let _ = writeln!(
            lines.text,
            "{:>7}.{:03} {}",
            at.as_secs(),
            at.subsec_millis(),
            line.as_ref()
        );
        if lines.echo {
            print!("{}", &lines.text[start..]);
        }
    }

    pub fn text(&self) -> String {
        self.shared.lock().unwrap().text.clone()
    }
}

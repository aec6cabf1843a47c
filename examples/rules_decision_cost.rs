//! The cost of one access-rules decision with 1 000 rules over 500 channels: median, p99 and
//! the first decision of a channel (which works out the channel's rules), printed, never
//! asserted. Run with `cargo run --release --example rules_decision_cost`.

use std::time::Instant;

use station_gateway::rules::{Action, ChannelFacts, Rules, Subject};
use station_protocol::Value;

const CHANNELS: usize = 500;
const RULES: usize = 1000;
const DECISIONS: usize = 200_000;

fn rules_file() -> String {
    let mut text = String::from("default = \"deny\"\n[users]\n");
    for group in 0..20 {
        text.push_str(&format!("g{group} = [\"user{group}\", \"all\"]\n"));
    }
    text.push_str("[hosts]\nlab = [\"10.0.0.0/8\"]\n");
    // 100 channel groups: 10 modules × globs on a tenth of the items.
    for group in 0..100 {
        text.push_str(&format!(
            "[channels.c{group}]\nnames = [\"0.{}.MOD{}.ITEM{}*\"]\n",
            group % 10,
            group % 10,
            group / 10
        ));
    }
    let actions = [
        "read_cache",
        "read_hardware",
        "write",
        "transact",
        "configure",
    ];
    for rule in 0..RULES {
        let verb = if rule % 23 == 0 { "deny" } else { "allow" };
        text.push_str(&format!(
            "[[rule]]\nname = \"r{rule}\"\nchannels = [\"c{}\", \"c{}\"]\nusers = [\"g{}\"]\n{}\n{verb} = [\"{}\", \"{}\", \"{}\"]\n",
            rule % 100,
            (rule * 7) % 100,
            rule % 20,
            if rule % 3 == 0 { "hosts = [\"lab\"]" } else { "" },
            actions[rule % actions.len()],
            actions[(rule + 1) % actions.len()],
            actions[(rule + 3) % actions.len()],
        ));
    }
    text
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize]
}

fn main() {
    let text = rules_file();
    let started = Instant::now();
    let rules = Rules::compile(&text, 1).expect("the generated rules compile");
    println!(
        "compiled {} rules ({} bytes) in {:.1} ms",
        rules.rule_count(),
        text.len(),
        started.elapsed().as_secs_f64() * 1000.0
    );
    let names: Vec<String> = (0..CHANNELS)
        .map(|i| format!("0.{}.MOD{}.ITEM{}{}", i % 10, i % 10, (i / 10) % 10, i))
        .collect();
    // Twenty users of one group each, and `all`, in every group (every rule names it).
    let mut users: Vec<String> = (0..20).map(|g| format!("user{g}")).collect();
    users.push("all".into());
    let value = Value::Float(1.0);
    let mut first = Vec::with_capacity(CHANNELS);
    for name in &names {
        let who = rules.principal(&Subject {
            name: Some(&users[0]),
            address: Some("10.1.2.3".parse().unwrap()),
            group: None,
            holds_lease: true,
        });
        let at = Instant::now();
        std::hint::black_box(rules.decide(
            &who,
            &ChannelFacts::named(name),
            Action::Write,
            Some(&value),
        ));
        first.push(at.elapsed().as_nanos() as u64);
    }
    first.sort_unstable();
    let principals: Vec<_> = users
        .iter()
        .map(|user| {
            rules.principal(&Subject {
                name: Some(user),
                address: Some("10.1.2.3".parse().unwrap()),
                group: None,
                holds_lease: true,
            })
        })
        .collect();
    let actions = [
        Action::ReadCache,
        Action::Write,
        Action::Configure,
        Action::Transact,
    ];
    let mut times = Vec::with_capacity(DECISIONS);
    let mut allowed = 0usize;
    for i in 0..DECISIONS {
        let channel = ChannelFacts::named(&names[(i * 7919) % CHANNELS]);
        let who = &principals[i % principals.len()];
        let action = actions[i % actions.len()];
        let at = Instant::now();
        let decision = rules.decide(who, &channel, action, Some(&value));
        times.push(at.elapsed().as_nanos() as u64);
        allowed += usize::from(decision.allowed);
    }
    times.sort_unstable();
    let started = Instant::now();
    for i in 0..DECISIONS {
        let who = rules.principal(&Subject {
            name: Some(&users[i % users.len()]),
            address: Some("10.1.2.3".parse().unwrap()),
            group: None,
            holds_lease: false,
        });
        std::hint::black_box(who);
    }
    let principal_ns = started.elapsed().as_nanos() as f64 / DECISIONS as f64;
    println!(
        "first decision of a channel (works out its rules): median {} ns, p99 {} ns",
        percentile(&first, 0.5),
        percentile(&first, 0.99)
    );
    println!(
        "decision ({DECISIONS} over {CHANNELS} channels, {} allowed): median {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
        allowed,
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        percentile(&times, 0.999),
        times.last().copied().unwrap_or(0)
    );
    println!("resolving a caller's groups (once per request): mean {principal_ns:.0} ns");
}

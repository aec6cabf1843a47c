//! What a tick of 10 000 filtered subscriptions (10 of 54 channels each, deadband 0.5) costs
//! the scheduler's decision, with the index (`FilterIndex`) and with the plain rule applied to
//! every (subscription, channel): per tick, median and max, printed, never asserted. The
//! values are like the default station's: monitors with a little noise, slow sines, a text
//! that changes once a second. Run with `cargo run --release --example filter_index_cost`.

use std::time::{Duration, Instant as StdInstant};

use station_gateway::events::filter::{ChannelFilter, Observed, SubscriptionFilter};
use station_gateway::events::filter_index::FilterIndex;
use station_protocol::Value;
use tokio::time::Instant;

const SUBSCRIPTIONS: usize = 10_000;
const CHANNELS: usize = 54;
const EACH: usize = 10;
const TICKS: usize = 200;

/// Each channel's value at tick `k`: 40 noisy monitors, 13 slow sines, one text (the uptime).
/// `speed` scales how fast the sines move (radians per tick per sine).
fn values(k: usize, speed: f64, noise: &mut u64) -> Vec<Value> {
    (0..CHANNELS)
        .map(|channel| {
            *noise ^= *noise << 13;
            *noise ^= *noise >> 7;
            *noise ^= *noise << 17;
            let jitter = (*noise % 1000) as f64 / 1000.0 * 0.04 - 0.02;
            match channel {
                0..40 => Value::Float(3.3 + jitter),
                40..53 => {
                    Value::Float(10.0 * ((k as f64) * speed * (channel - 39) as f64).sin() + jitter)
                }
                _ => Value::String(format!("up {} s", k / 10)),
            }
        })
        .collect()
}

fn summary(mut times: Vec<Duration>) -> String {
    times.sort();
    format!(
        "median {:.1} µs, p90 {:.1} µs, max {:.1} µs",
        times[times.len() / 2].as_secs_f64() * 1e6,
        times[times.len() * 9 / 10].as_secs_f64() * 1e6,
        times[times.len() - 1].as_secs_f64() * 1e6
    )
}

fn main() {
    // Slow sines: a few hundred pairs pass a tick, as in bench scenario 5b. Fast ones: most of
    // the sines' pairs pass every tick.
    for (what, speed) in [("slow sines", 0.0005), ("fast sines", 0.01)] {
        println!("{what}:");
        compare(speed);
    }
}

fn compare(speed: f64) {
    let filter = ChannelFilter {
        deadband: Some(0.5),
        ..ChannelFilter::default()
    };
    let channels_of =
        |s: usize| -> Vec<u32> { (0..EACH).map(|c| ((s + c) % CHANNELS) as u32).collect() };
    let t0 = Instant::now();
    let at = |k: usize| t0 + Duration::from_millis(100) * k as u32;

    // The index.
    let mut index: FilterIndex<()> = FilterIndex::default();
    let slots: Vec<u32> = (0..SUBSCRIPTIONS)
        .map(|s| index.add((), &channels_of(s), &[filter; EACH]))
        .collect();
    let mut noise = 0x2545_f491_4f6c_dd1d_u64;
    let first = values(0, speed, &mut noise);
    for &slot in &slots {
        let observe = |channel: u32| Observed::Value(&first[channel as usize]);
        let all: Vec<u32> = (0..EACH as u32).collect();
        index.sent(slot, &all, observe, at(0));
        index.join(slot, at(1));
    }
    let mut passed = Vec::new();
    let mut positions = Vec::new();
    let mut index_times = Vec::new();
    let mut passes = 0usize;
    let mut noise_index = noise;
    for k in 1..=TICKS {
        let now = values(k, speed, &mut noise_index);
        let observe = |channel: u32| Observed::Value(&now[channel as usize]);
        let started = StdInstant::now();
        index.evaluate(at(k), observe, &mut passed);
        for member in passed.chunk_by(|a, b| a.0 == b.0) {
            positions.clear();
            positions.extend(member.iter().map(|&(_, p)| p));
            index.sent(member[0].0, &positions, observe, at(k));
        }
        index_times.push(started.elapsed());
        passes += passed.len();
    }

    // The plain rule over every pair.
    let mut plain: Vec<SubscriptionFilter> = (0..SUBSCRIPTIONS)
        .map(|_| SubscriptionFilter::new(vec![filter; EACH]))
        .collect();
    for (s, rule) in plain.iter_mut().enumerate() {
        for (position, channel) in channels_of(s).into_iter().enumerate() {
            rule.sent(position, Observed::Value(&first[channel as usize]), at(0));
        }
    }
    let lists: Vec<Vec<u32>> = (0..SUBSCRIPTIONS).map(channels_of).collect();
    let mut plain_times = Vec::new();
    let mut plain_passes = 0usize;
    let mut noise_plain = noise;
    for k in 1..=TICKS {
        let now = values(k, speed, &mut noise_plain);
        let started = StdInstant::now();
        for (rule, channels) in plain.iter_mut().zip(&lists) {
            positions.clear();
            for (position, &channel) in channels.iter().enumerate() {
                if rule.passes(position, Observed::Value(&now[channel as usize]), at(k)) {
                    positions.push(position as u32);
                }
            }
            for &position in &positions {
                let channel = channels[position as usize] as usize;
                rule.sent(position as usize, Observed::Value(&now[channel]), at(k));
            }
            plain_passes += positions.len();
        }
        plain_times.push(started.elapsed());
    }
    println!(
        "{SUBSCRIPTIONS} filtered subscriptions × {EACH} of {CHANNELS} channels, deadband 0.5, {TICKS} ticks"
    );
    println!(
        "index:      {} per tick (decision and bookkeeping of what passed); {passes} pairs passed",
        summary(index_times)
    );
    println!(
        "plain rule: {} per tick (every pair); {plain_passes} pairs passed",
        summary(plain_times)
    );
}

//! The merged exposition of several stations: each family once, every sample with its station,
//! the gateway's own families once and unlabelled, label values with braces and quotes intact.

use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::metrics::{
    Histogram, HistoryCounts, LeaseCounters, LinkCounts, Metrics, PREFIX, Snapshot,
};

/// What one station's parts keep, to render from.
struct Station {
    metrics: Metrics,
    latency: Histogram,
    lease: LeaseCounters,
}

impl Station {
    fn new(requests: u64) -> Station {
        let station = Station {
            metrics: Metrics::new(vec!["unmatched", "values_get", "lease"]),
            latency: Histogram::default(),
            lease: LeaseCounters::default(),
        };
        for _ in 0..requests {
            station
                .metrics
                .http
                .record(1, 200, Duration::from_micros(700));
            station.latency.observe(Duration::from_millis(2));
        }
        station
            .metrics
            .http
            .record(2, 423, Duration::from_millis(1));
        station.metrics.http_timeouts.headers.add(requests);
        station.lease.taken.add(requests);
        station
    }

    fn render(&self, history: Option<HistoryCounts>, refusals: Vec<(String, u64)>) -> String {
        Snapshot {
            metrics: &self.metrics,
            link: LinkCounts {
                frames_sent: 10,
                read_frames: 4,
                names_read: 12,
                timeouts: 0,
                crc_errors: 0,
                reconnects: 1,
                refused_by_guard: 0,
                latency: &self.latency,
            },
            link_connected: true,
            link_generation: 2,
            link_queue_depth: 0,
            cache: (5, 1),
            cache_entries: 3,
            lease_held: false,
            safe_state_pending: false,
            standby: false,
            lease: &self.lease,
            event_streams: 1,
            subscriptions: 2,
            history,
            uptime: Duration::from_secs(90),
            access_rules_version: 1,
            access_rule_refusals: refusals,
        }
        .render()
    }
}

/// Two stations' real renders: st2 has the value history on and a refusal by a rule whose name
/// has braces and a quote.
fn two_renders() -> (String, String) {
    let (st1, st2) = (Station::new(3), Station::new(5));
    let history = HistoryCounts {
        recorded: 7,
        channels: 2,
        ..HistoryCounts::default()
    };
    (
        st1.render(None, vec![("plain".into(), 1)]),
        st2.render(Some(history), vec![("odd}\"{rule".into(), 4)]),
    )
}

/// The family a sample belongs to, given the families by name and kind.
fn family_of<'a>(sample: &str, kinds: &'a HashMap<String, String>) -> Option<&'a str> {
    let name = sample_name(sample);
    kinds
        .iter()
        .find(|(family, kind)| {
            let suffix = name.strip_prefix(family.as_str());
            matches!(
                (suffix, kind.as_str()),
                (Some(""), _) | (Some("_bucket" | "_sum" | "_count"), "histogram")
            )
        })
        .map(|(family, _)| family.as_str())
}

/// Reads an exposition as a scraper would, and checks what every valid one is: a family's HELP
/// and TYPE once each, HELP then TYPE; every sample under the TYPE of its family, so all of a
/// family's samples together right after it; no sample line twice. Returns the kinds.
fn check_valid(text: &str) -> HashMap<String, String> {
    let mut kinds = HashMap::new();
    let mut helps = HashMap::new();
    let mut current: Option<String> = None;
    let mut samples_seen = std::collections::HashSet::new();
    let mut last_help: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap().to_owned();
            assert!(
                helps.insert(name.clone(), ()).is_none(),
                "HELP {name} twice"
            );
            last_help = Some(name);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert_eq!(
                last_help.as_deref(),
                Some(name),
                "TYPE {name} right after its HELP"
            );
            assert!(
                kinds.insert(name.to_owned(), kind.to_owned()).is_none(),
                "TYPE {name} twice: the family is split"
            );
            current = Some(name.to_owned());
            continue;
        }
        assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
        let family = family_of(line, &kinds);
        assert_eq!(
            family,
            current.as_deref(),
            "{line} is not under its family's TYPE"
        );
        let open = line.find('{');
        if let Some(open) = open {
            assert!(label_block_end(line, open).is_some(), "{line}");
        }
        let series = line.rsplit_once(' ').unwrap().0;
        assert!(samples_seen.insert(series.to_owned()), "{series} twice");
    }
    kinds
}

fn samples(text: &str) -> Vec<&str> {
    text.lines().filter(|line| !line.starts_with('#')).collect()
}

#[test]
fn the_gateway_wide_families_are_full_names_every_render_has() {
    let (st1, _) = two_renders();
    for family in GATEWAY_WIDE_FAMILIES {
        assert!(family.starts_with(PREFIX), "{family}");
        assert!(
            st1.contains(&format!("\n# TYPE {family} "))
                || st1.starts_with(&format!("# HELP {family} ")),
            "{family} is not in a render"
        );
    }
}

#[test]
fn two_stations_renders_merge_into_one_valid_exposition() {
    let (st1, st2) = two_renders();
    check_valid(&st1);
    check_valid(&st2);
    let merged = merge_expositions(&[("st1", &st1), ("st2", &st2)], GATEWAY_WIDE_FAMILIES);
    let kinds = check_valid(&merged);
    // Every family of either station, once.
    let mut families: Vec<&str> = kinds.keys().map(String::as_str).collect();
    families.sort_unstable();
    let mut expected: Vec<String> = check_valid(&st2).into_keys().collect();
    expected.sort_unstable();
    assert_eq!(families, expected, "st2's families are st1's and more");
    let wide = |line: &str| GATEWAY_WIDE_FAMILIES.contains(&family_of(line, &kinds).unwrap_or(""));
    // Each station's own samples, every one with its station first; the gateway's once, as
    // the first station has them.
    for (id, text) in [("st1", &st1), ("st2", &st2)] {
        let own: Vec<String> = samples(text)
            .into_iter()
            .filter(|line| !wide(line))
            .map(|line| {
                let name = sample_name(line);
                match line[name.len()..].strip_prefix('{') {
                    Some(rest) => format!("{name}{{station=\"{id}\",{rest}"),
                    None => format!("{name}{{station=\"{id}\"}}{}", &line[name.len()..]),
                }
            })
            .collect();
        assert!(!own.is_empty());
        for line in &own {
            assert!(
                merged.lines().any(|merged| merged == line),
                "{line} is missing"
            );
        }
    }
    let merged_samples = samples(&merged);
    let (gateway, stations): (Vec<&str>, Vec<&str>) =
        merged_samples.iter().partition(|line| wide(line));
    assert_eq!(
        gateway,
        samples(&st1)
            .into_iter()
            .filter(|line| wide(line))
            .collect::<Vec<_>>(),
        "the gateway's families are the first station's"
    );
    assert!(gateway.iter().all(|line| !line.contains("station=")));
    assert!(gateway.contains(&"station_gateway_http_timeouts_total{stage=\"headers\"} 3"));
    assert_eq!(
        stations.len(),
        samples(&st1).len() + samples(&st2).len() - 2 * gateway.len()
    );
    for line in &stations {
        assert!(
            line.contains("{station=\"st1\"") || line.contains("{station=\"st2\""),
            "{line}"
        );
    }
    // A label value with a brace and a quote stays as it was.
    assert!(
        merged.contains(
            "\nstation_gateway_access_rule_refusals_total{station=\"st2\",rule=\"odd}\\\"{rule\"} 4\n"
        ),
        "{merged}"
    );
    assert!(merged.contains(
        "\nstation_gateway_link_request_duration_seconds_bucket{station=\"st1\",le=\"0.0025\"} 3\n"
    ));
    assert!(merged.contains(
        "\nstation_gateway_http_request_duration_seconds_sum{station=\"st2\",route=\"values_get\"} "
    ));
    assert!(merged.contains("\nstation_gateway_cache_entries{station=\"st2\"} 3\n"));
    assert!(merged.starts_with("# HELP station_gateway_build_info "));
    // A family only st2 has comes where st2 has it: after the one before it there.
    let order: Vec<&str> = merged
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| rest.split(' ').next().unwrap())
        .collect();
    let at = |name: &str| {
        order
            .iter()
            .position(|family| *family == format!("{PREFIX}{name}"))
    };
    assert_eq!(
        at("history_samples_recorded_total"),
        at("subscriptions").map(|at| at + 1)
    );
    assert_eq!(
        at("legacy_clients"),
        at("history_memory_bytes").map(|at| at + 1)
    );
}

#[test]
fn labels_are_found_outside_quoted_values_and_a_stations_own_label_is_kept_as_exported() {
    let st1 = "\
# HELP t_total Things.
# TYPE t_total counter
t_total 1
t_total{} 2 1700000000000
t_total{path=\"/a}{\\\"b\\\\\",x=\"1\"} 3
t_total{station=\"old\",k=\"v,w\"} 4
# some comment

# HELP h Latency.
# TYPE h histogram
h_bucket{le=\"0.5\"} 1
h_bucket{le=\"+Inf\"} 2
h_sum 0.7
h_count 2
untyped_thing{a=\"b\"} 9
";
    let st2 = "\
# HELP new_gauge Only here.
# TYPE new_gauge gauge
new_gauge 1
# HELP t_total Things.
# TYPE t_total counter
t_total 5
# HELP h Latency.
# TYPE h histogram
h_bucket{le=\"+Inf\"} 0
h_sum 0
h_count 0
";
    let merged = merge_expositions(&[("st1", st1), ("st-2_b", st2)], &["untyped_thing"]);
    assert_eq!(
        merged,
        "\
# HELP new_gauge Only here.
# TYPE new_gauge gauge
new_gauge{station=\"st-2_b\"} 1
# HELP t_total Things.
# TYPE t_total counter
t_total{station=\"st1\"} 1
t_total{station=\"st1\"} 2 1700000000000
t_total{station=\"st1\",path=\"/a}{\\\"b\\\\\",x=\"1\"} 3
t_total{station=\"st1\",exported_station=\"old\",k=\"v,w\"} 4
t_total{station=\"st-2_b\"} 5
# HELP h Latency.
# TYPE h histogram
h_bucket{station=\"st1\",le=\"0.5\"} 1
h_bucket{station=\"st1\",le=\"+Inf\"} 2
h_sum{station=\"st1\"} 0.7
h_count{station=\"st1\"} 2
h_bucket{station=\"st-2_b\",le=\"+Inf\"} 0
h_sum{station=\"st-2_b\"} 0
h_count{station=\"st-2_b\"} 0
untyped_thing{a=\"b\"} 9
"
    );
    assert_eq!(merge_expositions(&[], GATEWAY_WIDE_FAMILIES), "");
}

#[test]
fn a_label_block_ends_at_the_first_brace_outside_quotes() {
    let line = "m{a=\"}\",b=\"\\\"}\",c=\"\\\\\"} 1";
    let end = label_block_end(line, 1).unwrap();
    assert_eq!(&line[end..], "} 1");
    assert_eq!(
        labels(&line[2..end]),
        [("a", "a=\"}\""), ("b", "b=\"\\\"}\""), ("c", "c=\"\\\\\"")]
    );
    assert_eq!(label_block_end("m{a=\"} 1", 1), None);
}

#[test]
fn a_comma_or_station_inside_a_quoted_value_is_text_and_labels_pass_as_they_came() {
    let st1 = "\
# HELP t_total Things.
# TYPE t_total counter
t_total{path=\"a,station=b\"} 1
t_total{a=\"1\", b=\"2\"} 2
";
    assert_eq!(
        merge_expositions(&[("st1", st1)], &[]),
        "\
# HELP t_total Things.
# TYPE t_total counter
t_total{station=\"st1\",path=\"a,station=b\"} 1
t_total{station=\"st1\",a=\"1\", b=\"2\"} 2
"
    );
    assert_eq!(
        labels("path=\"a,station=b\",k=\"v\""),
        [("path", "path=\"a,station=b\""), ("k", "k=\"v\"")]
    );
}

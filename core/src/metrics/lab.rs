//! One `GET /metrics` for a gateway serving several stations: each station's own
//! exposition ([`Snapshot::render`](super::Snapshot::render)) merged into one valid text
//! exposition (format 0.0.4) by [`merge_expositions`]. Every metric family appears once, its
//! `# HELP` and `# TYPE` once, then the samples of every station in the stations' order, each
//! with `station="<id>"` as its first label. The families of the whole process
//! ([`GATEWAY_WIDE_FAMILIES`]: the build, the uptime, the HTTP connections' timeouts, refusals
//! and evictions, the lab's own access refusals, which the stations' renders each show alike)
//! are taken once, unlabelled.
//!
//! Pure: texts in, text out; nothing is read but what is given.

use std::collections::HashMap;

/// The families that belong to the whole gateway process rather than to one station, by
/// their full names (with [`PREFIX`](super::PREFIX), as they appear in an exposition): pass it
/// as [`merge_expositions`]'s `gateway_wide`.
pub const GATEWAY_WIDE_FAMILIES: &[&str] = &[
    "station_gateway_build_info",
    "station_gateway_uptime_seconds",
    "station_gateway_http_timeouts_total",
    "station_gateway_http_connections_refused_total",
    "station_gateway_http_connections_evicted_total",
    "station_gateway_lab_access_refused_total",
];

/// The label every station's sample gets first.
const STATION_LABEL: &str = "station";
/// What a sample's own `station` label becomes, as Prometheus renames a scraped label that
/// clashes with a target's (`honor_labels: false`).
const EXPORTED_STATION_LABEL: &str = "exported_station";

/// One metric family of the merged exposition.
#[derive(Debug, Default)]
struct Family {
    name: String,
    /// The first `# HELP` line seen (its text as that station wrote it).
    help: Option<String>,
    /// The first `# TYPE` line seen, and its kind.
    type_line: Option<String>,
    kind: Option<String>,
    /// One of `gateway_wide`: its lines are the first station's to show it, unlabelled.
    gateway_wide: bool,
    /// For a gateway-wide family, the station (index) whose lines it takes.
    taken_from: Option<usize>,
    /// The sample lines, each with its newline, the stations' in their order.
    samples: String,
}

impl Family {
    /// Whether a sample named `sample` belongs to this family: its name, or for a histogram
    /// (a summary) its `_bucket`, `_sum` and `_count` series (`_sum` and `_count`).
    fn has_sample(&self, sample: &str) -> bool {
        let Some(suffix) = sample.strip_prefix(self.name.as_str()) else {
            return false;
        };
        matches!(
            (suffix, self.kind.as_deref()),
            ("", _)
                | ("_bucket", Some("histogram"))
                | ("_sum" | "_count", Some("histogram" | "summary"))
        )
    }
}

/// The families in the merged order, found by name.
#[derive(Default)]
struct Families {
    all: Vec<Family>,
    by_name: HashMap<String, usize>,
    /// Indices into `all`, in the order they are written.
    order: Vec<usize>,
}

impl Families {
    /// The family `name`, made if new: written right after `after` (the family the station
    /// being read showed before it), or first when that station showed none before.
    fn get_or_insert(&mut self, name: &str, after: Option<usize>, gateway_wide: &[&str]) -> usize {
        if let Some(&index) = self.by_name.get(name) {
            return index;
        }
        let index = self.all.len();
        self.all.push(Family {
            name: name.to_owned(),
            gateway_wide: gateway_wide.contains(&name),
            ..Family::default()
        });
        self.by_name.insert(name.to_owned(), index);
        let position = match after {
            Some(previous) => self
                .order
                .iter()
                .position(|&at| at == previous)
                .map_or(self.order.len(), |at| at + 1),
            None => 0,
        };
        self.order.insert(position, index);
        index
    }
}

/// One exposition of the stations' `(id, text)`: each family once (`# HELP` and `# TYPE` as
/// the first station to show it wrote them), in the order the stations show them (the first
/// station's order, a family only a later station has placed after the one that station
/// showed before it), then its samples, every station's in the order of `stations`, each with
/// `station="<id>"` added as its first label (`name{station="st1",le="0.5"} 3`,
/// `name{station="st1"} 3`); a sample's own `station` label, if it had one, is kept as
/// `exported_station`. The families named in `gateway_wide` (full names, with the prefix:
/// [`GATEWAY_WIDE_FAMILIES`]) are the first station's that shows them, unlabelled, and no other
/// station's. Ids are taken as they are (a station's id has only letters, digits, `-` and `_`:
/// nothing to escape). Comments other than `# HELP` and `# TYPE`, and empty lines, are left
/// out; a sample before any `# TYPE` of its name is a family of its own (untyped).
pub fn merge_expositions(stations: &[(&str, &str)], gateway_wide: &[&str]) -> String {
    let mut families = Families::default();
    for (station, (id, text)) in stations.iter().enumerate() {
        // The family this station's lines are in now, and the one it showed last.
        let mut current: Option<usize> = None;
        for line in text.lines() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                let mut words = comment.trim_start().splitn(3, ' ');
                let (keyword, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                if !matches!(keyword, "HELP" | "TYPE") || name.is_empty() {
                    continue;
                }
                let index = families.get_or_insert(name, current, gateway_wide);
                current = Some(index);
                let family = &mut families.all[index];
                if !takes_from(family, station) {
                    continue;
                }
                if keyword == "HELP" {
                    family.help.get_or_insert_with(|| line.to_owned());
                } else if family.type_line.is_none() {
                    family.type_line = Some(line.to_owned());
                    family.kind = words.next().map(|kind| kind.trim().to_owned());
                }
                continue;
            }
            let name = sample_name(line);
            let index = match current.filter(|&index| families.all[index].has_sample(name)) {
                Some(index) => index,
                None => families.get_or_insert(name, current, gateway_wide),
            };
            current = Some(index);
            let family = &mut families.all[index];
            if !takes_from(family, station) {
                continue;
            }
            if family.gateway_wide {
                family.samples.push_str(line);
            } else {
                push_with_station(&mut family.samples, line, id);
            }
            family.samples.push('\n');
        }
    }
    let mut out = String::with_capacity(
        families
            .all
            .iter()
            .map(|family| family.samples.len() + 256)
            .sum(),
    );
    for &index in &families.order {
        let family = &families.all[index];
        for header in [&family.help, &family.type_line].into_iter().flatten() {
            out.push_str(header);
            out.push('\n');
        }
        out.push_str(&family.samples);
    }
    out
}

/// Whether `station`'s lines of `family` go in: every station's, but for a gateway-wide family
/// only those of the first station to show it.
fn takes_from(family: &mut Family, station: usize) -> bool {
    !family.gateway_wide || *family.taken_from.get_or_insert(station) == station
}

/// A sample line's metric name: up to its label block or the space before its value.
fn sample_name(line: &str) -> &str {
    let end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    &line[..end]
}

/// Where the label block that opens at byte `open` (a `{`) of `line` closes: the `}` outside
/// every quoted value (in which `\"` and `\\` are escapes, and `}` and `{` are text). `None`
/// when it never closes.
fn label_block_end(line: &str, open: usize) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (at, byte) in line.bytes().enumerate().skip(open + 1) {
        match (quoted, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => quoted = false,
            (false, _, b'"') => quoted = true,
            (false, _, b'}') => return Some(at),
            _ => {}
        }
    }
    None
}

/// The labels of a label block's inside (`a="x",b="y"`), each as its name and the text from
/// its name to its end (without the `,` after it), quoted values read as
/// [`label_block_end`] does.
fn labels(inside: &str) -> Vec<(&str, &str)> {
    let mut labels = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    let mut push = |from: usize, to: usize| {
        let label = inside[from..to].trim();
        if !label.is_empty() {
            let name = label.split('=').next().unwrap_or("").trim();
            labels.push((name, label));
        }
    };
    for (at, byte) in inside.bytes().enumerate() {
        match (quoted, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => quoted = false,
            (false, _, b'"') => quoted = true,
            (false, _, b',') => {
                push(start, at);
                start = at + 1;
            }
            _ => {}
        }
    }
    push(start, inside.len());
    labels
}

/// Appends `line` (a sample) with `station="<id>"` as its first label.
fn push_with_station(out: &mut String, line: &str, id: &str) {
    let name = sample_name(line);
    let rest = &line[name.len()..];
    out.push_str(name);
    out.push('{');
    out.push_str(STATION_LABEL);
    out.push_str("=\"");
    out.push_str(id);
    out.push('"');
    let Some(block) = rest.strip_prefix('{') else {
        // No labels: `name value`.
        out.push('}');
        out.push_str(rest);
        return;
    };
    let open = name.len();
    let Some(close) = label_block_end(line, open) else {
        // A block that never closes: kept as it came, after the station.
        out.push(',');
        out.push_str(block);
        return;
    };
    let inside = &line[open + 1..close];
    let own = labels(inside);
    if own.iter().any(|(label, _)| *label == STATION_LABEL) {
        for (label, text) in own {
            out.push(',');
            if label == STATION_LABEL {
                out.push_str(EXPORTED_STATION_LABEL);
                out.push_str(&text[label.len()..]);
            } else {
                out.push_str(text);
            }
        }
    } else if !inside.trim().is_empty() {
        out.push(',');
        out.push_str(inside);
    }
    out.push_str(&line[close..]);
}

#[cfg(test)]
mod tests;

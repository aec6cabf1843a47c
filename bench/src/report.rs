//! The results: one row per measurement, the markdown table, the machine description, and the
//! generated section of `BENCHMARKS.md`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::load::Measured;

/// Whether a row met its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// No target: reported for information.
    Info,
    /// Could not be measured in this build; the notes say why.
    NotMeasurable,
    /// Missed, and so was every missed part by the scenario's floor server in the same run: a
    /// server doing less than any gateway must misses it too (the notes name the floor).
    OutOfReach,
}

impl Verdict {
    pub fn from_bool(met: bool) -> Verdict {
        if met { Verdict::Met } else { Verdict::Missed }
    }

    fn text(self) -> &'static str {
        match self {
            Verdict::Met => "**met**",
            Verdict::Missed => "**MISSED**",
            Verdict::Info => "—",
            Verdict::NotMeasurable => "not measurable",
            Verdict::OutOfReach => "**MISSED**, out of reach: its floor misses it too",
        }
    }

    /// The verdict on a target of several parts, each `(gateway met, floor met)` in one run.
    /// Met when the gateway met every part. Out of reach when every part it missed, its floor
    /// (a server doing less than any gateway must) missed as well, so no gateway could meet
    /// the target on this machine. Otherwise missed: the floor met a part the gateway did not,
    /// so it does not show that part out of reach.
    pub fn beside_floor(parts: &[(bool, bool)]) -> Verdict {
        let mut missed = parts
            .iter()
            .filter(|(gateway_met, _)| !gateway_met)
            .peekable();
        if missed.peek().is_none() {
            Verdict::Met
        } else if missed.all(|(_, floor_met)| !floor_met) {
            Verdict::OutOfReach
        } else {
            Verdict::Missed
        }
    }
}

/// One line of the results table.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: String,
    pub scenario: String,
    /// What was measured through the gateway.
    pub gateway: String,
    /// The baseline and what it measured.
    pub baseline: String,
    pub ratio: String,
    pub target: String,
    pub verdict: Verdict,
    pub notes: Vec<String>,
}

impl Row {
    pub fn new(id: &str, scenario: impl Into<String>) -> Row {
        Row {
            id: id.to_owned(),
            scenario: scenario.into(),
            gateway: String::new(),
            baseline: String::new(),
            ratio: String::new(),
            target: String::new(),
            verdict: Verdict::Info,
            notes: Vec::new(),
        }
    }

    pub fn not_measurable(id: &str, scenario: impl Into<String>, why: String) -> Row {
        let mut row = Row::new(id, scenario);
        row.gateway = "—".to_owned();
        row.baseline = "—".to_owned();
        row.ratio = "—".to_owned();
        row.verdict = Verdict::NotMeasurable;
        row.notes.push(why);
        row
    }
}

/// A scenario that measured one row answers with it where one that measured several answers
/// with them all.
impl From<Row> for Vec<Row> {
    fn from(row: Row) -> Vec<Row> {
        vec![row]
    }
}

/// `12 345 req/s · p50 41 µs · p99 180 µs`, plus errors when there were any.
pub fn rate_cell(measured: &Measured) -> String {
    let mut cell = format!(
        "{} req/s · p50 {} · p99 {}",
        thousands(measured.throughput()),
        micros(measured.p50_us()),
        micros(measured.p99_us())
    );
    if measured.errors > 0 {
        let _ = write!(cell, " · {} errors", measured.errors);
    }
    cell
}

/// A latency in µs (or ms above 10 ms).
pub fn micros(us: f64) -> String {
    if us.is_nan() {
        "—".to_owned()
    } else if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

/// A number with thin spaces between thousands.
pub fn thousands(value: f64) -> String {
    let whole = value.round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

pub fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_000_000.0)
}

/// The markdown table and the notes under it.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str("| # | Scenario | Through the gateway | Baseline (same run) | Ratio | Target | Target met |\n");
    out.push_str("|---|---|---|---|---|---|---|\n");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.id,
            row.scenario,
            row.gateway,
            row.baseline,
            row.ratio,
            row.target,
            row.verdict.text()
        );
    }
    let noted: Vec<&Row> = rows.iter().filter(|row| !row.notes.is_empty()).collect();
    if !noted.is_empty() {
        out.push_str("\nNotes:\n");
        for row in noted {
            for note in &row.notes {
                let _ = writeln!(out, "- {} ({}): {note}", row.id, row.scenario);
            }
        }
    }
    out
}

/// nproc, the CPU model, memory, the kernel, and the load average when the run started.
pub fn machine() -> String {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{nproc} CPUs ({model}), {:.1} GB memory, Linux {}",
        mem_kb as f64 / 1_048_576.0,
        kernel.trim()
    )
}

/// The 1-minute load average.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The current UTC date and time, `YYYY-MM-DD HH:MM UTC`.
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}

pub const BEGIN: &str = "<!-- station-bench results: begin (generated; edit the intro above) -->";
pub const END: &str = "<!-- station-bench results: end -->";

/// Replaces the generated section of `path` (between [`BEGIN`] and [`END`]) with `section`,
/// keeping the hand-written text around it; appends the section when the markers are missing.
pub fn write_results(path: &Path, section: &str) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let generated = format!("{BEGIN}\n{section}{END}\n");
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(begin), Some(end)) if begin < end => {
            format!(
                "{}{generated}{}",
                &old[..begin],
                &old[end + END.len()..].trim_start_matches('\n')
            )
        }
        _ => format!("{old}\n{generated}"),
    };
    std::fs::write(path, new).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_beside_its_floor_is_met_out_of_reach_or_missed() {
        // Every part met: met, whatever the floor did.
        assert_eq!(
            Verdict::beside_floor(&[(true, false), (true, true)]),
            Verdict::Met
        );
        // Each part the gateway missed, the floor missed too.
        assert_eq!(
            Verdict::beside_floor(&[(false, false), (true, true)]),
            Verdict::OutOfReach
        );
        assert_eq!(
            Verdict::beside_floor(&[(false, false), (false, false)]),
            Verdict::OutOfReach
        );
        // A part the floor met and the gateway did not: not shown out of reach, missed.
        assert_eq!(
            Verdict::beside_floor(&[(false, false), (false, true)]),
            Verdict::Missed
        );
        assert_eq!(Verdict::beside_floor(&[(false, true)]), Verdict::Missed);
        // No parts at all: nothing was missed.
        assert_eq!(Verdict::beside_floor(&[]), Verdict::Met);
    }
}

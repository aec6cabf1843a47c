//! A query's times: RFC 3339 (`2026-12-01T10:00:00Z`), `now`, or relative to now (`-10m`,
//! `-1h`, `-30s`, `-2d`, `-500ms`); and times written back as RFC 3339 with milliseconds.
//! Pure: now is passed in.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Why a time could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a time: give RFC 3339 (2026-12-01T10:00:00Z), now, or a relative time like -10m, -1h, -30s, -2d, -500ms"
)]
pub struct BadTime {
    pub text: String,
}

/// `text` as milliseconds since the Unix epoch.
pub fn parse_time(text: &str, now_ms: u64) -> Result<u64, BadTime> {
    let bad = || BadTime {
        text: text.to_owned(),
    };
    let text = text.trim();
    if text == "now" {
        return Ok(now_ms);
    }
    if let Some(ago) = text.strip_prefix('-') {
        let split = ago.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let (amount, unit) = ago.split_at(split);
        let amount: u64 = amount.parse().map_err(|_| bad())?;
        let unit_ms = match unit {
            "ms" => 1,
            "s" => 1000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        let ago_ms = amount.checked_mul(unit_ms).ok_or_else(bad)?;
        return Ok(now_ms.saturating_sub(ago_ms));
    }
    let at = OffsetDateTime::parse(text, &Rfc3339).map_err(|_| bad())?;
    let ms = at.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(ms).map_err(|_| bad())
}

/// `ms` since the Unix epoch as RFC 3339 in UTC, to the millisecond.
pub fn format_time(ms: u64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let at = at
        .replace_nanosecond((ms % 1000) as u32 * 1_000_000)
        .unwrap_or(at);
    at.format(&Rfc3339).unwrap_or_else(|_| ms.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_583_200_000; // 2025-12-01T10:00:00Z

    #[test]
    fn rfc_3339_and_relative_times() {
        assert_eq!(parse_time("2025-12-01T10:00:00Z", 0), Ok(NOW));
        assert_eq!(
            parse_time("2025-12-01T11:00:00.250+01:00", 0),
            Ok(NOW + 250)
        );
        assert_eq!(parse_time("now", NOW), Ok(NOW));
        assert_eq!(parse_time("-10m", NOW), Ok(NOW - 600_000));
        assert_eq!(parse_time("-1h", NOW), Ok(NOW - 3_600_000));
        assert_eq!(parse_time("-30s", NOW), Ok(NOW - 30_000));
        assert_eq!(parse_time("-2d", NOW), Ok(NOW - 172_800_000));
        assert_eq!(parse_time("-500ms", NOW), Ok(NOW - 500));
    }

    #[test]
    fn anything_else_is_refused_with_the_text() {
        for text in ["yesterday", "-10", "-m", "-10y", "2025-13-01T00:00:00Z", ""] {
            let error = parse_time(text, NOW).unwrap_err();
            assert_eq!(error.text, text);
            assert!(error.to_string().contains("RFC 3339"));
        }
    }

    #[test]
    fn times_are_written_in_utc_to_the_millisecond() {
        assert_eq!(format_time(NOW + 250), "2025-12-01T10:00:00.25Z");
        assert_eq!(parse_time(&format_time(NOW + 7), 0), Ok(NOW + 7));
    }
}

//! Wall-clock times as log text, the date and time of day worked out (by the `time` crate)
//! once per second per thread and only the fraction written anew: access lines (RFC 3339
//! with microseconds, as `tracing_subscriber` writes them), audit lines and lease times.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// `YYYY-MM-DDTHH:MM:SS`: the part of a timestamp that one second shares.
type SecondText = [u8; 19];

thread_local! {
    /// The last second rendered on this thread, and its text.
    static LAST_SECOND: RefCell<Option<(u64, SecondText)>> = const { RefCell::new(None) };
}

/// The date and time of day of `second` since the epoch, UTC; a time past the year 9999 (out
/// of `time`'s range) shows as 9999-12-31T23:59:59.
fn render_second(second: u64) -> SecondText {
    let at = i64::try_from(second)
        .ok()
        .and_then(|second| time::OffsetDateTime::from_unix_timestamp(second).ok())
        .unwrap_or_else(|| {
            time::PrimitiveDateTime::new(
                time::Date::MAX,
                time::Time::from_hms(23, 59, 59).unwrap_or(time::Time::MIDNIGHT),
            )
            .assume_utc()
        });
    let mut text = String::with_capacity(19);
    let _ = write!(
        text,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    );
    let mut out = [b'0'; 19];
    out.copy_from_slice(&text.as_bytes()[..19]);
    out
}

/// `at`'s second as text (from this thread's cache when it is the last one asked), and the
/// nanoseconds past it.
fn second_of(at: SystemTime) -> (SecondText, u32) {
    let since_epoch = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let second = since_epoch.as_secs();
    let text = LAST_SECOND.with(|last| {
        let mut last = last.borrow_mut();
        match *last {
            Some((cached, text)) if cached == second => text,
            _ => {
                let text = render_second(second);
                *last = Some((second, text));
                text
            }
        }
    });
    (text, since_epoch.subsec_nanos())
}

fn push_digits(out: &mut Vec<u8>, value: u32, digits: u32) {
    let mut divisor = 10u32.pow(digits - 1);
    while divisor > 0 {
        out.push(b'0' + (value / divisor % 10) as u8);
        divisor /= 10;
    }
}

/// Appends `2024-05-01T12:00:00.123456Z` (UTC, microseconds): the access line's timestamp, as
/// `tracing_subscriber` writes every other line's.
pub fn push_rfc3339_micros(out: &mut Vec<u8>, at: SystemTime) {
    let (second, nanos) = second_of(at);
    out.extend_from_slice(&second);
    out.push(b'.');
    push_digits(out, nanos / 1_000, 6);
    out.push(b'Z');
}

/// `2024-05-01T12:00:00.123Z`: RFC 3339 in UTC with milliseconds.
pub fn rfc3339_millis(at: SystemTime) -> String {
    let (second, nanos) = second_of(at);
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&second);
    out.push(b'.');
    push_digits(&mut out, nanos / 1_000_000, 3);
    out.push(b'Z');
    String::from_utf8(out).unwrap_or_default()
}

/// `2026-05-29 14:23:01.442`, UTC: the audit line's timestamp, as the .NET client's
/// `docs/api/audit.md` shows it.
pub fn audit_millis(at: SystemTime) -> String {
    let mut out = String::with_capacity(23);
    push_audit_millis(&mut out, at);
    out
}

/// Appends [`audit_millis`]'s text to `out`.
pub fn push_audit_millis(out: &mut String, at: SystemTime) {
    let (mut second, nanos) = second_of(at);
    second[10] = b' ';
    let mut text = [0u8; 23];
    text[..19].copy_from_slice(&second);
    text[19] = b'.';
    let millis = nanos / 1_000_000;
    for (slot, divisor) in text[20..].iter_mut().zip([100, 10, 1]) {
        *slot = b'0' + (millis / divisor % 10) as u8;
    }
    // Digits, '-', ':', ' ' and '.': ASCII throughout.
    out.push_str(std::str::from_utf8(&text).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_written_in_utc_with_their_fraction() {
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap_day = UNIX_EPOCH + Duration::from_millis(951_786_123_456);
        assert_eq!(rfc3339_millis(leap_day), "2000-02-29T01:02:03.456Z");
        assert_eq!(audit_millis(leap_day), "2000-02-29 01:02:03.456");
        let mut micros = Vec::new();
        push_rfc3339_micros(&mut micros, leap_day + Duration::from_micros(789));
        assert_eq!(micros, b"2000-02-29T01:02:03.456789Z");
    }

    #[test]
    fn the_cached_second_is_replaced_when_the_second_changes() {
        let before = UNIX_EPOCH + Duration::from_millis(1_735_689_599_999);
        assert_eq!(rfc3339_millis(before), "2024-12-31T23:59:59.999Z");
        let after = before + Duration::from_millis(1);
        assert_eq!(rfc3339_millis(after), "2025-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(before), "2024-12-31T23:59:59.999Z");
    }

    #[test]
    fn a_time_before_the_epoch_shows_as_the_epoch() {
        let before = UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(rfc3339_millis(before), "1970-01-01T00:00:00.000Z");
    }
}

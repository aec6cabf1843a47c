//! One audit line: `timestamp ip method path status duration` as the .NET client's `docs/api/audit.md`
//! document it, then, for changes, `key=value` fields (caller, lease owner and fence, outcome,
//! what was asked). Every field is escaped: no control or format character, no unquoted
//! space, and so never a second line nor one that displays as something else.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use crate::error_kind::ErrorKind;

/// What became of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The station confirmed it (or, for the lease, the gateway did it).
    Applied,
    /// Not done: refused by access control, the lease, validation or the station.
    Refused,
    /// Some of a list applied, some refused (the answer names which).
    Partial,
    /// Sent, and then the link broke or the answer never came: it may or may not have been
    /// applied.
    Unknown,
}

impl Outcome {
    /// What a change that failed with this kind is in the audit trail: unknown where the
    /// station did not give a readable answer to what was sent
    /// ([`ErrorKind::leaves_outcome_unknown`]), else refused. (A list that failed halfway is
    /// partial: that is the change's, not its error's.)
    pub fn of_error(kind: ErrorKind) -> Outcome {
        match kind.leaves_outcome_unknown() {
            true => Outcome::Unknown,
            false => Outcome::Refused,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Refused => "refused",
            Outcome::Partial => "partial",
            Outcome::Unknown => "unknown",
        }
    }
}

/// The fields of a change beyond the documented six.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeFields {
    /// The API key's name or the user; `None`: no credentials (access control off).
    pub caller: Option<String>,
    /// The lease (owner, fence) the change was admitted under; `None`: nobody held it.
    pub lease: Option<(String, u64)>,
    pub outcome: Option<Outcome>,
    /// What was asked, e.g. `VSET1=100` (values, file names; never credentials or lease ids).
    pub asked: Option<String>,
    /// Of a partial change: the items or steps applied, and those not.
    pub applied: Option<String>,
    pub not_applied: Option<String>,
    /// Why it was not applied, where the gateway itself failed (a safe state).
    pub why: Option<String>,
}

/// The six documented fields.
#[derive(Debug, Clone)]
pub struct RequestLine<'a> {
    pub at: SystemTime,
    /// The peer; `None` for what the gateway did by itself (a lease that ran out).
    pub ip: Option<IpAddr>,
    /// `GET`, `POST`, ...; `LEASE` and `LEGACY` for the lease's own events and the legacy port.
    pub method: &'a str,
    pub path: &'a str,
    /// The HTTP status; `-` where there is none.
    pub status: Option<u16>,
    pub duration: Option<Duration>,
}

impl RequestLine<'_> {
    /// The line, without its newline.
    pub fn render(&self, change: Option<&ChangeFields>) -> String {
        // One allocation, long enough for a read's line and most changes'.
        let mut line = String::with_capacity(128);
        self.render_into(&mut line, change);
        line
    }

    /// Appends the line, without its newline, to `line`.
    pub fn render_into(&self, line: &mut String, change: Option<&ChangeFields>) {
        crate::timestamp::push_audit_millis(line, self.at);
        line.push(' ');
        match self.ip {
            Some(ip) => crate::numtext::push_ip(line, ip),
            None => line.push('-'),
        }
        line.push(' ');
        push_escaped(line, self.method);
        line.push(' ');
        push_escaped(line, self.path);
        match self.status {
            Some(status) => {
                line.push(' ');
                line.push_str(crate::numtext::u64_text(u64::from(status)).as_str());
            }
            None => line.push_str(" -"),
        }
        match self.duration {
            Some(duration) => {
                let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
                line.push(' ');
                line.push_str(crate::numtext::u64_text(millis).as_str());
                line.push_str("ms");
            }
            None => line.push_str(" -"),
        }
        if let Some(change) = change {
            line.push_str(" caller=");
            push_escaped(line, change.caller.as_deref().unwrap_or("-"));
            match &change.lease {
                Some((owner, fence)) => {
                    line.push_str(" owner=");
                    push_escaped(line, owner);
                    let _ = write!(line, " fence={fence}");
                }
                None => line.push_str(" owner=- fence=-"),
            }
            if let Some(outcome) = change.outcome {
                line.push_str(" outcome=");
                line.push_str(outcome.as_str());
            }
            if let Some(asked) = &change.asked {
                line.push_str(" asked=");
                push_escaped(line, asked);
            }
            if let Some(applied) = &change.applied {
                line.push_str(" applied=");
                push_escaped(line, applied);
            }
            if let Some(not_applied) = &change.not_applied {
                line.push_str(" not_applied=");
                push_escaped(line, not_applied);
            }
            if let Some(why) = &change.why {
                line.push_str(" why=");
                push_escaped(line, why);
            }
        }
    }
}

/// Whether a line is a change's (it has an outcome or is the lease's own); the status page
/// shows the last of these.
pub fn is_change_line(line: &str) -> bool {
    line.contains(" outcome=") || line.split(' ').nth(3) == Some("LEASE")
}

/// Appends `value` as one field: as it is when it holds nothing but printable characters other
/// than space, `"` and `\`; otherwise in double quotes, with `\"`, `\\` and `\xNN` / `\u{NNNN}`
/// for control, whitespace and format characters ([`needs_escape`]). Empty: `""`.
pub fn push_escaped(out: &mut String, value: &str) {
    // ASCII (every path, method and address) has no format characters: a byte test will do.
    let plain = !value.is_empty()
        && if value.is_ascii() {
            value
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        } else {
            value
                .chars()
                .all(|c| !needs_escape(c) && c != '"' && c != '\\')
        };
    if plain {
        out.push_str(value);
        return;
    }
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' ' => out.push(' '),
            c if needs_escape(c) => {
                let code = u32::from(c);
                if code < 0x100 {
                    let _ = write!(out, "\\x{code:02X}");
                } else {
                    let _ = write!(out, "\\u{{{code:04X}}}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Whether `c` is written as a code rather than as itself: control characters (Cc),
/// whitespace (which takes in the line and paragraph separators, Zl and Zp) and format
/// characters (Cf: the bidi overrides, embeddings, isolates and marks, zero-width characters,
/// the byte order mark, tags), which would make a line display as something it does not say.
fn needs_escape(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    c.is_control() || c.is_whitespace() || c.general_category() == GeneralCategory::Format
}

/// One field, escaped (see [`push_escaped`]).
pub fn escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    push_escaped(&mut out, value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_780_064_581_442)
    }

    #[test]
    fn a_plain_request_has_the_six_documented_fields() {
        let line = RequestLine {
            at: at(),
            ip: Some("192.168.1.55".parse().unwrap()),
            method: "GET",
            path: "/api/application/status",
            status: Some(200),
            duration: Some(Duration::from_micros(12_700)),
        };
        assert_eq!(
            line.render(None),
            "2026-05-29 14:23:01.442 192.168.1.55 GET /api/application/status 200 12ms"
        );
    }

    #[test]
    fn a_change_names_caller_owner_fence_outcome_and_what_was_asked() {
        let line = RequestLine {
            at: at(),
            ip: Some("::1".parse().unwrap()),
            method: "POST",
            path: "/api/resources/value/set",
            status: Some(423),
            duration: Some(Duration::from_millis(3)),
        };
        let change = ChangeFields {
            caller: Some("bench key".into()),
            lease: Some(("TAT station 3".into(), 7)),
            outcome: Some(Outcome::Refused),
            asked: Some("VSET1=100".into()),
            ..ChangeFields::default()
        };
        assert_eq!(
            line.render(Some(&change)),
            "2026-05-29 14:23:01.442 ::1 POST /api/resources/value/set 423 3ms caller=\"bench key\" owner=\"TAT station 3\" fence=7 outcome=refused asked=VSET1=100"
        );
        let nobody = ChangeFields {
            outcome: Some(Outcome::Applied),
            ..ChangeFields::default()
        };
        assert!(
            line.render(Some(&nobody))
                .ends_with(" caller=- owner=- fence=- outcome=applied")
        );
        assert!(is_change_line(&line.render(Some(&nobody))));
        assert!(!is_change_line(&line.render(None)));
    }

    #[test]
    fn control_characters_quotes_and_backslashes_are_escaped_never_a_second_line() {
        assert_eq!(escaped("alice"), "alice");
        assert_eq!(escaped(""), "\"\"");
        assert_eq!(
            escaped("evil\n2026-01-01 00:00:00.000 1.2.3.4 POST /x 200 1ms"),
            "\"evil\\x0A2026-01-01 00:00:00.000 1.2.3.4 POST /x 200 1ms\""
        );
        assert_eq!(escaped("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(
            escaped("tab\there\r\x1b[31m"),
            "\"tab\\x09here\\x0D\\x1B[31m\""
        );
        assert_eq!(
            escaped("bell\u{7}\u{85}\u{2028}"),
            "\"bell\\x07\\x85\\u{2028}\""
        );
        assert_eq!(escaped("Grüße"), "Grüße");
        let line = RequestLine {
            at: at(),
            ip: None,
            method: "LEASE",
            path: "taken",
            status: None,
            duration: None,
        };
        let change = ChangeFields {
            lease: Some(("x\ny\u{0}".into(), 1)),
            ..ChangeFields::default()
        };
        let rendered = line.render(Some(&change));
        assert!(!rendered.chars().any(char::is_control), "{rendered}");
        assert_eq!(
            rendered,
            "2026-05-29 14:23:01.442 - LEASE taken - - caller=- owner=\"x\\x0Ay\\x00\" fence=1"
        );
    }

    #[test]
    fn bidi_and_format_characters_are_escaped_so_a_line_reads_as_it_is() {
        // RIGHT-TO-LEFT OVERRIDE would make the rest of the line display reversed; a zero
        // width space makes two owners look the same.
        assert_eq!(escaped("bob\u{202E}evil"), "\"bob\\u{202E}evil\"");
        assert_eq!(escaped("al\u{200B}ice"), "\"al\\u{200B}ice\"");
        assert_eq!(escaped("a\u{2028}b\u{2029}c"), "\"a\\u{2028}b\\u{2029}c\"");
        // The isolates, the Arabic letter mark, the marks and embeddings, the byte order mark,
        // a soft hyphen and a tag character: every Cf character.
        for c in [
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{061C}',
            '\u{200E}',
            '\u{200F}',
            '\u{202A}',
            '\u{202D}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{E0041}',
        ] {
            let out = escaped(&format!("x{c}y"));
            assert!(!out.contains(c), "{c:?} came out raw: {out}");
            let code = match u32::from(c) {
                code @ 0..0x100 => format!("\\x{code:02X}"),
                code => format!("\\u{{{code:04X}}}"),
            };
            assert_eq!(out, format!("\"x{code}y\""));
        }
        // Letters of every script stay as they are.
        assert_eq!(escaped("Grüße_Ωμέγα_日本"), "Grüße_Ωμέγα_日本");
    }

    #[test]
    fn a_partial_change_names_what_was_applied_and_what_not() {
        let line = RequestLine {
            at: at(),
            ip: Some("::1".parse().unwrap()),
            method: "POST",
            path: "/api/channels/configure",
            status: Some(504),
            duration: Some(Duration::from_millis(3)),
        };
        let change = ChangeFields {
            outcome: Some(Outcome::Partial),
            applied: Some("configure A; configure B".into()),
            not_applied: Some("configure C".into()),
            why: Some("stopped at configure C: timed out".into()),
            ..ChangeFields::default()
        };
        assert!(
            line.render(Some(&change)).ends_with(
                " outcome=partial applied=\"configure A; configure B\" not_applied=\"configure C\" why=\"stopped at configure C: timed out\""
            ),
            "{}",
            line.render(Some(&change))
        );
    }
}

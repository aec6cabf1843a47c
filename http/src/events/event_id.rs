//! Event ids: one decimal number per event that says which gateway start (the *epoch*), which
//! stream of it, and which event of that stream it is, so that a reader reconnecting with
//! `Last-Event-ID` can be told exactly what it missed, and an id from before a restart is
//! never taken for one of this run.
//!
//! An id is the 19 digits `EEEE SSSSS QQQQQQQQQQ`: a four-digit epoch (1000 to 9221, chosen at
//! random when a station's events start, so a restart picks another one, 1 in 8 222 times the
//! same), five digits for the stream (its slot, 1 to 99 999; 0 is the lab stream's) and ten
//! for the event's place in the stream (from 1, up by one per event). It stays a decimal
//! integer below 2^63 because the clients parse it as one: the reference Python client keeps
//! `int(id)` of an all-digit id (0 otherwise) and the .NET client `long.TryParse`s it, and both
//! take an id that is not the previous one plus one for a gap. Pure: no clock, no I/O.

use std::fmt;

/// How many events one stream can number (ten digits).
pub const SEQUENCE_SPAN: u64 = 10_000_000_000;
/// How many stream slots an epoch has (five digits); slot 0 is the lab stream's.
pub const STREAM_SLOTS: u32 = 100_000;
/// The epochs a gateway picks from: four digits whose ids all stay below `i64::MAX`.
pub const EPOCHS: std::ops::RangeInclusive<u16> = 1000..=9221;

const STREAM_SPAN: u64 = SEQUENCE_SPAN * STREAM_SLOTS as u64;

/// One event's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId {
    pub epoch: u16,
    pub stream: u32,
    pub sequence: u64,
}

/// A `Last-Event-ID` that cannot be an event id of any gateway.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Last-Event-ID must be the id of an event this gateway sent (up to 19 digits); got {0:?}: reconnect without it to start a new stream"
)]
pub struct BadEventId(pub String);

impl EventId {
    pub fn new(epoch: u16, stream: u32, sequence: u64) -> EventId {
        EventId {
            epoch,
            stream,
            sequence,
        }
    }

    /// The id as the number sent on the `id:` line.
    pub fn number(self) -> u64 {
        u64::from(self.epoch) * STREAM_SPAN + u64::from(self.stream) * SEQUENCE_SPAN + self.sequence
    }

    /// The id of `number` (any number: one from an older gateway, e.g. `57`, has epoch 0).
    pub fn of_number(number: u64) -> EventId {
        EventId {
            epoch: u16::try_from(number / STREAM_SPAN).unwrap_or(u16::MAX),
            stream: ((number / SEQUENCE_SPAN) % u64::from(STREAM_SLOTS)) as u32,
            sequence: number % SEQUENCE_SPAN,
        }
    }

    /// Reads a `Last-Event-ID` (header or query parameter): digits only, at most 19, spaces
    /// around them ignored.
    pub fn parse(text: &str) -> Result<EventId, BadEventId> {
        let digits = text.trim();
        let valid = !digits.is_empty()
            && digits.len() <= 19
            && digits.bytes().all(|byte| byte.is_ascii_digit());
        match digits.parse::<u64>() {
            Ok(number) if valid => Ok(EventId::of_number(number)),
            _ => Err(BadEventId(text.chars().take(40).collect())),
        }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number())
    }
}

/// A random epoch for a station's (or the lab's) events, picked when they start.
pub fn random_epoch() -> u16 {
    use rand::Rng;
    rand::thread_rng().gen_range(EPOCHS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_nineteen_digits_of_epoch_stream_and_sequence_and_reads_back() {
        let id = EventId::new(4821, 17, 42);
        assert_eq!(id.to_string(), "4821000170000000042");
        assert_eq!(EventId::parse("4821000170000000042"), Ok(id));
        assert_eq!(EventId::parse(" 4821000170000000042 "), Ok(id));
        let largest = EventId::new(*EPOCHS.end(), STREAM_SLOTS - 1, SEQUENCE_SPAN - 1);
        assert!(largest.number() < i64::MAX as u64, "the .NET client's long");
        assert_eq!(EventId::of_number(largest.number()), largest);
    }

    #[test]
    fn the_next_event_of_a_stream_is_the_next_number() {
        let id = EventId::new(1000, 1, 9);
        let next = EventId::new(1000, 1, 10);
        assert_eq!(next.number(), id.number() + 1);
    }

    #[test]
    fn an_id_of_an_older_gateway_reads_as_epoch_zero() {
        assert_eq!(EventId::parse("57"), Ok(EventId::new(0, 0, 57)));
        assert_eq!(EventId::parse("0"), Ok(EventId::new(0, 0, 0)));
    }

    #[test]
    fn anything_but_up_to_nineteen_digits_is_refused_naming_it() {
        for bad in ["", "  ", "-1", "12a", "1.5", "99999999999999999999", "１２"] {
            let error = EventId::parse(bad).unwrap_err();
            assert!(error.to_string().contains("Last-Event-ID"), "{error}");
        }
        assert_eq!(EventId::parse("abc").unwrap_err(), BadEventId("abc".into()));
    }

    #[test]
    fn random_epochs_stay_in_their_range() {
        for _ in 0..1000 {
            assert!(EPOCHS.contains(&random_epoch()));
        }
    }
}

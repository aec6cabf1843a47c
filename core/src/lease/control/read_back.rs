//! The safe state read back, compared: which channels the station holds otherwise than the
//! safe state wants (numbers within `lease.safe_state_tolerance`, everything else exactly).
//! Pure: the shell reads the channels, this decides, the machine acts on the verdict.

use station_protocol::{ItemResult, Value};

/// A channel the station holds otherwise than the safe state wants.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Differs {
    pub(super) channel: String,
    pub(super) wanted: Value,
    pub(super) read: Value,
}

impl std::fmt::Display for Differs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} read back {}, wanted {}",
            self.channel,
            self.read.render(),
            self.wanted.render()
        )
    }
}

/// What `read` (one result per channel of `wanted`, in order) says of the safe state: the
/// channels that differ (none: it holds), or the channels not read back, each with why (the
/// station would not read it, or answered for another number of channels).
pub(super) fn compare(
    wanted: &[(String, Value)],
    read: Vec<ItemResult<Value>>,
    tolerance: f64,
) -> Result<Vec<Differs>, Vec<(String, String)>> {
    if read.len() != wanted.len() {
        return Err(vec![(
            "the safe state's channels".into(),
            format!(
                "{} values answered for {} channels",
                read.len(),
                wanted.len()
            ),
        )]);
    }
    let mut differs = Vec::new();
    let mut unread = Vec::new();
    for ((channel, wanted), read) in wanted.iter().zip(read) {
        match read {
            Ok(read) if holds(wanted, &read, tolerance) => {}
            Ok(read) => differs.push(Differs {
                channel: channel.clone(),
                wanted: wanted.clone(),
                read,
            }),
            Err(refused) => unread.push((channel.clone(), refused.message)),
        }
    }
    match unread.is_empty() {
        true => Ok(differs),
        false => Err(unread),
    }
}

/// Whether the station holding `read` holds `wanted`: numbers within `tolerance` of it (an
/// integer channel compared as a number too), booleans, enums, strings and bytes exactly.
fn holds(wanted: &Value, read: &Value, tolerance: f64) -> bool {
    match (number(wanted), number(read)) {
        (Some(wanted), Some(read)) => (wanted - read).abs() <= tolerance,
        _ => wanted == read,
    }
}

fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Float(x) => Some(*x),
        Value::Integer(n) => Some(*n as f64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use station_protocol::{ErrorCode, StationError};

    use super::*;

    fn wanted() -> Vec<(String, Value)> {
        vec![
            ("ON1".into(), Value::Bool(false)),
            ("VSET1".into(), Value::Float(0.0)),
        ]
    }

    #[test]
    fn a_safe_state_read_back_as_written_holds() {
        let read = vec![Ok(Value::Bool(false)), Ok(Value::Float(0.0))];
        assert_eq!(compare(&wanted(), read, 0.001).unwrap(), []);
    }

    #[test]
    fn numbers_hold_within_the_tolerance_and_differ_beyond_it() {
        let within = vec![Ok(Value::Bool(false)), Ok(Value::Float(-0.001))];
        assert_eq!(compare(&wanted(), within, 0.001).unwrap(), []);
        let beyond = vec![Ok(Value::Bool(false)), Ok(Value::Float(0.0011))];
        let differs = compare(&wanted(), beyond, 0.001).unwrap();
        assert_eq!(
            differs,
            [Differs {
                channel: "VSET1".into(),
                wanted: Value::Float(0.0),
                read: Value::Float(0.0011),
            }]
        );
        assert_eq!(differs[0].to_string(), "VSET1 read back 0.0011, wanted 0");
    }

    #[test]
    fn integers_are_numbers_too() {
        let wanted = [("N".to_owned(), Value::Integer(5))];
        assert_eq!(
            compare(&wanted, vec![Ok(Value::Integer(6))], 1.0).unwrap(),
            []
        );
        assert_eq!(
            compare(&wanted, vec![Ok(Value::Integer(7))], 1.0)
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            compare(&wanted, vec![Ok(Value::Float(5.5))], 1.0).unwrap(),
            []
        );
    }

    #[test]
    fn booleans_enums_and_strings_hold_only_exactly() {
        let read = vec![Ok(Value::Bool(true)), Ok(Value::Float(0.0))];
        let differs = compare(&wanted(), read, 1000.0).unwrap();
        assert_eq!(differs.len(), 1);
        assert_eq!(differs[0].to_string(), "ON1 read back True, wanted False");
        let wanted = [
            ("MODE".to_owned(), Value::Enum("Off".into())),
            ("NAME".to_owned(), Value::String("safe".into())),
        ];
        let read = vec![
            Ok(Value::Enum("On".into())),
            Ok(Value::String("safe ".into())),
        ];
        assert_eq!(compare(&wanted, read, 1000.0).unwrap().len(), 2);
        let read = vec![
            Ok(Value::Enum("Off".into())),
            Ok(Value::String("safe".into())),
        ];
        assert_eq!(compare(&wanted, read, 0.0).unwrap(), []);
    }

    #[test]
    fn a_value_of_another_type_differs() {
        let read = vec![Ok(Value::Integer(0)), Ok(Value::Bool(false))];
        assert_eq!(compare(&wanted(), read, 1.0).unwrap().len(), 2);
    }

    #[test]
    fn a_channel_the_station_would_not_read_fails_the_read_back() {
        let refused = StationError::new(ErrorCode::Busy, "busy");
        let read = vec![Ok(Value::Bool(true)), Err(refused)];
        let unread = compare(&wanted(), read, 0.001).unwrap_err();
        assert_eq!(unread, [("VSET1".to_owned(), "busy".to_owned())]);
    }

    #[test]
    fn an_answer_of_another_length_fails_the_read_back() {
        let unread = compare(&wanted(), vec![Ok(Value::Bool(false))], 0.001).unwrap_err();
        assert_eq!(unread.len(), 1);
        assert!(
            unread[0].1.contains("1 values answered for 2 channels"),
            "{unread:?}"
        );
    }
}

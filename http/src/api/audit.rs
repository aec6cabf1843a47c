//! `api/audit/...`: reading the audit trail (the `admin` role while access control is on).

use serde_json::Value as Json;

use super::call::{Answer, Call, ok};
use crate::error::ApiError;

/// The `tail` when none is asked for, as both clients default it (`get_audit_log(tail=100)` in
/// `accordionq2/audit.py` 5.28.1; the .NET client's `docs/api/audit.md`: "Default: 100").
const DEFAULT_TAIL: usize = 100;

/// `GET api/audit/log?tail=N`: the last `N` lines of the trail, changes and other requests
/// merged in time order (`0`: both current files whole), oldest first, as a JSON array of
/// strings.
pub(super) async fn log(call: Call<'_>) -> Answer {
    let tail = tail_of(call.query)?;
    call.gateway.audit.written().await;
    let lines = call
        .gateway
        .audit
        .tail(tail)
        .map_err(|why| ApiError::internal(format!("the audit trail cannot be read: {why}")))?;
    ok(Json::Array(lines.into_iter().map(Json::String).collect()))
}

/// The `tail` query parameter: a whole number of 0 or more; 400 naming it otherwise.
fn tail_of(query: Option<&str>) -> Result<usize, ApiError> {
    let mut tail = DEFAULT_TAIL;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key.eq_ignore_ascii_case("tail") {
            tail = value.parse::<usize>().map_err(|_| {
                ApiError::bad_request(format!(
                    "tail must be a whole number of 0 or more (0: the whole current files); got {value:?}"
                ))
            })?;
        }
    }
    Ok(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_defaults_to_100_and_refuses_what_is_not_a_count() {
        assert_eq!(tail_of(None).unwrap(), 100);
        assert_eq!(tail_of(Some("tail=0")).unwrap(), 0);
        assert_eq!(tail_of(Some("x=1&TAIL=7")).unwrap(), 7);
        for bad in ["tail=-1", "tail=", "tail=abc", "tail=1.5"] {
            let error = tail_of(Some(bad)).unwrap_err();
            assert_eq!(error.kind, crate::error::ErrorKind::BadRequest, "{bad}");
            assert!(error.message.contains("tail"), "{}", error.message);
        }
    }
}

//! The HTTP front end's side of the gateway's one error vocabulary: the status of each
//! [`ErrorKind`] ([`http_status`], from the kinds' one table in the core), and [`ApiError`], a
//! kind with its message, built from every lower layer's error by the kind that layer gives it
//! (the HTTP front end's own, events and credentials, are given theirs here; the named leases'
//! beside them in `named_leases.rs`).

use hyper::StatusCode;
pub use station_core::error_kind::ErrorKind;
use station_protocol::{ErrorCode, StationError};

use crate::allow::Allowed;
use crate::config_files::ConfigFileError;
use crate::credentials::AccessError;
use crate::events::EventsError;
use crate::lease::{LeaseError, LeaseStoreError};
use crate::link::LinkError;
use crate::numeric::NumericError;
use crate::station::StillRunning;

/// The HTTP status of a kind (the table is [`ErrorKind::http_status`], in the core, where a
/// change's audit line takes its status from it too).
pub fn http_status(kind: ErrorKind) -> StatusCode {
    StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// An error answer: what went wrong, and a message that says what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// How long the client should wait before it tries again, when the gateway knows
    /// (`Retry-After`: [`ApiError::retry_after_seconds`]).
    pub retry_after: Option<std::time::Duration>,
    /// For a 405: the methods the path has, sent as `Allow` (RFC 9110 requires it).
    pub allow: Allowed,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            retry_after: None,
            allow: Allowed::NONE,
        }
    }

    /// Its HTTP status, by its kind.
    pub fn status(&self) -> StatusCode {
        http_status(self.kind)
    }

    /// The `Retry-After` header's value, in whole seconds rounded up (at least 1), when the
    /// wait is known.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after
            .map(|wait| wait.as_millis().div_ceil(1000).max(1) as u64)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::BadRequest, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Unauthorized, message)
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Forbidden, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::NotFound, message)
    }

    pub fn no_such_resource(name: &str) -> ApiError {
        ApiError::not_found(format!("no such resource: {name:?}"))
    }

    /// 405: the path has only the methods `allow`, which the answer's `Allow` names.
    pub fn method_not_allowed(message: impl Into<String>, allow: Allowed) -> ApiError {
        ApiError {
            allow,
            ..ApiError::new(ErrorKind::MethodNotAllowed, message)
        }
    }

    pub fn body_timeout(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::BodyTimeout, message)
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Conflict, message)
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::TooLarge, message)
    }

    pub fn locked(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Locked, message)
    }

    pub fn limit_reached(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::LimitReached, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Internal, message)
    }

    /// 501: a documented WebApi endpoint this gateway does not serve; the message says why.
    pub fn not_implemented(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::NotOffered, message)
    }

    /// 404: a documented group or path a byte-protocol station cannot offer; the message
    /// says why.
    pub fn area_not_offered(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::AreaNotOffered, message)
    }

    pub fn station_refused(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::StationRefused(code), message)
    }

    pub fn station_failed(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::StationFailed, message)
    }

    pub fn outcome_unknown(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::OutcomeUnknown, message)
    }

    pub fn station_timeout(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::StationTimeout, message)
    }

    pub fn station_not_reached(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::StationNotReached, message)
    }

    pub fn overloaded(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Overloaded, message)
    }

    pub fn safe_state_pending(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::SafeStatePending, message)
    }

    pub fn lease_ending(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::LeaseEnding, message)
    }

    pub fn lease_store_unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::LeaseStoreUnavailable, message)
    }

    pub fn standing_by(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::StandingBy, message)
    }

    pub fn shutting_down(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::ShuttingDown, message)
    }
}

impl From<StationError> for ApiError {
    fn from(error: StationError) -> ApiError {
        ApiError::station_refused(error.code, error.message)
    }
}

impl From<LinkError> for ApiError {
    fn from(error: LinkError) -> ApiError {
        match error {
            LinkError::Station(station) => ApiError::from(station),
            other => ApiError::new(other.kind(), other.to_string()),
        }
    }
}

impl From<EventsError> for ApiError {
    fn from(error: EventsError) -> ApiError {
        let kind = match &error {
            EventsError::TooManyStreams(_) | EventsError::TooManySubscriptions { .. } => {
                ErrorKind::LimitReached
            }
            EventsError::NoSuchStream(_) | EventsError::NoSuchSubscription(_) => {
                ErrorKind::NotFound
            }
            EventsError::IntervalOutOfRange(_)
            | EventsError::IntervalNotWhole(_)
            | EventsError::NoChannels
            | EventsError::TooManyChannels { .. }
            | EventsError::UnknownChannel(_)
            | EventsError::BadFilter(_)
            | EventsError::NoRange(_)
            | EventsError::BadLastEventId(_) => ErrorKind::BadRequest,
            EventsError::StationNotReached(_) => ErrorKind::StationNotReached,
            EventsError::ShuttingDown => ErrorKind::ShuttingDown,
        };
        ApiError::new(kind, error.to_string())
    }
}

impl From<LeaseError> for ApiError {
    fn from(error: LeaseError) -> ApiError {
        ApiError {
            retry_after: error.retry_after(),
            ..ApiError::new(error.kind(), error.to_string())
        }
    }
}

impl From<crate::lease::link_custody::NotLinkOwner> for ApiError {
    fn from(error: crate::lease::link_custody::NotLinkOwner) -> ApiError {
        ApiError::new(error.kind(), error.to_string())
    }
}

impl From<AccessError> for ApiError {
    fn from(error: AccessError) -> ApiError {
        let kind = match &error {
            AccessError::Unauthenticated { .. } => ErrorKind::Unauthorized,
            AccessError::Forbidden { .. } => ErrorKind::Forbidden,
        };
        ApiError::new(kind, error.to_string())
    }
}

/// A lease backend that could not answer (unreachable, locked, failed): 503, never "held". A
/// semaphore asked for with other slots than its holders': 409.
impl From<LeaseStoreError> for ApiError {
    fn from(error: LeaseStoreError) -> ApiError {
        match crate::lease::store_error_kind(&error) {
            ErrorKind::LeaseStoreUnavailable => ApiError::lease_store_unavailable(format!(
                "{error}; the lease's state is unknown, try again"
            )),
            kind => ApiError::new(kind, error.to_string()),
        }
    }
}

/// A configuration file's errors: a bad name or file is the client's (400, 413), an unknown
/// name 404 "not found", the station's and the link's as theirs, the gateway's directory 500.
impl From<ConfigFileError> for ApiError {
    fn from(error: ConfigFileError) -> ApiError {
        ApiError::new(error.kind(), error.to_string())
    }
}

/// An acquisition that could not be planned or run: the request's fault 400, an unknown
/// sampler 404, a sample rate no acquisition can use 502; the link's and a change still running
/// as everywhere else.
impl From<NumericError> for ApiError {
    fn from(error: NumericError) -> ApiError {
        match error {
            NumericError::Link(error) => ApiError::from(error),
            other => ApiError::new(other.kind(), other.to_string()),
        }
    }
}

/// The caller stopped waiting for a change still running: 504, like a station that has not
/// answered yet (its outcome is in the audit trail once it has one).
impl From<StillRunning> for ApiError {
    fn from(error: StillRunning) -> ApiError {
        ApiError::new(error.kind(), error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::audit::line::Outcome;
    use crate::link::LinkDown;

    /// The lock-delay refuses a new lease 409 (not now: the clients' word for "someone else has
    /// it") and a change without one 423, each with how long to wait: `Retry-After` in whole
    /// seconds, rounded up (never 0); other lease refusals carry none.
    #[test]
    fn a_lock_delay_is_a_conflict_for_a_lease_and_locked_for_a_change_with_its_wait_rounded_up() {
        let refused = |wait| {
            ApiError::from(LeaseError::LockDelay {
                after: "A".into(),
                why: "ran out unreleased",
                wait,
            })
        };
        let error = refused(Duration::from_millis(2001));
        assert_eq!(error.status().as_u16(), 409);
        let change = ApiError::from(LeaseError::ChangeInLockDelay {
            after: "A".into(),
            why: "ended with changes in doubt",
            wait: Duration::from_millis(2001),
        });
        assert_eq!(change.status().as_u16(), 423);
        assert_eq!(change.retry_after_seconds(), Some(3));
        assert_eq!(error.retry_after_seconds(), Some(3));
        assert!(error.message.contains("2001 ms"), "{}", error.message);
        assert_eq!(
            refused(Duration::from_millis(3000)).retry_after_seconds(),
            Some(3)
        );
        assert_eq!(
            refused(Duration::from_millis(1)).retry_after_seconds(),
            Some(1)
        );
        assert_eq!(refused(Duration::ZERO).retry_after_seconds(), Some(1));
        let held = ApiError::from(LeaseError::Ending {
            owner: "A".into(),
            ended_ago: None,
            lock_delay_left: None,
        });
        assert_eq!(held.retry_after_seconds(), None);
    }

    /// An HTTP request's own audit line (a lease request, a change refused before it ran) takes
    /// its outcome from its error's kind; statuses 502 and 504 are unknown, any other error
    /// refused, as the line has always read.
    #[test]
    fn the_audit_outcome_of_a_kind_is_the_one_its_status_gives() {
        for kind in ErrorKind::every() {
            let status = http_status(kind);
            let unknown =
                status == StatusCode::BAD_GATEWAY || status == StatusCode::GATEWAY_TIMEOUT;
            let expected = if unknown {
                Outcome::Unknown
            } else {
                Outcome::Refused
            };
            assert_eq!(Outcome::of_error(kind), expected, "{kind:?}");
        }
    }

    #[test]
    fn an_acquisitions_errors_keep_their_statuses_and_messages() {
        let cases = [
            (
                NumericError::Invalid("Samples must be 1 to 100000".into()),
                400,
            ),
            (
                NumericError::NoSuchSampler("no NumericResult channel".into()),
                404,
            ),
            (
                NumericError::StationAnswer("a sample rate of NaN".into()),
                502,
            ),
            (NumericError::Bug("another kind of change".into()), 500),
            (NumericError::Link(LinkError::Overloaded(8)), 503),
        ];
        for (error, status) in cases {
            let message = error.to_string();
            let api = ApiError::from(error);
            assert_eq!(api.status().as_u16(), status, "{message}");
            assert_eq!(api.message, message);
        }
    }

    /// Link errors keep their statuses (their legacy codes: `legacy/src/codes.rs`).
    #[test]
    fn link_errors_keep_their_kinds() {
        use ErrorCode as C;
        let cases = [
            (LinkError::Disconnected(LinkDown::Connecting), 503),
            (LinkError::Timeout(Duration::from_secs(1)), 504),
            (
                LinkError::WriteTimeout {
                    timeout: Duration::from_secs(1),
                    max_processing: Duration::from_secs(4),
                },
                504,
            ),
            (LinkError::Overloaded(9), 503),
            (LinkError::ShuttingDown, 503),
            (
                LinkError::Station(StationError::new(C::ReadOnly, "no")),
                400,
            ),
        ];
        for (error, status) in cases {
            let kind = error.kind();
            assert_eq!(http_status(kind).as_u16(), status, "{error}");
            assert_eq!(ApiError::from(error.clone()).kind, kind);
        }
        let refused = ApiError::from(StationError::new(C::Nak, "nobody at 0x50"));
        assert_eq!(refused.kind, ErrorKind::StationRefused(C::Nak));
        assert_eq!(refused.message, "nobody at 0x50");
    }
}

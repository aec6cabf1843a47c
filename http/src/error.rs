//! The gateway's one error vocabulary: an [`ErrorKind`] says what went wrong, and three small
//! functions of it give its HTTP status ([`http_status`]), its error code on the legacy byte
//! protocol ([`legacy_code`]) and what a change refused with it is in the audit trail
//! ([`audit_outcome`]). Every lower layer's error is given its kind here (but the named
//! leases', given beside them in `http/named_leases.rs`); no status is chosen anywhere else.

use hyper::StatusCode;
use station_protocol::{ErrorCode, StationError};

use crate::allow::Allowed;
use crate::audit::line::Outcome;
use crate::config_files::ConfigFileError;
use crate::credentials::AccessError;
use crate::events::EventsError;
use crate::lease::{LeaseError, LeaseStoreError};
use crate::link::LinkError;
use crate::numeric::NumericError;
use crate::station::{ChangeAnswer, ChangeReport, StillRunning};

/// What went wrong, as every front end tells it: the HTTP API by its status, the legacy port by
/// its error code, the audit trail by the outcome of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is wrong: a field (the message names it), a value, a body. 400.
    BadRequest,
    /// No credentials, or none that are valid, while access control is on. 401.
    Unauthorized,
    /// A role too low for the request, or a wrong admin token. 403.
    Forbidden,
    /// The access rules refuse this caller this action on a channel (the message names the
    /// channel and the rule, and the interlock's channel and value when that is why). 403.
    AccessDenied,
    /// No such endpoint, resource, lease, file or subscription. 404.
    NotFound,
    /// The path exists, with other methods. 405.
    MethodNotAllowed,
    /// The request's body did not arrive in time. 408.
    BodyTimeout,
    /// Someone else has it: the lease held by another, a semaphore with other slots. 409.
    Conflict,
    /// The request or its file is over a limit of size. 413.
    TooLarge,
    /// The station is locked by the lease's holder (or between leases), or the send guard
    /// refused a change at the link. 423.
    Locked,
    /// Too many event streams or subscriptions. 429.
    LimitReached,
    /// The gateway itself failed (its files, one of its tasks). 500.
    Internal,
    /// A documented endpoint this station does not offer; the message says why. 501.
    NotOffered,
    /// A documented group or path a station reached over the byte protocol cannot offer
    /// (files, firmware, system, media, calibration, ...); the message says why. 404, as a
    /// WebApi without the group answers (the clients ask Capabilities first and catch 404).
    AreaNotOffered,
    /// The station answered the request with an error of this code. Its status by the code:
    /// 404 no such channel or device, 400 a value or setting it refuses, 409 busy or locked,
    /// 502 its internal error or a frame it could not read, 504 a bus that timed out.
    StationRefused(ErrorCode),
    /// The station failed the gateway: an answer that makes no sense, a read a save needed
    /// that it refused. 502.
    StationFailed,
    /// A change was sent and its answer lost: it may or may not have been applied. 502.
    OutcomeUnknown,
    /// The station did not answer in time. 504.
    StationTimeout,
    /// The station is not reached (not yet, or the link is down). 503.
    StationNotReached,
    /// The station link's queue or the gateway's connections are full; try again shortly. 503.
    Overloaded,
    /// The safe state after a lease that ran out is not yet confirmed by the station. 503.
    SafeStatePending,
    /// A lease has ended and the gateway is still finishing it (its changes leaving the
    /// station). 503.
    LeaseEnding,
    /// The lease backend did not answer: the lease's state is unknown. 503.
    LeaseStoreUnavailable,
    /// The value history's archive did not answer a query for times memory no longer holds. 503.
    HistoryArchiveUnavailable,
    /// The gateway is shutting down. 503.
    ShuttingDown,
    /// This gateway is a standby: another gateway owns the station (the message says where it
    /// serves). 503.
    StandingBy,
}

/// The HTTP status of a kind.
pub fn http_status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden | ErrorKind::AccessDenied => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorKind::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Locked => StatusCode::LOCKED,
        ErrorKind::LimitReached => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::NotOffered => StatusCode::NOT_IMPLEMENTED,
        ErrorKind::AreaNotOffered => StatusCode::NOT_FOUND,
        ErrorKind::StationRefused(code) => match code {
            ErrorCode::UnknownChannel => StatusCode::NOT_FOUND,
            // Nothing on the bus acknowledged the address: the hardware's error, which the
            // clients document as the vendor's 500 ("the hardware manager encountered an
            // error"), not a 404 that says the channel does not exist. Not 502: that says a
            // change may or may not have been applied, and a NAKed transaction was not.
            ErrorCode::Nak => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal | ErrorCode::Malformed => StatusCode::BAD_GATEWAY,
            ErrorCode::ReadOnly
            | ErrorCode::BadValue
            | ErrorCode::Unsupported
            | ErrorCode::BadSettings => StatusCode::BAD_REQUEST,
            ErrorCode::Busy | ErrorCode::Locked => StatusCode::CONFLICT,
            ErrorCode::BusTimeout => StatusCode::GATEWAY_TIMEOUT,
        },
        ErrorKind::StationFailed | ErrorKind::OutcomeUnknown => StatusCode::BAD_GATEWAY,
        ErrorKind::StationTimeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorKind::StationNotReached
        | ErrorKind::Overloaded
        | ErrorKind::SafeStatePending
        | ErrorKind::LeaseEnding
        | ErrorKind::LeaseStoreUnavailable
        | ErrorKind::HistoryArchiveUnavailable
        | ErrorKind::ShuttingDown
        | ErrorKind::StandingBy => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The error code of a kind on the legacy byte protocol, which has the station's codes only:
/// the station's own code as it is, a lease refusal `Locked`, a full queue `Busy`, what the
/// gateway could not do `Internal`.
pub fn legacy_code(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::StationRefused(code) => code,
        ErrorKind::BadRequest | ErrorKind::TooLarge => ErrorCode::BadValue,
        ErrorKind::NotFound => ErrorCode::UnknownChannel,
        ErrorKind::MethodNotAllowed | ErrorKind::NotOffered | ErrorKind::AreaNotOffered => {
            ErrorCode::Unsupported
        }
        ErrorKind::BodyTimeout => ErrorCode::Malformed,
        ErrorKind::Unauthorized
        | ErrorKind::Forbidden
        | ErrorKind::AccessDenied
        | ErrorKind::Locked
        | ErrorKind::SafeStatePending
        | ErrorKind::LeaseEnding => ErrorCode::Locked,
        ErrorKind::Conflict | ErrorKind::LimitReached | ErrorKind::Overloaded => ErrorCode::Busy,
        ErrorKind::Internal
        | ErrorKind::StationFailed
        | ErrorKind::OutcomeUnknown
        | ErrorKind::StationTimeout
        | ErrorKind::StationNotReached
        | ErrorKind::LeaseStoreUnavailable
        | ErrorKind::HistoryArchiveUnavailable
        | ErrorKind::ShuttingDown
        | ErrorKind::StandingBy => ErrorCode::Internal,
    }
}

/// What a change that failed with this kind is in the audit trail: unknown where the station
/// did not give a readable answer to what was sent (its internal error, an unreadable frame,
/// a bus or an answer that timed out, an answer lost), else refused. (A list that failed
/// halfway is partial: that is the change's, not its error's.)
pub fn audit_outcome(kind: ErrorKind) -> Outcome {
    match kind {
        ErrorKind::OutcomeUnknown
        | ErrorKind::StationTimeout
        | ErrorKind::StationFailed
        | ErrorKind::StationRefused(
            ErrorCode::Internal | ErrorCode::Malformed | ErrorCode::BusTimeout,
        ) => Outcome::Unknown,
        _ => Outcome::Refused,
    }
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

/// The kind of a link error: the station's own answer by its code, the send guard's refusal
/// (whatever it says) locked.
pub fn link_kind(error: &LinkError) -> ErrorKind {
    match error {
        LinkError::Station(station) => ErrorKind::StationRefused(station.code),
        LinkError::Disconnected(_) => ErrorKind::StationNotReached,
        LinkError::Overloaded(_) => ErrorKind::Overloaded,
        LinkError::ShuttingDown => ErrorKind::ShuttingDown,
        LinkError::Timeout(_) | LinkError::WriteTimeout { .. } => ErrorKind::StationTimeout,
        LinkError::OutcomeUnknown(_) => ErrorKind::OutcomeUnknown,
        LinkError::Protocol(_) => ErrorKind::StationFailed,
        LinkError::Refused(
            crate::link::GuardRefusal::Forbidden(_) | crate::link::GuardRefusal::Interlock(_),
        ) => ErrorKind::AccessDenied,
        LinkError::Refused(_) => ErrorKind::Locked,
        LinkError::TooLarge(_) => ErrorKind::BadRequest,
    }
}

impl From<LinkError> for ApiError {
    fn from(error: LinkError) -> ApiError {
        match error {
            LinkError::Station(station) => ApiError::from(station),
            other => ApiError::new(link_kind(&other), other.to_string()),
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
            | EventsError::NoRange(_) => ErrorKind::BadRequest,
            EventsError::StationNotReached(_) => ErrorKind::StationNotReached,
            EventsError::ShuttingDown => ErrorKind::ShuttingDown,
        };
        ApiError::new(kind, error.to_string())
    }
}

impl From<LeaseError> for ApiError {
    fn from(error: LeaseError) -> ApiError {
        let kind = match &error {
            LeaseError::BadTtl(_) | LeaseError::BadWait(_) => ErrorKind::BadRequest,
            LeaseError::HeldByOther { .. } | LeaseError::LockDelay { .. } => ErrorKind::Conflict,
            LeaseError::LockedBy { .. }
            | LeaseError::LeaseEnded { .. }
            | LeaseError::NotCached { .. }
            | LeaseError::Ending { .. }
            | LeaseError::ChangeInLockDelay { .. } => ErrorKind::Locked,
            LeaseError::SafeStatePending { .. } => ErrorKind::SafeStatePending,
            LeaseError::NoSuchLease | LeaseError::NobodyHolds | LeaseError::AdminBreakOff => {
                ErrorKind::NotFound
            }
            LeaseError::AdminTokenWrong => ErrorKind::Forbidden,
            LeaseError::Store(_) => ErrorKind::LeaseStoreUnavailable,
        };
        ApiError {
            retry_after: error.retry_after(),
            ..ApiError::new(kind, error.to_string())
        }
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
        if let LeaseStoreError::CapacityConflict { .. } = error {
            return ApiError::conflict(error.to_string());
        }
        ApiError::lease_store_unavailable(format!(
            "{error}; the lease's state is unknown, try again"
        ))
    }
}

/// A configuration file's errors: a bad name or file is the client's (400, 413), an unknown
/// name 404 "not found", the station's and the link's as theirs, the gateway's directory 500.
impl From<ConfigFileError> for ApiError {
    fn from(error: ConfigFileError) -> ApiError {
        let kind = match &error {
            ConfigFileError::BadName(..) | ConfigFileError::BadFile(_) => ErrorKind::BadRequest,
            ConfigFileError::NotFound(_) => ErrorKind::NotFound,
            ConfigFileError::TooLarge { .. } => ErrorKind::TooLarge,
            ConfigFileError::NotReached(_) => ErrorKind::StationNotReached,
            ConfigFileError::ReadFailed(_) => ErrorKind::StationFailed,
            ConfigFileError::Station { error, .. } => link_kind(error),
            ConfigFileError::Stopped(stopped) => link_kind(&stopped.error),
            ConfigFileError::Io(_) => ErrorKind::Internal,
            ConfigFileError::StillRunning(_) => ErrorKind::StationTimeout,
        };
        ApiError::new(kind, error.to_string())
    }
}

/// An acquisition that could not be planned or run: the request's fault 400, an unknown
/// sampler 404, a sample rate no acquisition can use 502; the link's and a change still running
/// as everywhere else.
impl From<NumericError> for ApiError {
    fn from(error: NumericError) -> ApiError {
        match error {
            NumericError::Invalid(message) => ApiError::bad_request(message),
            NumericError::NoSuchSampler(message) => ApiError::not_found(message),
            NumericError::StationAnswer(message) => ApiError::station_failed(message),
            NumericError::Bug(message) => ApiError::internal(message),
            NumericError::Link(error) => ApiError::from(error),
            NumericError::StillRunning(error) => ApiError::from(error),
        }
    }
}

/// The caller stopped waiting for a change still running: 504, like a station that has not
/// answered yet (its outcome is in the audit trail once it has one).
impl From<StillRunning> for ApiError {
    fn from(error: StillRunning) -> ApiError {
        ApiError::station_timeout(error.to_string())
    }
}

/// The status of the answer to a change the station service reported: the link's failure's, or
/// the first item or step the station refused, else 200. The handlers' answers and the
/// change's audit line both follow it.
pub fn change_status(report: &ChangeReport) -> StatusCode {
    let kind = match &report.answer {
        Err(error) => Some(link_kind(error)),
        Ok(ChangeAnswer::Written(results)) => results
            .iter()
            .find_map(|result| result.as_ref().err())
            .map(|refused| ErrorKind::StationRefused(refused.code)),
        Ok(ChangeAnswer::Stepped(done)) => done.stopped.as_ref().map(|(_, error)| link_kind(error)),
        Ok(_) => None,
    };
    kind.map_or(StatusCode::OK, http_status)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::link::LinkDown;

    /// Every kind, the station's codes included.
    fn all_kinds() -> Vec<ErrorKind> {
        use ErrorKind::*;
        let mut kinds = vec![
            BadRequest,
            Unauthorized,
            Forbidden,
            AccessDenied,
            NotFound,
            MethodNotAllowed,
            BodyTimeout,
            Conflict,
            TooLarge,
            Locked,
            LimitReached,
            Internal,
            NotOffered,
            AreaNotOffered,
            StationFailed,
            OutcomeUnknown,
            StationTimeout,
            StationNotReached,
            Overloaded,
            SafeStatePending,
            LeaseEnding,
            LeaseStoreUnavailable,
            HistoryArchiveUnavailable,
            ShuttingDown,
            StandingBy,
        ];
        kinds.extend(
            (0..=u8::MAX)
                .filter_map(ErrorCode::from_u8)
                .map(StationRefused),
        );
        // No wildcard: a kind added to the enum stops this compiling until it is listed here
        // and above.
        for kind in &kinds {
            match kind {
                BadRequest
                | Unauthorized
                | Forbidden
                | AccessDenied
                | NotFound
                | MethodNotAllowed
                | BodyTimeout
                | Conflict
                | TooLarge
                | Locked
                | LimitReached
                | Internal
                | NotOffered
                | AreaNotOffered
                | StationRefused(_)
                | StationFailed
                | OutcomeUnknown
                | StationTimeout
                | StationNotReached
                | Overloaded
                | SafeStatePending
                | LeaseEnding
                | LeaseStoreUnavailable
                | HistoryArchiveUnavailable
                | ShuttingDown
                | StandingBy => {}
            }
        }
        kinds
    }

    /// Every kind with its HTTP status, legacy code and audit outcome: the whole vocabulary in
    /// one table, pinned (the statuses are the tests' and the reference clients').
    #[test]
    fn every_kind_has_its_status_legacy_code_and_audit_outcome() {
        use ErrorCode as C;
        use ErrorKind::*;
        use Outcome::{Refused, Unknown};
        let table: &[(ErrorKind, u16, ErrorCode, Outcome)] = &[
            (BadRequest, 400, C::BadValue, Refused),
            (Unauthorized, 401, C::Locked, Refused),
            (Forbidden, 403, C::Locked, Refused),
            (AccessDenied, 403, C::Locked, Refused),
            (NotFound, 404, C::UnknownChannel, Refused),
            (MethodNotAllowed, 405, C::Unsupported, Refused),
            (BodyTimeout, 408, C::Malformed, Refused),
            (Conflict, 409, C::Busy, Refused),
            (TooLarge, 413, C::BadValue, Refused),
            (Locked, 423, C::Locked, Refused),
            (LimitReached, 429, C::Busy, Refused),
            (Internal, 500, C::Internal, Refused),
            (NotOffered, 501, C::Unsupported, Refused),
            (AreaNotOffered, 404, C::Unsupported, Refused),
            (
                StationRefused(C::UnknownChannel),
                404,
                C::UnknownChannel,
                Refused,
            ),
            (StationRefused(C::ReadOnly), 400, C::ReadOnly, Refused),
            (StationRefused(C::BadValue), 400, C::BadValue, Refused),
            (StationRefused(C::Busy), 409, C::Busy, Refused),
            (StationRefused(C::Locked), 409, C::Locked, Refused),
            (StationRefused(C::Unsupported), 400, C::Unsupported, Refused),
            (StationRefused(C::Internal), 502, C::Internal, Unknown),
            (StationRefused(C::Malformed), 502, C::Malformed, Unknown),
            (StationRefused(C::Nak), 500, C::Nak, Refused),
            (StationRefused(C::BusTimeout), 504, C::BusTimeout, Unknown),
            (StationRefused(C::BadSettings), 400, C::BadSettings, Refused),
            (StationFailed, 502, C::Internal, Unknown),
            (OutcomeUnknown, 502, C::Internal, Unknown),
            (StationTimeout, 504, C::Internal, Unknown),
            (StationNotReached, 503, C::Internal, Refused),
            (Overloaded, 503, C::Busy, Refused),
            (SafeStatePending, 503, C::Locked, Refused),
            (LeaseEnding, 503, C::Locked, Refused),
            (LeaseStoreUnavailable, 503, C::Internal, Refused),
            (HistoryArchiveUnavailable, 503, C::Internal, Refused),
            (ShuttingDown, 503, C::Internal, Refused),
            (StandingBy, 503, C::Internal, Refused),
        ];
        let mut pinned: Vec<ErrorKind> = table.iter().map(|row| row.0).collect();
        let mut every = all_kinds();
        pinned.sort_by_key(|kind| format!("{kind:?}"));
        every.sort_by_key(|kind| format!("{kind:?}"));
        assert_eq!(pinned, every, "a kind without its row, or a row twice");
        for &(kind, status, code, outcome) in table {
            assert_eq!(http_status(kind).as_u16(), status, "{kind:?}");
            assert_eq!(legacy_code(kind), code, "{kind:?}");
            assert_eq!(audit_outcome(kind), outcome, "{kind:?}");
            assert_eq!(ApiError::new(kind, "x").status().as_u16(), status);
        }
    }

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
        for kind in all_kinds() {
            let status = http_status(kind);
            let unknown =
                status == StatusCode::BAD_GATEWAY || status == StatusCode::GATEWAY_TIMEOUT;
            let expected = if unknown {
                Outcome::Unknown
            } else {
                Outcome::Refused
            };
            assert_eq!(audit_outcome(kind), expected, "{kind:?}");
        }
    }

    /// A change that failed with a link error is audited (`station::ChangeOutcome`) unknown or
    /// refused by `LinkError::leaves_outcome_unknown`; the kind's outcome says the same.
    #[test]
    fn a_link_errors_change_outcome_and_its_kinds_audit_outcome_agree() {
        use ErrorCode as C;
        let mut errors = vec![
            LinkError::Disconnected(LinkDown::Connecting),
            LinkError::Timeout(Duration::from_secs(1)),
            LinkError::WriteTimeout {
                timeout: Duration::from_secs(1),
                max_processing: Duration::from_secs(4),
            },
            LinkError::Overloaded(9),
            LinkError::ShuttingDown,
            LinkError::OutcomeUnknown(crate::link::OutcomeCause::LinkDown(LinkDown::Connecting)),
        ];
        for code in [
            C::UnknownChannel,
            C::ReadOnly,
            C::BadValue,
            C::Unsupported,
            C::Busy,
            C::Locked,
            C::Internal,
            C::Malformed,
            C::Nak,
            C::BusTimeout,
            C::BadSettings,
        ] {
            errors.push(LinkError::Station(StationError::new(code, "x")));
        }
        for error in errors {
            let expected = if error.leaves_outcome_unknown() {
                Outcome::Unknown
            } else {
                Outcome::Refused
            };
            assert_eq!(audit_outcome(link_kind(&error)), expected, "{error:?}");
        }
    }

    /// The legacy port's codes for link errors, as `legacy.rs` has always answered them.
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

    #[test]
    fn link_errors_keep_their_kinds() {
        use ErrorCode as C;
        let cases = [
            (
                LinkError::Disconnected(LinkDown::Connecting),
                503,
                C::Internal,
            ),
            (LinkError::Timeout(Duration::from_secs(1)), 504, C::Internal),
            (
                LinkError::WriteTimeout {
                    timeout: Duration::from_secs(1),
                    max_processing: Duration::from_secs(4),
                },
                504,
                C::Internal,
            ),
            (LinkError::Overloaded(9), 503, C::Busy),
            (LinkError::ShuttingDown, 503, C::Internal),
            (
                LinkError::Station(StationError::new(C::ReadOnly, "no")),
                400,
                C::ReadOnly,
            ),
        ];
        for (error, status, code) in cases {
            let kind = link_kind(&error);
            assert_eq!(http_status(kind).as_u16(), status, "{error}");
            assert_eq!(legacy_code(kind), code, "{error}");
            assert_eq!(ApiError::from(error.clone()).kind, kind);
        }
        let refused = ApiError::from(StationError::new(C::Nak, "nobody at 0x50"));
        assert_eq!(refused.kind, ErrorKind::StationRefused(C::Nak));
        assert_eq!(refused.message, "nobody at 0x50");
    }
}

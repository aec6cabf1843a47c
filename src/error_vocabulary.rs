//! The whole vocabulary of errors in one table: every kind with its HTTP status, its legacy
//! code and its audit outcome, pinned here, in the one crate that sees every front end.

use station_core::audit::line::Outcome;
use station_core::error_kind::ErrorKind;
use station_http::error::{ApiError, http_status};
use station_legacy::codes::legacy_code;
use station_protocol::ErrorCode;

/// Every kind with its HTTP status, legacy code and audit outcome: the whole vocabulary in
/// one table, pinned (the statuses are the tests' and the reference clients'), here where
/// every front end's choice is in reach.
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
        (CrossSite, 403, C::Locked, Refused),
        (NotFound, 404, C::UnknownChannel, Refused),
        (MethodNotAllowed, 405, C::Unsupported, Refused),
        (BodyTimeout, 408, C::Malformed, Refused),
        (Conflict, 409, C::Busy, Refused),
        (TooLarge, 413, C::BadValue, Refused),
        (UnsupportedMediaType, 415, C::BadValue, Refused),
        (UnknownHost, 421, C::BadValue, Refused),
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
    let mut every = ErrorKind::every();
    pinned.sort_by_key(|kind| format!("{kind:?}"));
    every.sort_by_key(|kind| format!("{kind:?}"));
    assert_eq!(pinned, every, "a kind without its row, or a row twice");
    for &(kind, status, code, outcome) in table {
        assert_eq!(http_status(kind).as_u16(), status, "{kind:?}");
        assert_eq!(legacy_code(kind), code, "{kind:?}");
        assert_eq!(Outcome::of_error(kind), outcome, "{kind:?}");
        assert_eq!(ApiError::new(kind, "x").status().as_u16(), status);
    }
}

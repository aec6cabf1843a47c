//! The legacy byte protocol's error code for each [`ErrorKind`]: that protocol has the
//! station's codes only, so the station's own code goes as it is, a lease refusal `Locked`, a
//! full queue `Busy`, and what the gateway could not do `Internal`.

use station_core::error_kind::ErrorKind;
use station_protocol::ErrorCode;

/// The error code of a kind on the legacy byte protocol.
pub fn legacy_code(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::StationRefused(code) => code,
        ErrorKind::BadRequest
        | ErrorKind::TooLarge
        | ErrorKind::UnsupportedMediaType
        | ErrorKind::UnknownHost => ErrorCode::BadValue,
        ErrorKind::NotFound => ErrorCode::UnknownChannel,
        ErrorKind::MethodNotAllowed | ErrorKind::NotOffered | ErrorKind::AreaNotOffered => {
            ErrorCode::Unsupported
        }
        ErrorKind::BodyTimeout => ErrorCode::Malformed,
        ErrorKind::Unauthorized
        | ErrorKind::Forbidden
        | ErrorKind::AccessDenied
        | ErrorKind::CrossSite
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use station_core::link::{LinkDown, LinkError};
    use station_protocol::StationError;

    use super::*;

    /// The legacy port's codes for link errors, as the legacy listener has always answered them.
    #[test]
    fn link_errors_keep_their_legacy_codes() {
        use ErrorCode as C;
        let cases = [
            (LinkError::Disconnected(LinkDown::Connecting), C::Internal),
            (LinkError::Timeout(Duration::from_secs(1)), C::Internal),
            (
                LinkError::WriteTimeout {
                    timeout: Duration::from_secs(1),
                    max_processing: Duration::from_secs(4),
                },
                C::Internal,
            ),
            (LinkError::Overloaded(9), C::Busy),
            (LinkError::ShuttingDown, C::Internal),
            (
                LinkError::Station(StationError::new(C::ReadOnly, "no")),
                C::ReadOnly,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(legacy_code(error.kind()), code, "{error}");
        }
    }
}

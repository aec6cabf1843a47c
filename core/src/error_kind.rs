//! The gateway's one error vocabulary, below every layer: an [`ErrorKind`] says what went wrong,
//! and each layer gives its own errors their kind beside them (`LinkError::kind`,
//! `LeaseError::kind`, ...). A kind's HTTP status is [`ErrorKind::http_status`] (here, because a
//! change's audit line, written by the core's change task, carries the status its REST answer
//! has); the legacy byte protocol's code is in `station-legacy`'s `codes.rs`; what a change
//! refused with a kind is in the audit trail is `audit::Outcome::of_error`.
//! `station-gateway`'s `error_vocabulary.rs` pins all three.

use station_protocol::ErrorCode;

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
    /// A change sent by a web page of another site (its `Origin` is not the gateway's own nor
    /// one `http.allowed_origins` lists, or the browser says `Sec-Fetch-Site: cross-site`). 403.
    CrossSite,
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
    /// The request's body is not of the type its endpoint reads (JSON, or a multipart upload):
    /// the message names the type to send. 415.
    UnsupportedMediaType,
    /// The request names a host (`Host`, HTTP/2's `:authority`) the gateway is not known by:
    /// what a page on a name re-pointed at the gateway (DNS rebinding) sends. The message
    /// names `http.allowed_hosts`. 421.
    UnknownHost,
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
    /// WebApi without the group answers (the .NET client's `docs/error-handling.md`: 404 for
    /// what does not exist).
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

impl ErrorKind {
    /// The HTTP status a REST answer of this kind has, and the status of a change's audit line:
    /// the one table of statuses, beside the kinds (the legacy port's codes are in
    /// `station-legacy`'s `codes.rs`, a change's audit outcome in `audit::Outcome::of_error`).
    pub fn http_status(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::Unauthorized => 401,
            Self::Forbidden | Self::AccessDenied | Self::CrossSite => 403,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::BodyTimeout => 408,
            Self::Conflict => 409,
            Self::TooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::UnknownHost => 421,
            Self::Locked => 423,
            Self::LimitReached => 429,
            Self::Internal => 500,
            Self::NotOffered => 501,
            Self::AreaNotOffered => 404,
            Self::StationRefused(code) => match code {
                ErrorCode::UnknownChannel => 404,
                // Nothing on the bus acknowledged the address: the hardware's error, which the
                // .NET client's `docs/error-handling.md` documents as the vendor's 500 ("Hardware
                // manager encountered an error"), not a 404 that says the channel does not exist. Not 502: that says a
                // change may or may not have been applied, and a NAKed transaction was not.
                ErrorCode::Nak => 500,
                ErrorCode::Internal | ErrorCode::Malformed => 502,
                ErrorCode::ReadOnly
                | ErrorCode::BadValue
                | ErrorCode::Unsupported
                | ErrorCode::BadSettings => 400,
                ErrorCode::Busy | ErrorCode::Locked => 409,
                ErrorCode::BusTimeout => 504,
            },
            Self::StationFailed | Self::OutcomeUnknown => 502,
            Self::StationTimeout => 504,
            Self::StationNotReached
            | Self::Overloaded
            | Self::SafeStatePending
            | Self::LeaseEnding
            | Self::LeaseStoreUnavailable
            | Self::HistoryArchiveUnavailable
            | Self::ShuttingDown
            | Self::StandingBy => 503,
        }
    }

    /// Every kind, the station's codes included: the front ends' tables of their statuses and
    /// codes are checked against it, so a kind added here fails them until it has its row.
    pub fn every() -> Vec<ErrorKind> {
        use ErrorKind::*;
        let mut kinds = vec![
            BadRequest,
            Unauthorized,
            Forbidden,
            AccessDenied,
            CrossSite,
            NotFound,
            MethodNotAllowed,
            BodyTimeout,
            Conflict,
            TooLarge,
            UnsupportedMediaType,
            UnknownHost,
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
                | CrossSite
                | NotFound
                | MethodNotAllowed
                | BodyTimeout
                | Conflict
                | TooLarge
                | UnsupportedMediaType
                | UnknownHost
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

    /// True where the station did not give a readable answer to what was sent (its internal
    /// error, an unreadable frame, a bus or an answer that timed out, an answer lost): a change
    /// that failed so may or may not have been applied.
    pub fn leaves_outcome_unknown(self) -> bool {
        matches!(
            self,
            ErrorKind::OutcomeUnknown
                | ErrorKind::StationTimeout
                | ErrorKind::StationFailed
                | ErrorKind::StationRefused(
                    ErrorCode::Internal | ErrorCode::Malformed | ErrorCode::BusTimeout,
                )
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use station_protocol::{ErrorCode, StationError};

    use crate::audit::line::Outcome;
    use crate::link::{LinkDown, LinkError, OutcomeCause};

    /// A change that failed with a link error is audited (`station::ChangeOutcome`) unknown
    /// where it was sent and no readable answer came (a timeout, a lost answer, an unreadable
    /// one, the station's internal error, a frame it could not read, a bus that gave up), else
    /// refused; the error's own rule and its kind's audit outcome say the same.
    #[test]
    fn a_link_errors_change_outcome_is_unknown_only_where_no_readable_answer_came() {
        use ErrorCode as C;
        let mut cases = vec![
            (LinkError::Disconnected(LinkDown::Connecting), false),
            (LinkError::Timeout(Duration::from_secs(1)), true),
            (
                LinkError::WriteTimeout {
                    timeout: Duration::from_secs(1),
                    max_processing: Duration::from_secs(4),
                },
                true,
            ),
            (LinkError::Overloaded(9), false),
            (LinkError::ShuttingDown, false),
            (
                LinkError::OutcomeUnknown(OutcomeCause::LinkDown(LinkDown::Connecting)),
                true,
            ),
        ];
        for (code, unknown) in [
            (C::UnknownChannel, false),
            (C::ReadOnly, false),
            (C::BadValue, false),
            (C::Unsupported, false),
            (C::Busy, false),
            (C::Locked, false),
            (C::Internal, true),
            (C::Malformed, true),
            (C::Nak, false),
            (C::BusTimeout, true),
            (C::BadSettings, false),
        ] {
            cases.push((LinkError::Station(StationError::new(code, "x")), unknown));
        }
        for (error, unknown) in cases {
            assert_eq!(error.leaves_outcome_unknown(), unknown, "{error:?}");
            let expected = if unknown {
                Outcome::Unknown
            } else {
                Outcome::Refused
            };
            assert_eq!(Outcome::of_error(error.kind()), expected, "{error:?}");
        }
    }
}

//! The gateway's errors as a client sees them: one type, [`ApiError`], and the one place where
//! every lower layer's error is given its HTTP status (but `NamedLeaseError`'s, chosen beside
//! it in `http/named_leases.rs` so that this module depends on no HTTP handler).

use hyper::StatusCode;
use station_protocol::{ErrorCode, StationError};

use crate::config_files::ConfigFileError;
use crate::events::EventsError;
use crate::http::access::AccessError;
use crate::lease::{LeaseError, LeaseStoreError};
use crate::link::LinkError;

/// An error answer: a status and a message that says what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 501: a documented WebApi endpoint this gateway does not serve; the message says why.
    pub fn not_implemented(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_IMPLEMENTED, message)
    }

    pub fn no_such_resource(name: &str) -> ApiError {
        ApiError::not_found(format!("no such resource: {name}"))
    }
}

/// The HTTP status for a station error code.
pub fn station_status(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::UnknownChannel => StatusCode::NOT_FOUND,
        ErrorCode::ReadOnly | ErrorCode::BadValue | ErrorCode::Unsupported => {
            StatusCode::BAD_REQUEST
        }
        ErrorCode::Busy | ErrorCode::Locked => StatusCode::CONFLICT,
        ErrorCode::Internal | ErrorCode::Malformed => StatusCode::BAD_GATEWAY,
        // Nothing acknowledged the address: no such device there.
        ErrorCode::Nak => StatusCode::NOT_FOUND,
        ErrorCode::BusTimeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::BadSettings => StatusCode::BAD_REQUEST,
    }
}

impl From<StationError> for ApiError {
    fn from(error: StationError) -> ApiError {
        ApiError::new(station_status(error.code), error.message)
    }
}

impl From<LinkError> for ApiError {
    fn from(error: LinkError) -> ApiError {
        let status = match &error {
            LinkError::Station(station) => return ApiError::from(station.clone()),
            LinkError::Disconnected(_) | LinkError::Overloaded(_) | LinkError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            LinkError::Timeout(_) | LinkError::WriteTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            LinkError::OutcomeUnknown(_) | LinkError::Protocol(_) => StatusCode::BAD_GATEWAY,
            LinkError::Refused(_) => StatusCode::LOCKED,
            LinkError::TooLarge(_) => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, error.to_string())
    }
}

impl From<EventsError> for ApiError {
    fn from(error: EventsError) -> ApiError {
        let status = match &error {
            EventsError::TooManyStreams(_) | EventsError::TooManySubscriptions { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            EventsError::NoSuchStream(_) | EventsError::NoSuchSubscription(_) => {
                StatusCode::NOT_FOUND
            }
            EventsError::IntervalOutOfRange(_)
            | EventsError::NoChannels
            | EventsError::TooManyChannels { .. }
            | EventsError::UnknownChannel(_) => StatusCode::BAD_REQUEST,
            EventsError::StationNotReached(_) | EventsError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        ApiError::new(status, error.to_string())
    }
}

impl From<LeaseError> for ApiError {
    fn from(error: LeaseError) -> ApiError {
        let status = match &error {
            LeaseError::BadTtl(_) | LeaseError::BadWait(_) => StatusCode::BAD_REQUEST,
            LeaseError::HeldByOther { .. } => StatusCode::CONFLICT,
            LeaseError::LockedBy { .. }
            | LeaseError::LeaseEnded { .. }
            | LeaseError::NotCached { .. }
            | LeaseError::Ending { .. } => StatusCode::LOCKED,
            LeaseError::SafeStatePending { .. } => StatusCode::SERVICE_UNAVAILABLE,
            LeaseError::NoSuchLease | LeaseError::NobodyHolds | LeaseError::AdminBreakOff => {
                StatusCode::NOT_FOUND
            }
            LeaseError::AdminTokenWrong => StatusCode::FORBIDDEN,
            LeaseError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, error.to_string())
    }
}

impl From<AccessError> for ApiError {
    fn from(error: AccessError) -> ApiError {
        let status = match &error {
            AccessError::Unauthenticated { .. } => StatusCode::UNAUTHORIZED,
            AccessError::Forbidden { .. } => StatusCode::FORBIDDEN,
        };
        ApiError::new(status, error.to_string())
    }
}

/// A lease backend that could not answer (unreachable, locked, failed): 503, never "held". A
/// semaphore asked for with other slots than its holders': 409.
impl From<LeaseStoreError> for ApiError {
    fn from(error: LeaseStoreError) -> ApiError {
        if let LeaseStoreError::CapacityConflict { .. } = error {
            return ApiError::new(StatusCode::CONFLICT, error.to_string());
        }
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{error}; the lease's state is unknown, try again"),
        )
    }
}

/// A configuration file's errors: a bad name or file is the client's (400, 413), an unknown
/// name 404 "not found", the station's and the link's as theirs, the gateway's directory 500.
impl From<ConfigFileError> for ApiError {
    fn from(error: ConfigFileError) -> ApiError {
        let status = match &error {
            ConfigFileError::BadName(..) | ConfigFileError::BadFile(_) => StatusCode::BAD_REQUEST,
            ConfigFileError::NotFound(_) => StatusCode::NOT_FOUND,
            ConfigFileError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ConfigFileError::NotReached(_) => StatusCode::SERVICE_UNAVAILABLE,
            ConfigFileError::ReadFailed(_) => StatusCode::BAD_GATEWAY,
            ConfigFileError::Station { error, .. } => ApiError::from(error.clone()).status,
            ConfigFileError::Stopped(stopped) => ApiError::from(stopped.error.clone()).status,
            ConfigFileError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, error.to_string())
    }
}

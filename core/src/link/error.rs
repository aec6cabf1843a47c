//! The link's errors: [`LinkError`] for callers, and the typed reasons inside it — why the
//! link is down ([`LinkDown`]), what was wrong with a reply ([`ProtocolError`]), why the
//! handshake failed ([`HandshakeError`]). "The station said no" ([`LinkError::Station`]) is
//! kept apart from "the link broke" ([`LinkError::Disconnected`], [`LinkError::OutcomeUnknown`]).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use station_protocol::{FrameError, Opcode, PayloadError, StationError};

use super::guard::GuardRefusal;
use crate::error_kind::ErrorKind;

/// Why a request to the station did not get the station's answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LinkError {
    /// The link is down (or went down before the request was sent): nothing was done.
    #[error("station disconnected: {0}")]
    Disconnected(LinkDown),
    #[error("the station did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// A change the station did not answer in time: in doubt, for it may still carry it out.
    #[error(
        "the station did not answer the write within {} ms; it may or may not have been \
         applied, and the station may still apply it until it answers or {} ms after it was \
         sent (station.max_processing_ms): until then the gateway holds back what would follow \
         it (the end of the lease it was made under with its safe state, or the next lease \
         when it was made without one), and should it stay unanswered the next holder also \
         waits the lock-delay (lease.lock_delay_ms); read the channel to find out",
        .timeout.as_millis(),
        .max_processing.as_millis()
    )]
    WriteTimeout {
        timeout: Duration,
        max_processing: Duration,
    },
    /// A change was sent, then the link broke (or its answer was unreadable).
    #[error(
        "the link to the station dropped after the write was sent ({0}); it may or may not have been applied, and a station that did not see the connection close (a serial line) may still apply it: the gateway holds back what would follow it until station.max_processing_ms after it was sent; read the channel to find out"
    )]
    OutcomeUnknown(OutcomeCause),
    /// The station answered, and said no.
    #[error("{0}")]
    Station(StationError),
    /// Refused at the link before sending by the send guard, e.g. because the lease changed
    /// hands.
    #[error("{0}")]
    Refused(GuardRefusal),
    #[error("the station link has {0} requests waiting; try again shortly")]
    Overloaded(usize),
    #[error("the station sent an answer the gateway cannot read: {0}")]
    Protocol(ProtocolError),
    #[error("the request does not fit in one station frame: {0}")]
    TooLarge(Arc<FrameError>),
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

impl LinkError {
    /// Its kind: the station's own answer by its code, the send guard's refusal locked (an
    /// interlock's: access denied).
    pub fn kind(&self) -> ErrorKind {
        match self {
            LinkError::Station(station) => ErrorKind::StationRefused(station.code),
            LinkError::Disconnected(_) => ErrorKind::StationNotReached,
            LinkError::Overloaded(_) => ErrorKind::Overloaded,
            LinkError::ShuttingDown => ErrorKind::ShuttingDown,
            LinkError::Timeout(_) | LinkError::WriteTimeout { .. } => ErrorKind::StationTimeout,
            LinkError::OutcomeUnknown(_) => ErrorKind::OutcomeUnknown,
            LinkError::Protocol(_) => ErrorKind::StationFailed,
            LinkError::Refused(GuardRefusal::Forbidden(_) | GuardRefusal::Interlock(_)) => {
                ErrorKind::AccessDenied
            }
            LinkError::Refused(_) => ErrorKind::Locked,
            LinkError::TooLarge(_) => ErrorKind::BadRequest,
        }
    }

    /// True when a change that failed so may still have been carried out: it was sent, and its
    /// answer never came or could not be read, or the station failed inside or its bus gave up
    /// waiting for the device. False when the station said no, or nothing was sent: the rule of its
    /// kind ([`ErrorKind::leaves_outcome_unknown`]).
    pub fn leaves_outcome_unknown(&self) -> bool {
        self.kind().leaves_outcome_unknown()
    }
}

/// Why the link to the station is down, or why a session with it ended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LinkDown {
    /// Not connected yet.
    #[error("connecting")]
    Connecting,
    #[error(transparent)]
    Open(Arc<OpenError>),
    #[error("write to the station failed: {0}")]
    Write(Arc<io::Error>),
    #[error("read from the station failed: {0}")]
    Read(Arc<io::Error>),
    #[error("the station closed the connection")]
    Closed,
    #[error("the station stopped answering (no reply to PING within {} ms)", .0.as_millis())]
    PingTimeout(Duration),
    /// The gateway reset the link: a change the end of a lease waits for was still
    /// unanswered the longest the station may take over a request after it was sent.
    #[error(
        "the gateway reset the link: a change {} was still unanswered {} ms after it was sent \
         (station.max_processing_ms) and the lease's end waits for it",
        made_under(*.fence),
        .max_processing.as_millis()
    )]
    ChangeInDoubt {
        fence: u64,
        max_processing: Duration,
    },
    #[error(transparent)]
    Handshake(HandshakeError),
    #[error("cannot build a {opcode:?} frame: {source}")]
    Encode {
        opcode: Opcode,
        source: Arc<FrameError>,
    },
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// Self-fencing: the link-owner lease could not be renewed in time, so another gateway may
    /// own the station now; this one sends nothing until a renewal is confirmed.
    #[error(
        "this gateway cannot prove it still owns the station's link (its link-owner lease was not renewed in time; another gateway may own the station now), so it sends the station nothing"
    )]
    NotOwner,
    /// The station that answered HELLO may not be served by this gateway: why (another gateway
    /// owns it, however each is configured).
    #[error("{0}")]
    NotThisStation(String),
}

/// Why the byte stream to the station could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("no answer from {target} within {} ms", .timeout.as_millis())]
    ConnectTimeout { target: String, timeout: Duration },
    #[error("cannot connect to {target}: {source}")]
    Connect { target: String, source: io::Error },
    #[error("cannot open serial device {path}: {source}")]
    Serial {
        path: String,
        source: tokio_serial::Error,
    },
}

/// Why HELLO, SYSTEM or LIST at connection time did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandshakeError {
    #[error("the station closed the connection during the handshake")]
    Closed,
    #[error("the station did not answer {opcode:?} within {} ms", .timeout.as_millis())]
    Timeout { opcode: Opcode, timeout: Duration },
    #[error("the station's answer to {opcode:?} is unreadable: {source}")]
    Unreadable {
        opcode: Opcode,
        source: PayloadError,
    },
    #[error("the station refused {}: {}", label(*.opcode), .error.message)]
    Refused { opcode: Opcode, error: StationError },
    #[error("the station answered {} with {answered:?}", label(*.opcode))]
    Unexpected { opcode: Opcode, answered: Opcode },
    #[error("the station speaks protocol version {station}, the gateway {gateway}")]
    Version { station: u8, gateway: u8 },
}

/// What was wrong with a reply that came back with a known request id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The payload is not the message its opcode announces.
    #[error("its answer could not be read: {0}")]
    BadPayload(PayloadError),
    /// A reply of another kind than the request (or, for a READ, of another length).
    #[error("unexpected {answered:?} answer")]
    UnexpectedReply { asked: Opcode, answered: Opcode },
    #[error("a READ of {names} names was answered with {answered:?}")]
    ReadMismatch { names: usize, answered: Opcode },
    #[error("its sample frames do not make one acquisition: {0}")]
    Samples(station_protocol::sample::AssemblyError),
}

/// Why the outcome of a sent change is not known.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OutcomeCause {
    #[error(transparent)]
    LinkDown(LinkDown),
    #[error(transparent)]
    Reply(ProtocolError),
}

/// Which lease a change was made under, by its fence (0, the session's `FREE_FENCE`: none;
/// lease fences start at 1).
fn made_under(fence: u64) -> String {
    match fence {
        0 => "made while nobody held the lease".to_owned(),
        fence => format!("of lease {fence}"),
    }
}

/// HELLO, SYSTEM, LIST as the handshake's messages have always named them.
fn label(opcode: Opcode) -> &'static str {
    match opcode {
        Opcode::Hello => "HELLO",
        Opcode::System => "SYSTEM",
        Opcode::List => "LIST",
        _ => "the request",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients, the reference-client suite and operators' log searches know these words.
    #[test]
    fn the_messages_read_as_they_did_when_the_reasons_were_strings() {
        let closed = LinkError::Disconnected(LinkDown::Closed);
        assert_eq!(
            closed.to_string(),
            "station disconnected: the station closed the connection"
        );
        let ping = LinkDown::PingTimeout(Duration::from_millis(2000));
        assert_eq!(
            ping.to_string(),
            "the station stopped answering (no reply to PING within 2000 ms)"
        );
        let cut = LinkError::OutcomeUnknown(OutcomeCause::LinkDown(LinkDown::Closed));
        assert_eq!(
            cut.to_string(),
            "the link to the station dropped after the write was sent (the station closed the \
             connection); it may or may not have been applied, and a station that did not see \
             the connection close (a serial line) may still apply it: the gateway holds back \
             what would follow it until station.max_processing_ms after it was sent; read the \
             channel to find out"
        );
        let unreadable = LinkError::OutcomeUnknown(OutcomeCause::Reply(ProtocolError::BadPayload(
            PayloadError::Truncated("a status"),
        )));
        assert!(unreadable.to_string().contains(
            "(its answer could not be read: payload ends inside a status); it may or may not"
        ));
        let refused = OpenError::ConnectTimeout {
            target: "10.0.0.5:7000".into(),
            timeout: Duration::from_millis(1500),
        };
        assert_eq!(
            LinkError::Disconnected(LinkDown::Open(Arc::new(refused))).to_string(),
            "station disconnected: no answer from 10.0.0.5:7000 within 1500 ms"
        );
        assert_eq!(
            LinkError::Disconnected(LinkDown::Connecting).to_string(),
            "station disconnected: connecting"
        );
        let in_doubt = LinkError::WriteTimeout {
            timeout: Duration::from_millis(2000),
            max_processing: Duration::from_millis(8000),
        };
        assert_eq!(
            in_doubt.to_string(),
            "the station did not answer the write within 2000 ms; it may or may not have been \
             applied, and the station may still apply it until it answers or 8000 ms after it \
             was sent (station.max_processing_ms): until then the gateway holds back what would \
             follow it (the end of the lease it was made under with its safe state, or the next \
             lease when it was made without one), and should it stay unanswered the next holder \
             also waits the lock-delay (lease.lock_delay_ms); read the channel to find out"
        );
        let reset = LinkDown::ChangeInDoubt {
            fence: 7,
            max_processing: Duration::from_millis(8000),
        };
        assert_eq!(
            LinkError::Disconnected(reset).to_string(),
            "station disconnected: the gateway reset the link: a change of lease 7 was still \
             unanswered 8000 ms after it was sent (station.max_processing_ms) and the lease's \
             end waits for it"
        );
        let free = LinkDown::ChangeInDoubt {
            fence: 0,
            max_processing: Duration::from_millis(8000),
        };
        assert!(
            free.to_string()
                .contains("a change made while nobody held the lease was still unanswered"),
            "{free}"
        );
    }
}

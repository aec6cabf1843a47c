//! What handles ask of the link task: the [`Command`]s sent over its channel, who asked
//! ([`Caller`]) and where streamed answers go ([`PartSink`]).

use station_protocol::{ItemResult, Request, Response, Value};
use tokio::sync::{mpsc, oneshot};

use super::error::LinkError;
use super::guard::SendGuard;

/// What a caller asks of the link task.
pub(crate) enum Command {
    Read {
        names: Vec<String>,
        /// Who asks (a client connection), for telling a burst from one client's loop.
        caller: Option<Caller>,
        reply: oneshot::Sender<Result<Vec<ItemResult<Value>>, LinkError>>,
    },
    Change {
        request: Request,
        guard: Option<SendGuard>,
        reply: oneshot::Sender<Result<Response, LinkError>>,
    },
    /// Any other request, answered with the station's response as it came (legacy clients).
    Pass {
        request: Request,
        reply: oneshot::Sender<Result<Response, LinkError>>,
    },
    /// A request answered by several frames (SAMPLE), sent under `guard` like a change; every
    /// frame goes to `parts` as it comes.
    Stream {
        request: Request,
        guard: Option<SendGuard>,
        parts: PartSink,
    },
    /// Answered once no change admitted under `fence` may still be at the station.
    Settle {
        fence: u64,
        reply: oneshot::Sender<Settled>,
    },
}

/// The answer to a settle: nothing of the fence may still be at the station, and whether a
/// change of it left doubt unanswered on the way (it outlived `station.max_processing_ms`, or
/// the connection ended while it was at the station): a station that ignores SPEC.md §4 may
/// still carry it out, so the next holder waits the lock-delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settled {
    pub had_doubts: bool,
}

/// A client connection, by its peer address: who asked for a read.
pub type Caller = std::net::SocketAddr;

/// Where the frames of a streaming answer (SAMPLE) go, each as it comes.
pub type PartSink = mpsc::UnboundedSender<Result<Response, LinkError>>;

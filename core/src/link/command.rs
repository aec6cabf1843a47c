//! What handles ask of the link task: the [`Command`]s sent over its channel, who asked
//! ([`Caller`]) and where streamed answers go ([`PartSink`]).

use station_protocol::{ItemResult, Request, Response, Value};
use tokio::sync::{mpsc, oneshot};

use super::doubts::{Doubt, SettleScope};
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
    /// Answered once no change that `scope` covers may still be at the station.
    Settle {
        scope: SettleScope,
        reply: oneshot::Sender<Settled>,
    },
    /// Changes a gateway before this one left in doubt at the station: each stays in doubt
    /// until its instant, as one of this gateway's would.
    Inherit { doubts: Vec<Doubt> },
}

/// The answer to a settle: nothing the settle waited for may still be at the station by the
/// station's contract, and when the last of those changes left doubt unanswered (it outlived
/// `station.max_processing_ms` since it was sent, whatever became of the connection it was sent
/// on), if one did: a station that breaks its contract may still carry it out, so the next
/// holder waits the lock-delay, counted from then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settled {
    pub lapsed_at: Option<tokio::time::Instant>,
}

impl Settled {
    /// Whether a change the settle waited for left doubt unanswered.
    pub fn had_doubts(&self) -> bool {
        self.lapsed_at.is_some()
    }
}

/// A client connection, by its peer address: who asked for a read.
pub type Caller = std::net::SocketAddr;

/// Where the frames of a streaming answer (SAMPLE) go, each as it comes.
pub type PartSink = mpsc::UnboundedSender<Result<Response, LinkError>>;

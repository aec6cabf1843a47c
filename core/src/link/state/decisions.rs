//! What a connection decides about a change it is about to send and about a reply it got,
//! pure: which queued change goes out (its fence, what it answers for, the cached values it
//! makes stale) or whose caller is answered instead, and what a reply comes to (the values
//! for the cache, the restart flag, the channel configured, the LIST refresh's next step,
//! which caller gets what). The link's state machine carries these out; the judging of a
//! send guard and the channel table are passed in.

use station_protocol::{ConfigureReply, Request, Response, Value};

use super::super::command::PartSink;
use super::super::error::{LinkDown, LinkError, OutcomeCause, ProtocolError};
use super::super::guard::{GuardRefusal, SendGuard};
use super::super::handshake::{self, InquiryAnswer};
use super::super::read_queue::{ReadAnswer, ReadBatch};
use super::super::session::{FREE_FENCE, InFlightKind, ResponseReply};
use station_protocol::ChangeType;
use station_protocol::ChannelDescriptor;

/// A change or passed-through request waiting for room in the window.
pub(super) enum Queued {
    Change {
        request: Request,
        guard: Option<SendGuard>,
        reply: ResponseReply,
    },
    Pass {
        request: Request,
        reply: ResponseReply,
    },
    /// A request answered by several frames (SAMPLE), under its send guard like a change.
    Stream {
        request: Request,
        guard: Option<SendGuard>,
        parts: PartSink,
    },
}

/// Whoever waits for a queued request's answer.
#[derive(Debug)]
pub(crate) enum Waiting {
    Reply(ResponseReply),
    Parts(PartSink),
}

impl Waiting {
    pub(crate) fn answer(self, error: LinkError) {
        match self {
            Waiting::Reply(reply) => {
                let _ = reply.send(Err(error));
            }
            Waiting::Parts(parts) => {
                let _ = parts.send(Err(error));
            }
        }
    }
}

/// What becomes of a queued request when its turn to be sent comes.
pub(super) enum Taken {
    /// Its caller gave up (timed out) before it was sent: never send it now.
    Abandoned,
    /// Its send guard refuses it: not sent, its caller gets `why`.
    Refused { waiting: Waiting, why: LinkError },
    /// Send it, under `fence` (`None`: not a guarded request) and tracked as `kind`; the
    /// cached values of `stale` (the station's own channels it writes) are no longer the
    /// station's from now on.
    Send {
        request: Request,
        fence: Option<u64>,
        kind: InFlightKind,
        stale: Vec<String>,
    },
}

/// The decision on `queued` at the moment of sending: `judge` is its send guard's verdict now,
/// `known` says whether a name is one of the station's channels (only those get a cache slot:
/// names a legacy client makes up must not grow the cache).
pub(super) fn take(
    queued: Queued,
    judge: impl FnOnce(&SendGuard) -> Result<(), GuardRefusal>,
    known: impl Fn(&str) -> bool,
) -> Taken {
    let (request, guard, waiting) = match queued {
        Queued::Stream {
            request,
            guard,
            parts,
        } => (request, guard, Waiting::Parts(parts)),
        Queued::Change {
            request,
            guard,
            reply,
        } => (request, guard, Waiting::Reply(reply)),
        Queued::Pass { request, reply } => {
            if reply.is_closed() {
                return Taken::Abandoned;
            }
            let kind = InFlightKind::Pass { reply };
            return Taken::Send {
                request,
                fence: None,
                kind,
                stale: Vec::new(),
            };
        }
    };
    let gave_up = match &waiting {
        Waiting::Reply(reply) => reply.is_closed(),
        Waiting::Parts(parts) => parts.is_closed(),
    };
    if gave_up {
        return Taken::Abandoned;
    }
    if let Some(Err(why)) = guard.as_ref().map(judge) {
        return Taken::Refused {
            waiting,
            why: LinkError::Refused(why),
        };
    }
    let fence = guard.map(|guard| guard.fence().unwrap_or(FREE_FENCE));
    let kind = match waiting {
        Waiting::Parts(parts) => InFlightKind::Stream { parts },
        Waiting::Reply(reply) => {
            let answers_for = match &request {
                Request::Transact { name, .. } => vec![name.clone()],
                Request::Read { names } => names.clone(),
                _ => Vec::new(),
            };
            InFlightKind::Change { reply, answers_for }
        }
    };
    let stale = match &request {
        Request::Write { items } => items
            .iter()
            .map(|(name, _)| name)
            .filter(|name| known(name))
            .cloned()
            .collect(),
        Request::Transact { name, .. } if known(name) => vec![name.clone()],
        _ => Vec::new(),
    };
    Taken::Send {
        request,
        fence,
        kind,
        stale,
    }
}

/// What a READ's answer comes to for its readers.
pub(super) enum ReadOutcome {
    /// Answered: with values (each into the cache first), or refused as a whole.
    Answered(ReadAnswer),
    /// Answered with something that is no answer to a READ.
    Wrong(LinkError),
    /// Its answer could not be read: as if it were lost.
    Lost(LinkError),
}

/// What the answer to a request in flight comes to.
pub(super) enum ReplyPlan {
    /// A streaming request's last frame (or why it is unusable), to its sink.
    Part {
        parts: PartSink,
        answer: Result<Response, LinkError>,
    },
    /// A READ the link merged: to the read queue's readers.
    Read {
        batch: ReadBatch,
        outcome: ReadOutcome,
    },
    /// A change or passed-through request: the values its answer carries into the cache
    /// (`cache`), the station's restart noted (`restarted`: it answered a RESET), a channel's
    /// configuration taken into the table (`configured`), then `answer` to its caller.
    Answer {
        reply: ResponseReply,
        cache: Vec<(String, Value)>,
        restarted: bool,
        configured: Option<Box<ConfigureReply>>,
        answer: Result<Response, LinkError>,
    },
    /// The link's own PING: nothing to do.
    Nothing,
    /// A LIST refresh's configuration inquiry: its answer (`None`: unusable, with the warning).
    Inquiry {
        answer: Option<InquiryAnswer>,
        warning: Option<String>,
    },
    /// A LIST refresh's page, with the pages before it.
    Page {
        change: ChangeType,
        channels: Vec<ChannelDescriptor>,
        answer: Result<Response, ProtocolError>,
    },
}

/// The decision on the answer (after the reply check) to a request in flight as `kind`.
pub(super) fn plan_reply(kind: InFlightKind, answer: Result<Response, ProtocolError>) -> ReplyPlan {
    match (kind, answer) {
        (InFlightKind::Stream { parts }, answer) => ReplyPlan::Part {
            parts,
            answer: answer.map_err(LinkError::Protocol),
        },
        (InFlightKind::Read(batch), answer) => {
            let outcome = match answer {
                Ok(Response::Read(results)) => ReadOutcome::Answered(ReadAnswer::Values(results)),
                Ok(Response::Error(error)) => ReadOutcome::Answered(ReadAnswer::Refused(error)),
                // The reply check lets only READ and ERROR through for a READ.
                Ok(other) => ReadOutcome::Wrong(LinkError::Protocol(ProtocolError::ReadMismatch {
                    names: batch.names.len(),
                    answered: other.opcode(),
                })),
                Err(error @ ProtocolError::BadPayload(_)) => {
                    ReadOutcome::Lost(LinkError::Protocol(error))
                }
                Err(error) => ReadOutcome::Wrong(LinkError::Protocol(error)),
            };
            ReplyPlan::Read { batch, outcome }
        }
        (InFlightKind::Change { reply, answers_for }, Ok(response)) => {
            let cache = match &response {
                Response::Transact(value) => answers_for
                    .into_iter()
                    .map(|name| (name, value.clone()))
                    .collect(),
                Response::Read(results) => answers_for
                    .into_iter()
                    .zip(results)
                    .filter_map(|(name, result)| result.as_ref().ok().map(|v| (name, v.clone())))
                    .collect(),
                _ => Vec::new(),
            };
            ReplyPlan::Answer {
                reply,
                cache,
                restarted: matches!(response, Response::Reset),
                configured: configured(&response),
                answer: Ok(response),
            }
        }
        (InFlightKind::Change { reply, .. }, Err(error @ ProtocolError::BadPayload(_))) => {
            ReplyPlan::Answer {
                reply,
                cache: Vec::new(),
                restarted: false,
                configured: None,
                answer: Err(LinkError::OutcomeUnknown(OutcomeCause::Reply(error))),
            }
        }
        (InFlightKind::Change { reply, .. } | InFlightKind::Pass { reply }, Err(error)) => {
            ReplyPlan::Answer {
                reply,
                cache: Vec::new(),
                restarted: false,
                configured: None,
                answer: Err(LinkError::Protocol(error)),
            }
        }
        (InFlightKind::Pass { reply }, Ok(response)) => ReplyPlan::Answer {
            reply,
            cache: Vec::new(),
            restarted: false,
            configured: configured(&response),
            answer: Ok(response),
        },
        (InFlightKind::Ping, _) => ReplyPlan::Nothing,
        (InFlightKind::ConfigInquiry, answer) => {
            let (answer, warning) = match answer {
                Ok(response) => match handshake::inquiry_answer(response) {
                    Ok(answer) => (Some(answer), None),
                    Err(other) => (
                        None,
                        Some(format!(
                            "the station answered a configuration inquiry with {:?}",
                            other.opcode()
                        )),
                    ),
                },
                Err(error) => (
                    None,
                    Some(format!(
                        "the station's answer to a configuration inquiry is unusable ({error})"
                    )),
                ),
            };
            ReplyPlan::Inquiry { answer, warning }
        }
        (InFlightKind::ListPage { change, channels }, answer) => ReplyPlan::Page {
            change,
            channels,
            answer,
        },
    }
}

/// What a request whose time is up comes to.
pub(super) enum Expired {
    /// Its caller gets this error (a change's: in doubt, for up to the longest processing).
    Answer(Waiting, LinkError),
    /// A merged READ: its readers get this error.
    ReadLost(ReadBatch, LinkError),
    /// The link's own PING: the station no longer answers; the session ends.
    Ping,
    /// A LIST refresh's page or configuration inquiry: the refresh hears of it.
    ListPage,
    ConfigInquiry,
}

/// The decision on a request in flight as `kind` that went unanswered for `timeout` (the
/// station may take up to `max_processing` over a change).
pub(super) fn expired(
    kind: InFlightKind,
    timeout: std::time::Duration,
    max_processing: std::time::Duration,
) -> Expired {
    match kind {
        InFlightKind::Ping => Expired::Ping,
        InFlightKind::Read(batch) => Expired::ReadLost(batch, LinkError::Timeout(timeout)),
        InFlightKind::Change { reply, .. } => Expired::Answer(
            Waiting::Reply(reply),
            LinkError::WriteTimeout {
                timeout,
                max_processing,
            },
        ),
        InFlightKind::Pass { reply } => {
            Expired::Answer(Waiting::Reply(reply), LinkError::Timeout(timeout))
        }
        InFlightKind::Stream { parts } => {
            Expired::Answer(Waiting::Parts(parts), LinkError::Timeout(timeout))
        }
        InFlightKind::ListPage { .. } => Expired::ListPage,
        InFlightKind::ConfigInquiry => Expired::ConfigInquiry,
    }
}

/// Who hears what of a request in flight as `kind` when the session ends for `why`: a change
/// already sent has an unknown outcome; anything else was not done. `None`: nobody (the link's
/// own requests, and a READ, whose readers the read queue answers).
pub(super) fn cut_off(kind: InFlightKind, why: &LinkDown) -> Option<(Waiting, LinkError)> {
    let not_done = || LinkError::Disconnected(why.clone());
    match kind {
        InFlightKind::Change { reply, .. } => Some((
            Waiting::Reply(reply),
            LinkError::OutcomeUnknown(OutcomeCause::LinkDown(why.clone())),
        )),
        InFlightKind::Pass { reply } => Some((Waiting::Reply(reply), not_done())),
        InFlightKind::Stream { parts } => Some((Waiting::Parts(parts), not_done())),
        InFlightKind::Read(_)
        | InFlightKind::Ping
        | InFlightKind::ListPage { .. }
        | InFlightKind::ConfigInquiry => None,
    }
}

/// Whoever waits for the answer to a request in flight as `kind`; `None`: nobody (the link's
/// own requests, and a READ, whose readers the read queue answers).
pub(super) fn waiting(kind: InFlightKind) -> Option<Waiting> {
    match kind {
        InFlightKind::Change { reply, .. } | InFlightKind::Pass { reply } => {
            Some(Waiting::Reply(reply))
        }
        InFlightKind::Stream { parts } => Some(Waiting::Parts(parts)),
        InFlightKind::Read(_)
        | InFlightKind::Ping
        | InFlightKind::ListPage { .. }
        | InFlightKind::ConfigInquiry => None,
    }
}

/// Who hears what of a request still queued when the session ends for `why`: it was not done.
pub(super) fn never_sent(queued: Queued, why: &LinkDown) -> (Waiting, LinkError) {
    let waiting = match queued {
        Queued::Change { reply, .. } | Queued::Pass { reply, .. } => Waiting::Reply(reply),
        Queued::Stream { parts, .. } => Waiting::Parts(parts),
    };
    (waiting, LinkError::Disconnected(why.clone()))
}

/// The channel a CONFIGURE answer describes, for the table.
fn configured(response: &Response) -> Option<Box<ConfigureReply>> {
    match response {
        Response::Configure(reply) => Some(reply.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

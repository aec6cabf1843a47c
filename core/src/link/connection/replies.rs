//! The receiving side of a connection: every frame from the station handed to whoever waits
//! for it (after the reply check; what it comes to is `decisions::plan_reply`'s),
//! notifications, and requests whose time is up.

use std::sync::atomic::Ordering;

use station_protocol::{Notify, RawFrame, Request, Response};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Connection, Shared};
use crate::link::error::LinkDown;
use crate::link::handshake;
use crate::link::info::LinkEvent;
use crate::link::read_queue::ReadAnswer;
use crate::link::session::{InFlightKind, Lapse, Reply};

use super::ListStep;
use super::decisions::{self, Expired, ReadOutcome, ReplyPlan};

impl Connection {
    /// Hands a frame from the station to whoever waits for it, after the reply check.
    /// Frames it queues (the next LIST page) go out with the next dispatch's flush.
    pub fn on_frame(&mut self, shared: &Shared, frame: RawFrame) -> Result<(), LinkDown> {
        let response = Response::from_frame(&frame);
        if frame.request_id == 0 {
            match response {
                Ok(Response::Notify(notify)) => return self.on_notify(shared, notify),
                Ok(other) => debug!("ignoring {:?} with request id 0", other.opcode()),
                Err(error) => warn!("ignoring an unreadable notification: {error}"),
            }
            return Ok(());
        }
        let now = Instant::now();
        let (in_flight, answer) =
            match self
                .session
                .verify_reply_at(frame.request_id, response, now)
            {
                Reply::Part(parts, response) => {
                    // The caller may have given up; the station streams on until the end anyway.
                    let _ = parts.send(Ok(response));
                    return Ok(());
                }
                Reply::Answer(in_flight, response) => (in_flight, Ok(response)),
                Reply::Mismatch(in_flight, error) => (in_flight, Err(error)),
                Reply::Unknown => {
                    shared.stats.late_replies.fetch_add(1, Ordering::Relaxed);
                    debug!(
                        request_id = frame.request_id,
                        late_replies = self.session.late_replies(),
                        "dropping a late or unknown reply"
                    );
                    return Ok(());
                }
            };
        shared.stats.latency.observe(in_flight.sent_at.elapsed());
        let read_at = in_flight.sent_at.into_std();
        match decisions::plan_reply(in_flight.kind, answer) {
            ReplyPlan::Part { parts, answer } => {
                let _ = parts.send(answer);
            }
            ReplyPlan::Read { batch, outcome } => match outcome {
                ReadOutcome::Answered(answer) => {
                    if let ReadAnswer::Values(results) = &answer {
                        for (name, result) in batch.names.iter().zip(results) {
                            match result {
                                Ok(value) => shared.cache.insert(
                                    name,
                                    value.clone(),
                                    read_at,
                                    self.generation,
                                ),
                                Err(_) => shared.cache.read_failed(name, read_at),
                            }
                        }
                    }
                    self.reads.answered(batch, answer, now);
                }
                ReadOutcome::Wrong(error) => self.reads.answered_wrongly(batch, error, now),
                ReadOutcome::Lost(error) => self.reads.lost(batch, error),
            },
            ReplyPlan::Answer {
                reply,
                cache,
                restarted,
                configured,
                answer,
            } => {
                for (name, value) in cache {
                    shared.cache.insert(&name, value, read_at, self.generation);
                }
                if restarted {
                    shared.restarted.store(true, Ordering::SeqCst);
                }
                if let Some(configured) = &configured {
                    shared.publish_configured(configured);
                }
                let _ = reply.send(answer);
            }
            ReplyPlan::Nothing => {}
            ReplyPlan::Inquiry { answer, warning } => {
                if let Some(warning) = warning {
                    warn!("{warning}");
                }
                let step = self.list.on_inquiry(answer);
                self.carry_out_list(shared, step, now)?;
            }
            ReplyPlan::Page {
                change,
                channels,
                answer,
            } => {
                let step = self.list.on_page(change, channels, answer);
                self.carry_out_list(shared, Some(step), now)?;
            }
        }
        Ok(())
    }

    fn on_notify(&mut self, shared: &Shared, notify: Notify) -> Result<(), LinkDown> {
        info!("station notification: {notify:?}");
        if let Notify::ConfigurationChanged { change, .. } = &notify {
            let now = Instant::now();
            let starts = !self.list.is_running();
            match self.list.on_notify(*change) {
                Some(ListStep::AskPage { change, channels }) if starts => {
                    let kind = InFlightKind::ListPage { change, channels };
                    // Sent with the next flush; a failed send ends the session at that flush.
                    if self.send(handshake::list_page(0), kind, now).is_err() {
                        self.list.page_not_sent();
                    }
                }
                // A refresh running, made stale: it starts over now if it only waited for
                // inquiries with none in flight.
                step => self.carry_out_list(shared, step, now)?,
            }
        }
        let _ = shared.events.send(LinkEvent::Notify(notify));
        Ok(())
    }

    /// Answers requests whose time is up and checks, with a PING, that the station still
    /// answers at all; a PING that times out ends the session. A change in doubt that a
    /// lease's end waits for, still unanswered the longest the station may take, ends it too:
    /// the link is reset so that the change cannot land after the lease's end.
    pub fn on_timeouts(&mut self, shared: &Shared) -> Result<(), LinkDown> {
        self.count_codec_errors(shared);
        let timeout = self.request_timeout;
        let now = Instant::now();
        let settling = &self.settling;
        let waited_for = |fence: u64| settling.iter().any(|(scope, _)| scope.covers(fence));
        match self.session.lapse_doubts(now, waited_for) {
            Lapse::Reset { fence } => {
                warn!(
                    fence,
                    "a change in doubt is still unanswered {} ms after it was sent \
                     (station.max_processing_ms) and the end of its lease waits for it: \
                     resetting the link",
                    self.max_processing.as_millis()
                );
                return Err(LinkDown::ChangeInDoubt {
                    fence,
                    max_processing: self.max_processing,
                });
            }
            Lapse::Forgotten(fences) => {
                for fence in fences {
                    warn!(
                        fence,
                        "a change in doubt is still unanswered {} ms after it was sent \
                         (station.max_processing_ms): the station has carried it out or never \
                         will",
                        self.max_processing.as_millis()
                    );
                }
            }
        }
        let expired = self.session.expired(now);
        let expired_any = !expired.is_empty();
        let mut ping_timed_out = false;
        for in_flight in &expired {
            shared.stats.timeouts.fetch_add(1, Ordering::Relaxed);
            ping_timed_out |= matches!(in_flight.kind, InFlightKind::Ping);
        }
        for in_flight in expired {
            match decisions::expired(in_flight.kind, timeout, self.max_processing) {
                Expired::Ping => {}
                Expired::ReadLost(batch, error) => self.reads.lost(batch, error),
                Expired::Answer(waiting, error) => waiting.answer(error),
                Expired::ListPage => {
                    let step = self.list.on_page_timeout();
                    self.carry_out_list(shared, Some(step), now)?;
                }
                Expired::ConfigInquiry => {
                    warn!("the station did not answer a configuration inquiry in time");
                    let step = self.list.on_inquiry(None);
                    self.carry_out_list(shared, step, now)?;
                }
            }
        }
        if ping_timed_out {
            return Err(LinkDown::PingTimeout(timeout));
        }
        if !expired_any || self.session.ping_outstanding() {
            return Ok(());
        }
        let id = self.session.take_id();
        let ping = Request::Ping {
            nonce: u64::from(id),
        };
        self.send_with_id(id, ping, InFlightKind::Ping, Instant::now())
    }
}

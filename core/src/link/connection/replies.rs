//! The receiving side of a connection: every frame from the station handed to whoever waits
//! for it (after the reply check), notifications, and requests whose time is up.

use std::sync::atomic::Ordering;

use station_protocol::{Notify, RawFrame, Request, Response};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Connection, Shared};
use crate::link::error::{LinkDown, LinkError, OutcomeCause, ProtocolError};
use crate::link::handshake;
use crate::link::info::LinkEvent;
use crate::link::read_queue::ReadAnswer;
use crate::link::session::{InFlightKind, Lapse, Reply};

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
        match (in_flight.kind, answer) {
            (InFlightKind::Stream { parts }, answer) => {
                let _ = parts.send(answer.map_err(LinkError::Protocol));
            }
            (InFlightKind::Read(batch), Ok(Response::Read(results))) => {
                for (name, result) in batch.names.iter().zip(&results) {
                    match result {
                        Ok(value) => {
                            shared
                                .cache
                                .insert(name, value.clone(), read_at, self.generation)
                        }
                        Err(_) => shared.cache.read_failed(name, read_at),
                    }
                }
                self.reads.answered(batch, ReadAnswer::Values(results), now);
            }
            (InFlightKind::Read(batch), Ok(Response::Error(error))) => {
                self.reads.answered(batch, ReadAnswer::Refused(error), now);
            }
            (InFlightKind::Read(batch), Ok(other)) => {
                // The reply check lets only READ and ERROR through for a READ.
                let error = ProtocolError::ReadMismatch {
                    names: batch.names.len(),
                    answered: other.opcode(),
                };
                self.reads
                    .answered_wrongly(batch, LinkError::Protocol(error), now);
            }
            (InFlightKind::Read(batch), Err(error @ ProtocolError::BadPayload(_))) => {
                self.reads.lost(batch, LinkError::Protocol(error));
            }
            (InFlightKind::Read(batch), Err(error)) => {
                self.reads
                    .answered_wrongly(batch, LinkError::Protocol(error), now);
            }
            (InFlightKind::Change { reply, answers_for }, Ok(response)) => {
                match &response {
                    Response::Transact(value) => {
                        for name in &answers_for {
                            shared
                                .cache
                                .insert(name, value.clone(), read_at, self.generation);
                        }
                    }
                    Response::Read(results) => {
                        for (name, result) in answers_for.iter().zip(results) {
                            if let Ok(value) = result {
                                shared
                                    .cache
                                    .insert(name, value.clone(), read_at, self.generation);
                            }
                        }
                    }
                    _ => {}
                }
                if matches!(response, Response::Reset) {
                    shared.restarted.store(true, Ordering::SeqCst);
                }
                if let Response::Configure(configured) = &response {
                    shared.publish_configured(configured);
                }
                let _ = reply.send(Ok(response));
            }
            (InFlightKind::Change { reply, .. }, Err(error @ ProtocolError::BadPayload(_))) => {
                let _ = reply.send(Err(LinkError::OutcomeUnknown(OutcomeCause::Reply(error))));
            }
            (InFlightKind::Change { reply, .. } | InFlightKind::Pass { reply }, Err(error)) => {
                let _ = reply.send(Err(LinkError::Protocol(error)));
            }
            (InFlightKind::Pass { reply }, Ok(response)) => {
                if let Response::Configure(configured) = &response {
                    shared.publish_configured(configured);
                }
                let _ = reply.send(Ok(response));
            }
            (InFlightKind::Ping, _) => {}
            (InFlightKind::ConfigInquiry, answer) => {
                let answer = match answer {
                    Ok(response) => match handshake::inquiry_answer(response) {
                        Ok(answer) => Some(answer),
                        Err(other) => {
                            warn!(
                                "the station answered a configuration inquiry with {:?}",
                                other.opcode()
                            );
                            None
                        }
                    },
                    Err(error) => {
                        warn!(
                            "the station's answer to a configuration inquiry is unusable ({error})"
                        );
                        None
                    }
                };
                self.config_inquiry_answered(shared, answer, now)?;
            }
            (
                InFlightKind::ListPage {
                    change,
                    mut channels,
                },
                answer,
            ) => match answer {
                Ok(Response::List {
                    total,
                    channels: page,
                    ..
                }) => {
                    if self.list_refresh_stale {
                        self.list_refresh_stale = false;
                        let channels = Vec::new();
                        let request = handshake::list_page(0);
                        self.send(request, InFlightKind::ListPage { change, channels }, now)?;
                    } else if handshake::add_list_page(&mut channels, total, page) {
                        let request = handshake::list_page(channels.len());
                        self.send(request, InFlightKind::ListPage { change, channels }, now)?;
                    } else {
                        // Every channel's configuration before the new table is published.
                        self.start_config_refresh(change, channels);
                        self.send_config_inquiries(now)?;
                        // No channels, nothing to ask: it ends here (else as they are answered).
                        self.config_refresh_idle(shared, now)?;
                    }
                }
                Ok(other) => {
                    self.list_refresh_running = false;
                    self.list_refresh_stale = false;
                    warn!(
                        "the station answered LIST with {:?}; keeping the old channel list",
                        other.opcode()
                    );
                }
                Err(error) => {
                    self.list_refresh_running = false;
                    self.list_refresh_stale = false;
                    warn!(
                        "the station's answer to LIST is unusable ({error}); keeping the old channel list"
                    );
                }
            },
        }
        Ok(())
    }

    fn on_notify(&mut self, shared: &Shared, notify: Notify) -> Result<(), LinkDown> {
        info!("station notification: {notify:?}");
        if let Notify::ConfigurationChanged { .. } = &notify
            && self.list_refresh_running
        {
            self.list_refresh_stale = true;
            // Inquiries waiting for room with none in flight: it starts over now.
            self.config_refresh_idle(shared, Instant::now())?;
        }
        if let Notify::ConfigurationChanged { change, .. } = &notify
            && !self.list_refresh_running
        {
            let kind = InFlightKind::ListPage {
                change: *change,
                channels: Vec::new(),
            };
            // Sent with the next flush; a failed send ends the session at that flush.
            self.list_refresh_running = self
                .send(handshake::list_page(0), kind, Instant::now())
                .is_ok();
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
        let waited_for = |fence: u64| settling.iter().any(|(waits, _)| *waits == fence);
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
            match in_flight.kind {
                InFlightKind::Ping => {}
                InFlightKind::Read(batch) => self.reads.lost(batch, LinkError::Timeout(timeout)),
                InFlightKind::Change { reply, .. } => {
                    let _ = reply.send(Err(LinkError::WriteTimeout {
                        timeout,
                        max_processing: self.max_processing,
                    }));
                }
                InFlightKind::Pass { reply } => {
                    let _ = reply.send(Err(LinkError::Timeout(timeout)));
                }
                InFlightKind::Stream { parts } => {
                    let _ = parts.send(Err(LinkError::Timeout(timeout)));
                }
                InFlightKind::ListPage { .. } => {
                    self.list_refresh_running = false;
                    self.list_refresh_stale = false;
                    warn!("the station did not answer LIST in time; keeping the old channel list");
                }
                InFlightKind::ConfigInquiry => {
                    warn!("the station did not answer a configuration inquiry in time");
                    self.config_inquiry_answered(shared, None, now)?;
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

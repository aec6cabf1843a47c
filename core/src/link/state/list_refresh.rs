//! The LIST refresh a configuration NOTIFY starts, as a pure state machine: its pages, then
//! CONFIGURE's inquiry of every listed channel (a few at a time), then the new table; a NOTIFY
//! that comes meanwhile makes what it has stale, so it starts over instead of publishing
//! (SPEC.md §6.3). It decides; the link's state machine sends the pages and inquiries it
//! asks for and hands over what it publishes.

use std::collections::VecDeque;

use station_protocol::{ChangeType, ChannelDescriptor, ConfigureReply, Response};

use crate::link::error::ProtocolError;
use crate::link::handshake::{self, INQUIRIES_AT_ONCE, InquiryAnswer};

/// What the refresh asks of the connection next.
#[derive(Debug, PartialEq)]
pub(super) enum ListStep {
    /// Ask for the LIST page after `channels` (the pages so far; none: the first page), to be
    /// tracked with them.
    AskPage {
        change: ChangeType,
        channels: Vec<ChannelDescriptor>,
    },
    /// Every page is in: ask the channels' configurations ([`ListRefresh::next_inquiry`]),
    /// then look whether it is over ([`ListRefresh::idle`]).
    Inquire,
    /// Over: publish these channels with their configurations, then the `configuration` event.
    Publish {
        change: ChangeType,
        channels: Vec<ChannelDescriptor>,
        configs: Vec<ConfigureReply>,
    },
    /// Over without a new table (the station's answer was unusable): the old one stays.
    GiveUp(String),
}

/// The inquiries of a refresh whose pages are all in.
#[derive(Debug)]
struct Inquiries {
    change: ChangeType,
    channels: Vec<ChannelDescriptor>,
    to_ask: VecDeque<String>,
    in_flight: usize,
    configs: Vec<ConfigureReply>,
}

/// One connection's LIST refresh: whether one runs, whether a NOTIFY made it stale, and its
/// inquiries once the pages are in.
#[derive(Debug, Default)]
pub(super) struct ListRefresh {
    running: bool,
    /// A configuration NOTIFY came while it ran: its pages may be older than the change.
    stale: bool,
    inquiries: Option<Inquiries>,
}

impl ListRefresh {
    /// A configuration NOTIFY (`change`): a refresh starts, or the one running is stale (and
    /// starts over at once when it only waits for inquiries it cannot send).
    pub(super) fn on_notify(&mut self, change: ChangeType) -> Option<ListStep> {
        if self.running {
            self.stale = true;
            return self.idle();
        }
        self.running = true;
        Some(ListStep::AskPage {
            change,
            channels: Vec::new(),
        })
    }

    /// Whether a refresh runs (from its first page until it publishes or gives up).
    pub(super) fn is_running(&self) -> bool {
        self.running
    }

    /// The first page of a refresh [`ListRefresh::on_notify`] started could not be sent: none
    /// runs (the session ends at the next flush anyway).
    pub(super) fn page_not_sent(&mut self) {
        self.running = false;
    }

    /// A LIST page's answer (or why it is unusable), with the pages before it.
    pub(super) fn on_page(
        &mut self,
        change: ChangeType,
        mut channels: Vec<ChannelDescriptor>,
        answer: Result<Response, ProtocolError>,
    ) -> ListStep {
        match answer {
            Ok(Response::List {
                total,
                channels: page,
                ..
            }) => {
                if self.stale {
                    self.stale = false;
                    ListStep::AskPage {
                        change,
                        channels: Vec::new(),
                    }
                } else if handshake::add_list_page(&mut channels, total, page) {
                    ListStep::AskPage { change, channels }
                } else {
                    let to_ask = channels.iter().map(|ch| ch.name.clone()).collect();
                    self.inquiries = Some(Inquiries {
                        change,
                        channels,
                        to_ask,
                        in_flight: 0,
                        configs: Vec::new(),
                    });
                    ListStep::Inquire
                }
            }
            Ok(other) => self.give_up(format!(
                "the station answered LIST with {:?}; keeping the old channel list",
                other.opcode()
            )),
            Err(error) => self.give_up(format!(
                "the station's answer to LIST is unusable ({error}); keeping the old channel list"
            )),
        }
    }

    /// A LIST page went unanswered in time.
    pub(super) fn on_page_timeout(&mut self) -> ListStep {
        self.give_up(
            "the station did not answer LIST in time; keeping the old channel list".to_owned(),
        )
    }

    fn give_up(&mut self, why: String) -> ListStep {
        self.running = false;
        self.stale = false;
        ListStep::GiveUp(why)
    }

    /// The next channel to ask the configuration of, when the window `has_room`: none while
    /// [`INQUIRIES_AT_ONCE`] are in flight, none left, or the refresh is stale.
    pub(super) fn next_inquiry(&mut self, has_room: bool) -> Option<String> {
        let inquiries = self.inquiries.as_mut()?;
        if self.stale || inquiries.in_flight >= INQUIRIES_AT_ONCE || !has_room {
            return None;
        }
        let name = inquiries.to_ask.pop_front()?;
        inquiries.in_flight += 1;
        Some(name)
    }

    /// One inquiry answered (`Some`) or lost (`None`); what follows once it is the last.
    pub(super) fn on_inquiry(&mut self, answer: Option<InquiryAnswer>) -> Option<ListStep> {
        let inquiries = self.inquiries.as_mut()?;
        inquiries.in_flight = inquiries.in_flight.saturating_sub(1);
        match answer {
            Some(InquiryAnswer::Configured(reply)) => inquiries.configs.push(*reply),
            Some(InquiryAnswer::Unsupported) => inquiries.to_ask.clear(),
            Some(InquiryAnswer::NotConfigurable) | None => {}
        }
        self.idle()
    }

    /// Ends the inquiries once none is in flight and none is left to ask (or the refresh is
    /// stale): the table to publish, or the first page again.
    pub(super) fn idle(&mut self) -> Option<ListStep> {
        let done = self.inquiries.as_ref().is_some_and(|inquiries| {
            inquiries.in_flight == 0 && (inquiries.to_ask.is_empty() || self.stale)
        });
        if !done {
            return None;
        }
        let inquiries = self.inquiries.take()?;
        if self.stale {
            self.stale = false;
            return Some(ListStep::AskPage {
                change: inquiries.change,
                channels: Vec::new(),
            });
        }
        self.running = false;
        Some(ListStep::Publish {
            change: inquiries.change,
            channels: inquiries.channels,
            configs: inquiries.configs,
        })
    }
}

#[cfg(test)]
mod tests;

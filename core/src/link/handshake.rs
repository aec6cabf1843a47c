//! The handshake at connection time (HELLO, SYSTEM, every page of LIST, then CONFIGURE's
//! inquiry for every channel, a few at a time), and the paging of the LIST refresh a
//! configuration NOTIFY starts later.

use futures::{SinkExt, StreamExt};
use station_protocol::{
    ChannelDescriptor, Configure, ConfigureReply, ErrorCode, Hello, HelloReply, ModuleInfo, Opcode,
    PROTOCOL_VERSION, Request, Response, StationCodec,
};
use tokio_util::codec::Framed;

use super::error::{HandshakeError, LinkDown};
use super::owner_gate::OwnerGate;
use super::settings::LinkSettings;
use super::transport::{self, StationStream};
use std::sync::Arc;

/// The least a handshake waits for the lease backend's word on the station's identity.
const IDENTITY_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The station's identity as its HELLO gives it: model and serial (the same station under any
/// address, name, port or serial device).
pub fn station_identity(hello: &HelloReply) -> String {
    format!("{} {}", hello.station, hello.serial)
}

/// Names per LIST page asked of the station.
pub const LIST_PAGE: u16 = 128;

/// CONFIGURE inquiries asked at once (within the station's window), as configure lists and
/// saves ask them.
pub const INQUIRIES_AT_ONCE: usize = 8;

/// CONFIGURE without settings: how `name` is configured; changes nothing (SPEC.md §6.13).
pub fn config_inquiry(name: &str) -> Request {
    Request::Configure(Configure {
        name: name.to_owned(),
        settings: Vec::new(),
    })
}

/// What a station's answer to a configuration inquiry gives the channel table.
#[derive(Debug, PartialEq)]
pub enum InquiryAnswer {
    /// The channel's descriptor and configuration now.
    Configured(Box<ConfigureReply>),
    /// The station keeps no configuration of this channel (it refused the inquiry): the
    /// channel is listed without one.
    NotConfigurable,
    /// The station has no CONFIGURE at all (older firmware): ask no more.
    Unsupported,
}

/// How an answer to a configuration inquiry is taken; `Err` with what it answered when it is
/// no answer to CONFIGURE.
pub fn inquiry_answer(response: Response) -> Result<InquiryAnswer, Response> {
    match response {
        Response::Configure(reply) => Ok(InquiryAnswer::Configured(reply)),
        Response::Error(error) if error.code == ErrorCode::Unsupported => {
            Ok(InquiryAnswer::Unsupported)
        }
        Response::Error(_) => Ok(InquiryAnswer::NotConfigurable),
        other => Err(other),
    }
}

/// The framed byte stream to the station.
pub type Framing = Framed<Box<dyn StationStream>, StationCodec>;

/// A connection that has finished its handshake.
pub struct Connected {
    pub framed: Framing,
    pub hello: HelloReply,
    pub modules: Vec<ModuleInfo>,
    pub channels: Vec<ChannelDescriptor>,
    /// The configuration of every channel the station keeps one of (CONFIGURE's inquiry).
    pub configs: Vec<ConfigureReply>,
    /// The first request id the session may use: the handshake's were all below it, so a
    /// late answer to one of them (an inquiry that timed out) is dropped as late.
    pub next_id: u32,
}

/// The LIST request for the page starting at `offset`.
pub fn list_page(offset: usize) -> Request {
    Request::List {
        offset: u32::try_from(offset).unwrap_or(u32::MAX),
        limit: LIST_PAGE,
    }
}

/// Adds a LIST page to `channels`; whether another page is to be asked for.
pub fn add_list_page(
    channels: &mut Vec<ChannelDescriptor>,
    total: u32,
    page: Vec<ChannelDescriptor>,
) -> bool {
    let empty_page = page.is_empty();
    channels.extend(page);
    channels.len() < total as usize && !empty_page
}

/// Opens the stream and runs HELLO, SYSTEM and LIST (every page). With `owner` (a shared lease
/// backend), nothing follows HELLO until the link-owner task confirmed that this gateway may
/// serve the station that answered it (its own identity, not its address).
pub async fn connect(
    settings: &LinkSettings,
    owner: Option<&OwnerGate>,
    opener: Option<&transport::StationOpener>,
) -> Result<Connected, LinkDown> {
    let stream = transport::open_with(opener, &settings.url, settings.connect_timeout)
        .await
        .map_err(|error| LinkDown::Open(Arc::new(error)))?;
    let mut framed = Framed::new(stream, StationCodec::new());
    let mut next_id = 1u32;
    // Sends every request, then waits (a request timeout for all of them) until each has its
    // answer, matched by id: several inquiries share the station's window.
    let mut exchange_all = async |requests: Vec<Request>| -> Result<Vec<Response>, LinkDown> {
        let first_id = next_id;
        let opcode = requests.first().map_or(Opcode::Ping, Request::opcode);
        for request in &requests {
            let id = next_id;
            next_id += 1;
            let frame = request.to_frame(id).map_err(|source| LinkDown::Encode {
                opcode: request.opcode(),
                source: Arc::new(source),
            })?;
            framed
                .feed(frame)
                .await
                .map_err(|error| LinkDown::Write(Arc::new(error)))?;
        }
        SinkExt::<station_protocol::RawFrame>::flush(&mut framed)
            .await
            .map_err(|error| LinkDown::Write(Arc::new(error)))?;
        let mut answers: Vec<Option<Response>> = (0..requests.len()).map(|_| None).collect();
        let wait = async {
            while answers.iter().any(Option::is_none) {
                match framed.next().await {
                    Some(Ok(frame)) => {
                        let Some(slot) = frame
                            .request_id
                            .checked_sub(first_id)
                            .and_then(|at| answers.get_mut(at as usize))
                        else {
                            continue;
                        };
                        let asked = requests[(frame.request_id - first_id) as usize].opcode();
                        *slot = Some(Response::from_frame(&frame).map_err(|source| {
                            LinkDown::Handshake(HandshakeError::Unreadable {
                                opcode: asked,
                                source,
                            })
                        })?);
                    }
                    Some(Err(error)) => return Err(LinkDown::Read(Arc::new(error))),
                    None => return Err(LinkDown::Handshake(HandshakeError::Closed)),
                }
            }
            Ok(())
        };
        tokio::time::timeout(settings.request_timeout, wait)
            .await
            .map_err(|_| {
                LinkDown::Handshake(HandshakeError::Timeout {
                    opcode,
                    timeout: settings.request_timeout,
                })
            })??;
        Ok(answers.into_iter().flatten().collect())
    };
    let mut exchange = async |request: Request| -> Result<Response, LinkDown> {
        let mut answers = exchange_all(vec![request]).await?;
        answers
            .pop()
            .ok_or(LinkDown::Handshake(HandshakeError::Closed))
    };
    let refused = |opcode, response: Response| {
        LinkDown::Handshake(match response {
            Response::Error(error) => HandshakeError::Refused { opcode, error },
            other => HandshakeError::Unexpected {
                opcode,
                answered: other.opcode(),
            },
        })
    };
    let hello = match exchange(Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        client: settings.client_name.clone(),
    }))
    .await?
    {
        Response::Hello(hello) => hello,
        other => return Err(refused(Opcode::Hello, other)),
    };
    if hello.version != PROTOCOL_VERSION {
        return Err(LinkDown::Handshake(HandshakeError::Version {
            station: hello.version,
            gateway: PROTOCOL_VERSION,
        }));
    }
    if let Some(owner) = owner {
        let identity = station_identity(&hello);
        owner
            .verify_identity(&identity, settings.request_timeout.max(IDENTITY_LIMIT))
            .await
            .map_err(LinkDown::NotThisStation)?;
    }
    let modules = match exchange(Request::System).await? {
        Response::System(modules) => modules,
        other => return Err(refused(Opcode::System, other)),
    };
    let mut channels = Vec::new();
    loop {
        match exchange(list_page(channels.len())).await? {
            Response::List {
                total,
                channels: page,
                ..
            } => {
                if !add_list_page(&mut channels, total, page) {
                    break;
                }
            }
            other => return Err(refused(Opcode::List, other)),
        }
    }
    // Every channel's configuration from the start, as a station's own WebApi has it.
    let at_once = usize::from(hello.window).clamp(1, INQUIRIES_AT_ONCE);
    let mut configs = Vec::new();
    'inquiries: for batch in channels.chunks(at_once) {
        let asked = batch.iter().map(|ch| config_inquiry(&ch.name)).collect();
        let answers = match exchange_all(asked).await {
            Ok(answers) => answers,
            // Slow inquiries do not keep the link down: the channels are listed, the rest of
            // their configuration comes with the next refresh (or a configure).
            Err(LinkDown::Handshake(HandshakeError::Timeout { timeout, .. })) => {
                tracing::warn!(
                    "the station did not answer CONFIGURE's inquiry within {} ms; {} of {} channels have their configuration",
                    timeout.as_millis(),
                    configs.len(),
                    channels.len()
                );
                break 'inquiries;
            }
            Err(other) => return Err(other),
        };
        for response in answers {
            match inquiry_answer(response) {
                Ok(InquiryAnswer::Configured(reply)) => configs.push(*reply),
                Ok(InquiryAnswer::NotConfigurable) => {}
                Ok(InquiryAnswer::Unsupported) => break 'inquiries,
                Err(other) => return Err(refused(Opcode::Configure, other)),
            }
        }
    }
    Ok(Connected {
        framed,
        hello,
        modules,
        channels,
        configs,
        next_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use station_protocol::{ErrorCode, StationError};

    #[test]
    fn list_pages_are_asked_for_until_the_total_or_an_empty_page() {
        let mut channels = Vec::new();
        assert!(!add_list_page(&mut channels, 0, Vec::new()));
        assert!(
            !add_list_page(&mut channels, 5, Vec::new()),
            "an empty page ends it"
        );
    }

    #[test]
    fn handshake_errors_read_as_before() {
        let refused = HandshakeError::Refused {
            opcode: Opcode::Hello,
            error: StationError::new(ErrorCode::Busy, "too many clients"),
        };
        assert_eq!(
            refused.to_string(),
            "the station refused HELLO: too many clients"
        );
        let unexpected = HandshakeError::Unexpected {
            opcode: Opcode::List,
            answered: Opcode::ReadReply,
        };
        assert_eq!(
            unexpected.to_string(),
            "the station answered LIST with ReadReply"
        );
    }
}

//! A small sequential client of the station byte protocol, for `station-cli` and tests: one
//! request at a time, replies matched by request id, NOTIFYs kept aside.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use station_protocol::{
    ChannelDescriptor, Hello, HelloReply, ItemResult, ModuleInfo, Notify, PROTOCOL_VERSION,
    PayloadError, Request, Response, StationCodec, StationError, Value,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

/// Why a request got no answer it could use.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The station answered with an error.
    #[error("{0}")]
    Station(#[from] StationError),
    #[error("link error: {0}")]
    Io(#[from] std::io::Error),
    #[error("the station closed the connection")]
    Closed,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the request does not fit in one frame")]
    TooLarge,
    #[error("unreadable reply: {0}")]
    Payload(#[from] PayloadError),
    #[error("unexpected reply to {asked}: {got:?}")]
    Unexpected {
        asked: &'static str,
        got: Box<Response>,
    },
}

/// A client on any byte stream (TCP, a serial port, a pty).
pub struct StationClient<S> {
    framed: Framed<S, StationCodec>,
    next_request_id: u32,
    timeout: Duration,
    notifications: VecDeque<Notify>,
}

impl StationClient<TcpStream> {
    /// Connects over TCP.
    pub async fn connect(addr: SocketAddr) -> Result<StationClient<TcpStream>, ClientError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(StationClient::new(stream))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> StationClient<S> {
    pub fn new(stream: S) -> StationClient<S> {
        StationClient {
            framed: Framed::new(stream, StationCodec::new()),
            next_request_id: 1,
            timeout: Duration::from_secs(5),
            notifications: VecDeque::new(),
        }
    }

    /// How long one request may wait for its reply (5 s unless set).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The codec's counters: frames decoded, bytes and frames dropped.
    pub fn codec_stats(&self) -> station_protocol::CodecStats {
        self.framed.codec().stats()
    }

    /// NOTIFYs received so far, oldest first, removed from the client.
    pub fn take_notifications(&mut self) -> Vec<Notify> {
        self.notifications.drain(..).collect()
    }

    /// Waits up to `timeout` for a NOTIFY (returning one already received at once).
    pub async fn next_notification(&mut self, timeout: Duration) -> Result<Notify, ClientError> {
        if let Some(notify) = self.notifications.pop_front() {
            return Ok(notify);
        }
        let wait = async {
            loop {
                let frame = self.framed.next().await.ok_or(ClientError::Closed)??;
                if let Response::Notify(notify) = Response::from_frame(&frame)? {
                    return Ok(notify);
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// Sends one request and waits for its reply; an Error reply becomes `ClientError::Station`.
    pub async fn request(&mut self, request: Request) -> Result<Response, ClientError> {
        let request_id = self.next_request_id;
        self.next_request_id = self.next_request_id.wrapping_add(1).max(1);
        let frame = request
            .to_frame(request_id)
            .map_err(|_| ClientError::TooLarge)?;
        self.framed.send(frame).await?;
        let timeout = self.timeout;
        let wait = async {
            loop {
                let frame = self.framed.next().await.ok_or(ClientError::Closed)??;
                if frame.request_id == 0 {
                    if let Ok(Response::Notify(notify)) = Response::from_frame(&frame) {
                        self.notifications.push_back(notify);
                    }
                    continue;
                }
                if frame.request_id != request_id {
                    // A late reply to an earlier request that timed out.
                    continue;
                }
                return match Response::from_frame(&frame)? {
                    Response::Error(error) => Err(ClientError::Station(error)),
                    response => Ok(response),
                };
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    pub async fn hello(&mut self, client_name: &str) -> Result<HelloReply, ClientError> {
        let request = Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            client: client_name.to_owned(),
        });
        match self.request(request).await? {
            Response::Hello(reply) => Ok(reply),
            got => Err(unexpected("HELLO", got)),
        }
    }

    pub async fn system(&mut self) -> Result<Vec<ModuleInfo>, ClientError> {
        match self.request(Request::System).await? {
            Response::System(modules) => Ok(modules),
            got => Err(unexpected("SYSTEM", got)),
        }
    }

    /// One LIST page.
    pub async fn list_page(
        &mut self,
        offset: u32,
        limit: u16,
    ) -> Result<(u32, Vec<ChannelDescriptor>), ClientError> {
        match self.request(Request::List { offset, limit }).await? {
            Response::List {
                total, channels, ..
            } => Ok((total, channels)),
            got => Err(unexpected("LIST", got)),
        }
    }

    /// The whole channel list, page by page.
    pub async fn list_all(&mut self) -> Result<Vec<ChannelDescriptor>, ClientError> {
        let mut all = Vec::new();
        loop {
            let offset = u32::try_from(all.len()).unwrap_or(u32::MAX);
            let (total, page) = self.list_page(offset, 0).await?;
            let empty = page.is_empty();
            all.extend(page);
            if empty || all.len() >= total as usize {
                return Ok(all);
            }
        }
    }

    pub async fn read(&mut self, names: &[&str]) -> Result<Vec<ItemResult<Value>>, ClientError> {
        let names = names.iter().map(|n| (*n).to_owned()).collect();
        match self.request(Request::Read { names }).await? {
            Response::Read(results) => Ok(results),
            got => Err(unexpected("READ", got)),
        }
    }

    /// Reads one channel; a per-item error becomes `ClientError::Station`.
    pub async fn read_one(&mut self, name: &str) -> Result<Value, ClientError> {
        let results = self.read(&[name]).await?;
        match results.into_iter().next() {
            Some(result) => Ok(result?),
            None => Err(unexpected("READ", Response::Read(Vec::new()))),
        }
    }

    pub async fn write(
        &mut self,
        items: Vec<(String, Value)>,
    ) -> Result<Vec<ItemResult<()>>, ClientError> {
        match self.request(Request::Write { items }).await? {
            Response::Write(results) => Ok(results),
            got => Err(unexpected("WRITE", got)),
        }
    }

    /// Writes one channel; a per-item error becomes `ClientError::Station`.
    pub async fn write_one(&mut self, name: &str, value: Value) -> Result<(), ClientError> {
        let results = self.write(vec![(name.to_owned(), value)]).await?;
        match results.into_iter().next() {
            Some(result) => Ok(result?),
            None => Err(unexpected("WRITE", Response::Write(Vec::new()))),
        }
    }

    pub async fn transact(&mut self, name: &str, value: Value) -> Result<Value, ClientError> {
        let request = Request::Transact {
            name: name.to_owned(),
            value,
        };
        match self.request(request).await? {
            Response::Transact(value) => Ok(value),
            got => Err(unexpected("TRANSACT", got)),
        }
    }

    pub async fn ping(&mut self, nonce: u64) -> Result<(), ClientError> {
        match self.request(Request::Ping { nonce }).await? {
            Response::Ping { nonce: echoed } if echoed == nonce => Ok(()),
            got => Err(unexpected("PING", got)),
        }
    }
}

fn unexpected(asked: &'static str, got: Response) -> ClientError {
    ClientError::Unexpected {
        asked,
        got: Box::new(got),
    }
}

//! An event-stream reader on a plain socket, for the stream scenarios (5d, 5e): `GET
//! /api/events` read as it comes, its chunked body decoded and split into events by the reader
//! itself, so that a slow one holds no more than its receive buffer and its own few bytes.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Buf, BytesMut};
use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::http::HttpConnection;
use crate::scenarios::body;

/// The interval every reader's subscription asks for.
pub(crate) const INTERVAL_MS: u64 = 100;

/// One server-sent event as read.
#[derive(Debug, Clone)]
pub struct ReadEvent {
    pub id: Option<u64>,
    pub name: String,
    pub data: String,
}

/// `GET /api/events` on a socket of its own, read as it comes: the chunked body decoded and
/// split into events, comments (pings) skipped.
pub struct RawEvents {
    stream: TcpStream,
    /// Bytes read and not yet decoded.
    raw: BytesMut,
    /// The decoded body not yet split into events.
    body: BytesMut,
    /// The most bytes one read takes from the socket.
    read_size: usize,
    ended: bool,
}

impl RawEvents {
    /// Opens the stream (with `Last-Event-ID: resume` when given), reading `read_size` bytes at
    /// most at a time through a receive buffer of `receive_buffer` bytes when given.
    pub async fn open(
        addr: SocketAddr,
        receive_buffer: Option<u32>,
        read_size: usize,
        resume: Option<u64>,
    ) -> anyhow::Result<RawEvents> {
        let socket = TcpSocket::new_v4()?;
        if let Some(size) = receive_buffer {
            socket.set_recv_buffer_size(size)?;
        }
        let mut stream = socket
            .connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_nodelay(true)?;
        let resume = resume
            .map(|id| format!("Last-Event-ID: {id}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n{resume}\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut raw = BytesMut::with_capacity(read_size.max(1024));
        let head_end = loop {
            if let Some(at) = find(&raw, b"\r\n\r\n") {
                break at;
            }
            let mut chunk = vec![0u8; read_size.max(1024)];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                bail!("the gateway closed the connection before answering");
            }
            raw.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&raw[..head_end]).to_string();
        raw.advance(head_end + 4);
        if !head.starts_with("HTTP/1.1 200") {
            bail!("GET /api/events: {}", head.lines().next().unwrap_or(""));
        }
        if !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            bail!("the event stream is not chunked: {head}");
        }
        Ok(RawEvents {
            stream,
            raw,
            body: BytesMut::new(),
            read_size,
            ended: false,
        })
    }

    /// Moves every whole chunk of `raw` into `body`.
    fn decode(&mut self) {
        loop {
            let Some(line_end) = find(&self.raw, b"\r\n") else {
                return;
            };
            let size_text = String::from_utf8_lossy(&self.raw[..line_end]);
            let size_text = size_text.split(';').next().unwrap_or("").trim();
            let Ok(size) = usize::from_str_radix(size_text, 16) else {
                self.ended = true;
                return;
            };
            if size == 0 {
                self.ended = true;
                return;
            }
            if self.raw.len() < line_end + 2 + size + 2 {
                return;
            }
            self.raw.advance(line_end + 2);
            let chunk = self.raw.split_to(size);
            self.body.extend_from_slice(&chunk);
            self.raw.advance(2);
        }
    }

    /// The next event; `None` once the stream ended.
    pub async fn next(&mut self) -> anyhow::Result<Option<ReadEvent>> {
        loop {
            self.decode();
            if let Some(end) = find(&self.body, b"\n\n") {
                let block = self.body.split_to(end + 2);
                let text = String::from_utf8_lossy(&block);
                let (mut id, mut name, mut data) = (None, String::from("message"), String::new());
                for line in text.lines() {
                    if line.starts_with(':') {
                        continue;
                    }
                    let (key, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match key {
                        "id" => id = value.parse().ok(),
                        "event" => name = value.to_owned(),
                        "data" => data.push_str(value),
                        _ => {}
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Ok(Some(ReadEvent { id, name, data }));
            }
            if self.ended {
                return Ok(None);
            }
            let mut chunk = vec![0u8; self.read_size];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.raw.extend_from_slice(&chunk[..n]);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Subscribes stream `stream_id` to `channels` at 100 ms.
pub(crate) async fn subscribe(
    addr: SocketAddr,
    stream_id: &str,
    channels: &[&str],
) -> anyhow::Result<()> {
    let mut control = HttpConnection::open(addr).await?;
    let request = json!({ "StreamId": stream_id, "Channels": channels, "IntervalMs": INTERVAL_MS });
    control.post("/api/subscriptions", &body(request)).await?;
    Ok(())
}

/// A stream past its `hello`, subscribed to `channels`: the stream and its `streamId`.
pub(crate) async fn opened(
    addr: SocketAddr,
    channels: &[&str],
    receive_buffer: Option<u32>,
    read_size: usize,
) -> anyhow::Result<(RawEvents, String)> {
    let mut events = RawEvents::open(addr, receive_buffer, read_size, None).await?;
    let hello = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .context("no hello within 10 s")??
        .context("the stream ended before its hello")?;
    let data: Json = serde_json::from_str(&hello.data)?;
    let stream_id = data["streamId"]
        .as_str()
        .context("hello has no streamId")?
        .to_owned();
    subscribe(addr, &stream_id, channels).await?;
    Ok((events, stream_id))
}

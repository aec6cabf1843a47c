//! HTTP/1.1 on loopback: the load generator's lean keep-alive connection, a hyper client
//! connection for everything else (event streams, set-up), and the trivial hyper server used as
//! the HTTP ceiling of the machine.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A TCP connection to `addr` with Nagle's algorithm off, as every client here uses.
async fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// One keep-alive HTTP/1.1 connection; requests go one at a time.
pub struct HttpConnection {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl HttpConnection {
    pub async fn open(addr: SocketAddr) -> anyhow::Result<HttpConnection> {
        let stream = connect(addr).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake")?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(HttpConnection {
            sender,
            host: addr.to_string(),
        })
    }

    /// Sends a request and returns the response with its body still to read (event streams).
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Bytes>,
    ) -> anyhow::Result<Response<Incoming>> {
        self.sender.ready().await.context("connection closed")?;
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.host);
        if body.is_some() {
            builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = builder.body(Full::new(body.cloned().unwrap_or_default()))?;
        Ok(self.sender.send_request(request).await?)
    }

    /// Sends a request, reads the whole answer and fails unless it is 200.
    pub async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Bytes>,
    ) -> anyhow::Result<Bytes> {
        let response = self.send(method, path, body).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            bail!("{path}: HTTP {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(bytes)
    }

    pub async fn post(&mut self, path: &str, body: &Bytes) -> anyhow::Result<Bytes> {
        self.call(Method::POST, path, Some(body)).await
    }
}

/// The load generator's keep-alive HTTP/1.1 connection, driven in the caller's own task: the
/// request's bytes are built once and written as they are, and the answer is read as far as
/// its status line and `Content-Length`. hyper's client runs each connection in a task of its
/// own, so every request would cross two task hops (often two threads) inside the load
/// generator and be counted against the server; this one adds only its two system calls, as
/// the byte-protocol client of the direct baselines does.
pub struct LoadConnection {
    stream: TcpStream,
    buffer: BytesMut,
}

impl LoadConnection {
    pub async fn open(addr: SocketAddr) -> anyhow::Result<LoadConnection> {
        let stream = connect(addr).await?;
        Ok(LoadConnection {
            stream,
            buffer: BytesMut::with_capacity(4096),
        })
    }

    /// The bytes of `POST path` with a JSON `body`, as sent on every call.
    pub fn post_request(addr: SocketAddr, path: &str, body: &[u8]) -> Bytes {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        Bytes::from(request)
    }

    /// Sends `request` (from [`LoadConnection::post_request`]) and reads the whole answer;
    /// fails unless it is 200.
    pub async fn call(&mut self, request: &[u8]) -> anyhow::Result<Bytes> {
        self.send(request).await?;
        self.receive().await
    }

    /// Writes `request`; [`LoadConnection::receive`] reads its answer.
    pub async fn send(&mut self, request: &[u8]) -> anyhow::Result<()> {
        self.stream.write_all(request).await.context("send")
    }

    /// Reads the next whole answer; fails unless it is 200.
    pub async fn receive(&mut self) -> anyhow::Result<Bytes> {
        let head_len = loop {
            if let Some(end) = find(&self.buffer, b"\r\n\r\n") {
                break end + 4;
            }
            self.fill().await?;
        };
        let head = std::str::from_utf8(&self.buffer[..head_len]).context("answer head")?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .with_context(|| format!("no status in {head:?}"))?;
        let mut content_length = None;
        for line in head.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                bail!(
                    "the answer is {}; this client reads Content-Length bodies only",
                    value.trim()
                );
            }
        }
        let body_len = content_length.with_context(|| format!("no Content-Length in {head:?}"))?;
        while self.buffer.len() < head_len + body_len {
            self.fill().await?;
        }
        let mut answer = self.buffer.split_to(head_len + body_len);
        let body = answer.split_off(head_len).freeze();
        if status != 200 {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }

    async fn fill(&mut self) -> anyhow::Result<()> {
        if self
            .stream
            .read_buf(&mut self.buffer)
            .await
            .context("receive")?
            == 0
        {
            bail!("the server closed the connection");
        }
        Ok(())
    }
}

/// Where `needle` first starts in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A hyper server with no logic: every request gets `answer` as JSON, the body unread beyond
/// what hyper needs. Runs until `stop`.
pub async fn start_trivial_server(
    answer: Bytes,
    stop: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(_) => continue,
                },
            };
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let answer = answer.clone();
                    async move {
                        // Read the body as any real server must before answering.
                        let _ = request.into_body().collect().await;
                        let mut response = Response::new(Full::new(answer));
                        response.headers_mut().insert(
                            hyper::header::CONTENT_TYPE,
                            hyper::header::HeaderValue::from_static(
                                "application/json; charset=utf-8",
                            ),
                        );
                        Ok::<_, Infallible>(response)
                    }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = connection => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
    Ok(addr)
}

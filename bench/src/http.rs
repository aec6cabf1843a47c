//! HTTP/1.1 on loopback: a keep-alive hyper client connection, and the trivial hyper server
//! used as the HTTP ceiling of the machine.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// One keep-alive HTTP/1.1 connection; requests go one at a time.
pub struct HttpConnection {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl HttpConnection {
    pub async fn open(addr: SocketAddr) -> anyhow::Result<HttpConnection> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_nodelay(true)?;
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

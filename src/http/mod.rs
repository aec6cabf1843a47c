//! The HTTP side: the accept loop with graceful shutdown, and the answer helpers.
//!
//! Routing and the endpoints are in [`routes`]; request bodies in [`body`].

pub mod body;
pub mod lease;
pub mod named_leases;
pub mod routes;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::error::ApiError;
use crate::gateway::Gateway;

/// Every response body: a whole JSON document or a stream of events.
pub type Body = BoxBody<Bytes, Infallible>;

/// A JSON answer.
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

/// An error answer: `{"error": message, "status": code}`; the reference client shows `error`.
pub fn error_response(error: &ApiError) -> Response<Body> {
    json_response(
        error.status,
        &serde_json::json!({ "error": error.message, "status": error.status.as_u16() }),
    )
}

/// Serves HTTP on `listener` until `shutdown`, then lets in-flight requests finish for up to
/// `drain` before it returns.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
    drain: Duration,
) {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(
            gateway.config.http.header_read_timeout_ms,
        ))
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    debug!("accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        let service = hyper::service::service_fn(move |request| {
            let gateway = gateway.clone();
            async move { Ok::<_, Infallible>(routes::handle(gateway, request, peer).await) }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%peer, "connection ended: {error}");
            }
        });
    }
    drop(listener);
    info!("HTTP: no longer accepting; finishing requests in flight");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        info!(
            "HTTP: gave up waiting for connections after {} ms",
            drain.as_millis()
        );
    }
}

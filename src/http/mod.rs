//! The HTTP side: the accept loop with graceful shutdown.
//!
//! Every request enters at [`routes`]; the endpoint table and its handlers are in `api`;
//! answers are shaped in `reply`; request bodies in [`body`]; access control in [`access`];
//! health, metrics and the status page in [`ops`]; HTTPS in [`tls`].

pub mod access;
mod api;
pub mod body;
pub mod lease;
pub mod named_leases;
pub mod openapi;
pub mod ops;
mod reply;
pub mod routes;
pub mod tls;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

pub use api::LeaseNeed;
pub use reply::{Body, error_response, json_bytes_response, json_response};

use crate::gateway::Gateway;

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
    let connections = Arc::new(Semaphore::new(gateway.config.http.max_connections));
    loop {
        // At the limit, stop accepting: new clients wait in the listen backlog, costing the
        // gateway no descriptor, until a connection closes (idle ones by the header timeout).
        let permit = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_closed) => break,
            },
        };
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
        let service = {
            let gateway = gateway.clone();
            hyper::service::service_fn(move |request| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(routes::handle(gateway, request, peer).await) }
            })
        };
        let header_timeout = Duration::from_millis(gateway.config.http.header_read_timeout_ms);
        let Some(tls) = gateway.tls.clone() else {
            let (builder, watcher) = (builder.clone(), graceful.watcher());
            tokio::spawn(async move {
                // The auto builder reads the first bytes to tell HTTP/1 from HTTP/2 without a
                // timeout, and hyper's header timeout only starts after that: a client that
                // connects and sends nothing would hold its connection forever.
                let mut first = [0u8; 1];
                match tokio::time::timeout(header_timeout, stream.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    _ => {
                        debug!(%peer, "closed: nothing sent within the header timeout");
                        return;
                    }
                }
                let connection =
                    builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                if let Err(error) = watcher.watch(connection.into_owned()).await {
                    debug!(%peer, "connection ended: {error}");
                }
                drop(permit);
            });
            continue;
        };
        // The handshake runs in the connection's task, so a slow client never holds up accept.
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        let handshake_timeout = header_timeout;
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    debug!(%peer, "TLS handshake failed: {error}");
                    return;
                }
                Err(_) => {
                    debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                debug!(%peer, "connection ended: {error}");
            }
            drop(permit);
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

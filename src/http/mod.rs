//! The HTTP side: the accept loop with graceful shutdown.
//!
//! Every request enters at [`routes`]; the endpoint table and its handlers are in `api`;
//! answers are shaped in `reply`; request bodies in [`body`]; access control in [`access`];
//! health, metrics and the status page in [`ops`]; HTTPS in [`tls`]; connection limits and the
//! write timeout in [`connections`]; what of a path may be logged in [`redact`].

pub mod access;
mod api;
pub mod audit_trail;
pub mod body;
pub mod connections;
pub mod lease;
pub mod named_leases;
pub mod openapi;
pub mod ops;
pub mod redact;
mod reply;
pub mod routes;
pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue};
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use self::body::BodyTimeouts;
use self::connections::{
    ConnectionLimits, ConnectionSlot, FirstByteDeadline, Refusal, SlotKind, TimedIo,
    is_reserved_request,
};
use crate::error::ApiError;
pub use api::LeaseNeed;
pub use reply::{Body, error_response, json_bytes_response, json_response};

use crate::gateway::Gateway;

/// Serves HTTP on `listener` until `shutdown`, then lets in-flight requests finish for up to
/// `drain` before it returns.
///
/// Every stage of a request has a time limit: the first byte and the headers
/// (`http.header_read_timeout_ms`, also the idle time between keep-alive requests), the TLS
/// handshake (the same), the body ([`body::with_body_limits`]), and the answer's write
/// ([`TimedIo`]). Connections are limited in all, per address and with a reserve for
/// health checks and the lease ([`ConnectionLimits`]).
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
    drain: Duration,
) {
    let http = &gateway.config.http;
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(http.header_read_timeout_ms))
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let limits = ConnectionLimits::new(
        http.max_connections,
        http.reserved_connections,
        http.per_ip_limit(),
    );
    let room = Arc::new(Semaphore::new(limits.total()));
    loop {
        // With every connection taken (the reserve included), stop accepting: new clients
        // wait in the listen backlog, costing the gateway no descriptor, until a connection
        // closes (idle ones by the header timeout).
        let permit = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            permit = room.clone().acquire_owned() => match permit {
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
        let slot = match limits.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(refusal) => {
                if matches!(refusal, Refusal::PerIp(_)) {
                    gateway.metrics.http_connections_refused.per_ip.inc();
                }
                debug!(%peer, "connection closed at once: {refusal}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            gateway: gateway.clone(),
            peer,
            local: stream.local_addr().ok(),
            slot,
        };
        // The first byte, the handshake and the rest run in the connection's task, so a slow
        // client never holds up accept.
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            connection.serve(stream, builder, watcher).await;
            // The slot before the permit: the next accept finds the slot free.
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

/// One accepted connection: its client and its place in the limits.
struct Connection {
    gateway: Arc<Gateway>,
    peer: SocketAddr,
    /// The gateway's address the client reached (`api/modules/physical-system` reports it).
    local: Option<SocketAddr>,
    slot: ConnectionSlot,
}

impl Connection {
    /// Serves the connection, plain or TLS, until it ends, counting and logging the timeout
    /// that ended it if one did.
    async fn serve(self, stream: TcpStream, builder: AutoBuilder, watcher: Watcher) {
        let http = &self.gateway.config.http;
        let header_timeout = Duration::from_millis(http.header_read_timeout_ms);
        let peer = self.peer;
        let timed_out = |what: &str| {
            self.gateway.metrics.http_timeouts.headers.inc();
            info!(%peer, "HTTP: closed a connection: {what} within {}", body::readable(header_timeout));
        };
        let (io, activity) = TimedIo::new(stream, Duration::from_millis(http.write_timeout_ms));
        let ended = match self.gateway.tls.clone() {
            None => {
                // The auto builder reads the first bytes to tell HTTP/1 from HTTP/2 without a
                // timeout, and hyper's header timeout only starts after that: a client that
                // connects and sends nothing would hold its connection forever.
                let mut first = [0u8; 1];
                match tokio::time::timeout(header_timeout, io.get_ref().peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    Ok(_) => return,
                    Err(_) => return timed_out("nothing sent"),
                }
                self.serve_io(io, builder, watcher).await
            }
            Some(tls) => {
                let io = match tokio::time::timeout(header_timeout, tls.accept(io)).await {
                    Ok(Ok(io)) => io,
                    Ok(Err(error)) => {
                        debug!(%peer, "TLS handshake failed: {error}");
                        return;
                    }
                    Err(_) => return timed_out("no TLS handshake"),
                };
                // As for a plain connection's first byte: hyper's header timer only starts
                // once the auto builder has read the HTTP/1-or-2 preface.
                let io = FirstByteDeadline::new(io, header_timeout, activity.clone());
                self.serve_io(io, builder, watcher).await
            }
        };
        if activity.write_stalled() {
            self.gateway.metrics.http_timeouts.write.inc();
            info!(
                %peer,
                "HTTP: closed a connection whose client stopped reading: its answer made no progress for {}",
                body::readable(Duration::from_millis(http.write_timeout_ms))
            );
            return;
        }
        if activity.first_byte_late() {
            return timed_out("no request after the TLS handshake");
        }
        let Err(error) = ended else { return };
        let header_timeout_hit = error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout);
        if header_timeout_hit && activity.request_started() {
            timed_out("request headers not received");
        } else if header_timeout_hit {
            debug!(%peer, "closed an idle keep-alive connection");
        } else {
            debug!(%peer, "connection ended: {error}");
        }
    }

    /// Serves HTTP/1 or HTTP/2 on `io` until the connection ends.
    async fn serve_io<I>(
        &self,
        io: I,
        builder: AutoBuilder,
        watcher: Watcher,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = {
            let (gateway, peer, kind) = (self.gateway.clone(), self.peer, self.slot.kind);
            let local = self.local;
            hyper::service::service_fn(move |mut request: Request<Incoming>| {
                let gateway = gateway.clone();
                if let Some(local) = local {
                    request.extensions_mut().insert(routes::LocalAddr(local));
                }
                async move { Ok::<_, Infallible>(answer(gateway, request, peer, kind).await) }
            })
        };
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        watcher.watch(connection.into_owned()).await
    }
}

type AutoBuilder = hyper_util::server::conn::auto::Builder<TokioExecutor>;
type Watcher = hyper_util::server::graceful::Watcher;

/// Answers one request within the body time limits; on a reserved connection only what the
/// reserve is for. A timed-out body and a reserved connection end the connection after the
/// answer (HTTP/1: `Connection: close`).
async fn answer(
    gateway: Arc<Gateway>,
    request: Request<Incoming>,
    peer: SocketAddr,
    kind: SlotKind,
) -> Response<Body> {
    let http = &gateway.config.http;
    let http1 = request.version() < Version::HTTP_2;
    let reserved = kind == SlotKind::Reserved;
    if reserved && !is_reserved_request(&http.path_prefix, request.method(), request.uri().path()) {
        gateway.metrics.http_connections_refused.reserve_only.inc();
        let error = ApiError::overloaded(format!(
            "the gateway is at its connection limit ({} connections): only health checks and renewing or releasing a lease are served now; try again shortly",
            http.max_connections
        ));
        return closing(error_response(&error), http1);
    }
    let timeouts = BodyTimeouts {
        total: Duration::from_millis(http.body_timeout_ms),
        idle: Duration::from_millis(http.body_idle_timeout_ms),
    };
    let (method, uri) = (request.method().clone(), request.uri().clone());
    let (response, timed_out) =
        body::with_body_limits(timeouts, routes::handle(gateway.clone(), request, peer)).await;
    if let Some(timed_out) = timed_out {
        gateway.metrics.http_timeouts.body.inc();
        info!(
            %peer,
            method = %method,
            path = %redact::loggable_path(uri.path()),
            "HTTP: answered 408 and closing the connection: {}",
            timed_out.message()
        );
        return closing(response, http1);
    }
    if reserved {
        return closing(response, http1);
    }
    response
}

/// `response` with `Connection: close` (HTTP/1; HTTP/2 has no such header).
fn closing(mut response: Response<Body>, http1: bool) -> Response<Body> {
    if http1 {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

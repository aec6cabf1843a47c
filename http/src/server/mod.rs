//! The HTTP transport: [`serve`] takes connections until shutdown, gives each a task on the
//! thread the placer picks ([`threads`]), TLS ([`tls`]) when configured, and drains them;
//! every stage of a request has its time limit ([`connections`], [`idle`]). Its shape is
//! hyper-util's `server_graceful.rs`: `serve(listener, service, limits, shutdown)`, generic
//! over what answers a request ([`Answer`]); which station a request is for is not known
//! here (`lab::routing`).

pub mod connections;
pub(crate) mod gated;
pub mod idle;
pub mod peer_end;
pub mod threads;
pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info};

use crate::body::{self, BodyTimeouts};
use crate::config::HttpConfig;
use crate::metrics::ConnectionCounters;
use crate::reply::Body;
use connections::{
    ConnectionLimits, ConnectionSlot, FirstByteDeadline, IoActivity, Refusal, SlotKind, TimedIo,
};
use idle::{CloseWanted, ConnectionUse, CountedBody, IdleLimits};

/// What answers requests: [`serve`] asks it for every request, with what it knows of the
/// connection the request came on.
pub trait Answer: Send + Sync + 'static {
    /// Answers `request`, which came on `connection`; never fails (an error is an answer).
    fn answer(
        &self,
        request: Request<Incoming>,
        connection: &ConnectionInfo,
    ) -> impl Future<Output = Response<Body>> + Send;
}

/// What a request's answerer knows of its connection.
pub struct ConnectionInfo {
    pub peers: Peers,
    /// Whether the connection is busy, and how to close it once idle.
    pub usage: Arc<ConnectionUse>,
    /// An ordinary connection, or one from the reserve (at the connection limit).
    pub kind: SlotKind,
    /// The limits every connection keeps (its body's among them).
    pub limits: ServeLimits,
}

/// The two ends of the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct Peers {
    /// The client's address.
    pub remote: SocketAddr,
    /// The gateway's address the client reached (`api/modules/physical-system` reports it).
    pub local: Option<SocketAddr>,
    /// The connection's socket, for a request that waits to see whether its client went
    /// ([`peer_end`]).
    pub socket: Option<std::os::fd::RawFd>,
}

/// Where connections come from and how they are served: the listening socket, TLS, the
/// connection threads, and the counters of what happened to connections.
pub struct HttpListener {
    pub tcp: TcpListener,
    /// HTTPS, while `[http.tls]` names a certificate and key.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Where each connection runs (the least busy of the connection threads: [`threads`]).
    pub threads: threads::Placer,
    pub counters: ConnectionCounters,
}

/// Every limit the accept loop and its connections keep, read once from `[http]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections in all (`http.max_connections`), of them kept for health checks and the
    /// lease (`http.reserved_connections`), and from one address.
    pub max_connections: usize,
    pub reserved_connections: usize,
    pub per_ip: usize,
    /// The first byte and a request's head, and how long a connection that never had a
    /// request may stay (`http.header_read_timeout_ms`).
    pub header_read: Duration,
    /// How long a connection that had a request may stay with none in progress
    /// (`http.keep_alive_timeout_ms`).
    pub keep_alive: Duration,
    /// How long an answer's write may make no progress (`http.write_timeout_ms`).
    pub write: Duration,
    /// A request's body (`http.body_timeout_ms`, `http.body_idle_timeout_ms`).
    pub body: BodyTimeouts,
}

impl ServeLimits {
    /// The limits `[http]` sets.
    pub fn of(http: &HttpConfig) -> ServeLimits {
        ServeLimits {
            max_connections: http.max_connections,
            reserved_connections: http.reserved_connections,
            per_ip: http.per_ip_limit(),
            header_read: Duration::from_millis(http.header_read_timeout_ms),
            keep_alive: Duration::from_millis(http.keep_alive_timeout_ms),
            write: Duration::from_millis(http.write_timeout_ms),
            body: BodyTimeouts {
                total: Duration::from_millis(http.body_timeout_ms),
                idle: Duration::from_millis(http.body_idle_timeout_ms),
            },
        }
    }

    /// How long a connection may be idle: the header timeout for a head and before the first
    /// request, the keep-alive timeout between requests.
    fn idle(&self) -> IdleLimits {
        IdleLimits {
            head: self.header_read,
            keep_alive: self.keep_alive,
        }
    }
}

/// How serving ends: once `signal` is cancelled, no new connection is taken and requests in
/// flight get up to `drain` to finish.
#[derive(Debug, Clone)]
pub struct Shutdown {
    pub signal: CancellationToken,
    pub drain: Duration,
}

/// Serves HTTP on `listener` until `shutdown`, then lets in-flight requests finish for up to
/// its drain time before it returns.
///
/// Every stage of a request has a time limit: the first byte and the headers
/// (`http.header_read_timeout_ms`, also how long a connection that never had a request may
/// stay), the time between requests (`http.keep_alive_timeout_ms`: how long a connection,
/// HTTP/1 or HTTP/2, that had one may stay with none in progress: [`crate::idle`]), the TLS
/// handshake (the header timeout), the body ([`crate::body::with_body_limits`]), and the answer's
/// write ([`TimedIo`]). Connections are
/// limited in all, per address and with a reserve for health checks and the lease
/// ([`ConnectionLimits`]); at the limit the longest-idle connection makes room for a newcomer.
pub async fn serve<A: Answer>(
    listener: HttpListener,
    service: Arc<A>,
    limits: ServeLimits,
    shutdown: Shutdown,
) {
    let HttpListener {
        tcp: listener,
        tls,
        threads,
        counters,
    } = listener;
    let Shutdown {
        signal: shutdown,
        drain,
    } = shutdown;
    let builders = Arc::new(Builders::new(limits));
    let connections = TaskTracker::new();
    let slots = ConnectionLimits::new(
        limits.max_connections,
        limits.reserved_connections,
        limits.per_ip,
    );
    let room = Arc::new(Semaphore::new(slots.total()));
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
        // Every ordinary slot taken: an idle connection makes room, of the address holding the
        // most connections the one idle the longest (its slot is given back at once, its
        // descriptor as soon as its task sees it).
        if slots.make_room() {
            counters.evicted.inc();
        }
        // With every connection taken (the reserve included) and none idle, this one waits
        // and the next clients in the listen backlog, costing the gateway no descriptor,
        // until a connection closes.
        let permit = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            permit = room.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_closed) => break,
            },
        };
        let slot = match slots.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(refusal) => {
                if matches!(refusal, Refusal::PerIp(_)) {
                    counters.refused.per_ip.inc();
                }
                debug!(%peer, "connection closed at once: {refusal}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        crate::events::sse::limit_unsent(&stream);
        let connection = Connection {
            service: service.clone(),
            tls: tls.clone(),
            counters: counters.clone(),
            peer,
            local: stream.local_addr().ok(),
            socket: Some(std::os::fd::AsRawFd::as_raw_fd(&stream)),
            slot,
            shutdown: shutdown.clone(),
        };
        // The first byte, the handshake and the rest run in the connection's task, so a slow
        // client never holds up accept; the task runs on the least busy of the connection
        // threads ([`threads`]).
        let builders = builders.clone();
        threads.spawn(&connections, stream, move |stream| async move {
            connection.serve(stream, builders).await;
            // The slot before the permit: the next accept finds the slot free.
            drop(permit);
        });
    }
    drop(listener);
    info!("HTTP: no longer accepting; finishing requests in flight");
    connections.close();
    if tokio::time::timeout(drain, connections.wait())
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
struct Connection<A> {
    service: Arc<A>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    counters: ConnectionCounters,
    peer: SocketAddr,
    /// The gateway's address the client reached (`api/modules/physical-system` reports it).
    local: Option<SocketAddr>,
    /// Its socket, open for as long as the connection is served ([`peer_end`]).
    socket: Option<std::os::fd::RawFd>,
    slot: ConnectionSlot,
    /// The gateway's shutdown: the connection finishes what is in progress and closes.
    shutdown: CancellationToken,
}

impl<A: Answer> Connection<A> {
    /// Serves the connection, plain or TLS, until it ends, counting and logging the timeout
    /// that ended it if one did.
    async fn serve(self, stream: TcpStream, builders: Arc<Builders>) {
        let limits = builders.limits;
        let header_timeout = limits.header_read;
        let peer = self.peer;
        let counters = &self.counters;
        let timed_out = |what: &str| {
            counters.timeouts.headers.inc();
            info!(%peer, "HTTP: closed a connection: {what} within {}", body::readable(header_timeout));
        };
        let (io, activity) = TimedIo::new(stream, limits.write);
        let ended = match self.tls.clone() {
            None => {
                // The first bytes are awaited before hyper: a client that connects and sends
                // nothing is closed at the header timeout exactly, and counted as having
                // sent nothing. They also tell HTTP/1 from HTTP/2.
                let mut first = [0u8; HTTP2_PREFACE.len()];
                let speaks = match self
                    .before_hyper(io.get_ref().peek(&mut first), limits)
                    .await
                {
                    Ok(Ok(n)) if n > 0 => Speaks::from_first_bytes(&first[..n]),
                    Ok(_) | Err(None) => return,
                    Err(Some(_)) => return timed_out("nothing sent"),
                };
                self.serve_io(io, speaks, builders, &activity).await
            }
            Some(tls) => {
                // The handshake and the TLS connection boxed, as the auto builder's connection
                // is: a plain connection's task is sized to what it holds itself, 2.4 KB
                // against 9.2 KB with both inline (the fan-out's memory a stream).
                let io = match self.before_hyper(Box::pin(tls.accept(io)), limits).await {
                    Ok(Ok(io)) => io,
                    Ok(Err(error)) => {
                        debug!(%peer, "TLS handshake failed: {error}");
                        return;
                    }
                    Err(None) => return,
                    Err(Some(_)) => return timed_out("no TLS handshake"),
                };
                // As for a plain connection's first byte: nothing after the handshake is
                // closed at the header timeout exactly, and counted as such.
                let io = FirstByteDeadline::new(io, header_timeout, activity.clone());
                Box::pin(self.serve_io(io, Speaks::Either, builders, &activity)).await
            }
        };
        if activity.write_stalled() {
            counters.timeouts.write.inc();
            info!(
                %peer,
                "HTTP: closed a connection whose client stopped reading: its answer made no progress for {}",
                body::readable(limits.write)
            );
            return;
        }
        if activity.first_byte_late() {
            return timed_out("no request after the TLS handshake");
        }
        let (ended, closed_for) = ended;
        if closed_for == Some(CloseWanted::IdleTooLong) {
            let usage = &self.slot.usage;
            // Bytes came in after the last answer went out, and no request was handed over:
            // an HTTP/1 head cut short (an HTTP/2 client's bytes between requests are frames
            // such as a SETTINGS acknowledgement, not part of a request).
            if activity.request_started() && !usage.http2() {
                return timed_out("request headers not received");
            }
            if !usage.used() {
                return timed_out("no request sent");
            }
            debug!(%peer, "closed an idle keep-alive connection");
            return;
        }
        if let Err(error) = ended {
            debug!(%peer, "connection ended: {error}");
        }
    }

    /// Runs `step` (the first byte, the TLS handshake) until it is done; `Err(Some(_))` when
    /// the header timeout ran out first, `Err(None)` when the connection was evicted or the
    /// gateway is shutting down.
    async fn before_hyper<T>(
        &self,
        step: impl Future<Output = T>,
        limits: ServeLimits,
    ) -> Result<T, Option<CloseWanted>> {
        // No request yet: the header timeout.
        tokio::select! {
            done = step => Ok(done),
            why = self.slot.usage.close_wanted(limits.idle(), || false) => match why {
                CloseWanted::IdleTooLong => Err(Some(why)),
                CloseWanted::Evicted | CloseWanted::Done => Err(None),
            },
            _ = self.shutdown.cancelled() => Err(None),
        }
    }

    /// Serves HTTP/1 or HTTP/2 on `io` until the connection ends; `activity` is what its
    /// [`TimedIo`] saw.
    async fn serve_io<I>(
        &self,
        io: I,
        speaks: Speaks,
        builders: Arc<Builders>,
        activity: &IoActivity,
    ) -> ConnectionEnd
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let limits = builders.limits;
        let service = {
            // What every request on this connection needs, in one handle of the connection's
            // own: a request clones this, never the gateway's `Arc`, whose count every
            // connection on every worker thread shares (each clone and drop of a
            // shared count pulls its cache line from the other core).
            let served = Arc::new(Served {
                service: self.service.clone(),
                connection: ConnectionInfo {
                    peers: Peers {
                        remote: self.peer,
                        local: self.local,
                        socket: self.socket,
                    },
                    usage: self.slot.usage.clone(),
                    kind: self.slot.kind,
                    limits,
                },
            });
            hyper::service::service_fn(move |request: Request<Incoming>| {
                let usage = &served.connection.usage;
                let in_progress = usage.begin();
                if request.version() == Version::HTTP_2 {
                    usage.saw_http2();
                }
                let served = served.clone();
                async move {
                    // Boxed: hyper keeps a box sized for this future for as long as the
                    // connection lives, and `answer`'s future is about 0.7 KB (the request's
                    // own future boxed inside it), which every open event stream would
                    // otherwise hold after its answer went out.
                    let response =
                        Box::pin(served.service.answer(request, &served.connection)).await;
                    Ok::<_, Infallible>(response.map(|body| CountedBody::new(body, in_progress)))
                }
            })
        };
        let io = TokioIo::new(io);
        match speaks {
            Speaks::Http1 => {
                self.drive(
                    builders.http1.serve_connection(io, service),
                    activity,
                    limits.idle(),
                )
                .await
            }
            // Boxed: the auto builder's connection (HTTP/2's state with it) is about 3.5 KB,
            // and every connection's task would otherwise be sized to it.
            Speaks::Either => {
                Box::pin(self.drive(
                    builders.either.serve_connection(io, service),
                    activity,
                    limits.idle(),
                ))
                .await
            }
        }
    }

    /// Runs a connection until it ends: gracefully (HTTP/2: GOAWAY) once it has been idle too
    /// long ([`IdleLimits`]: a head that does not come whole, no request at all, or none for
    /// the keep-alive timeout), once a reserved one has answered, or when the gateway shuts
    /// down; at once when evicted with nothing in progress.
    async fn drive<C>(
        &self,
        connection: C,
        activity: &IoActivity,
        limits: IdleLimits,
    ) -> ConnectionEnd
    where
        C: GracefulConnection,
        C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let usage = &self.slot.usage;
        let header_timeout = limits.head;
        tokio::pin!(connection);
        // Once asked to close: how long the client gets to see the GOAWAY through (HTTP/2
        // waits for the answer to a PING) before the connection is dropped, as long as no
        // request is in progress (the gateway's shutdown has its own drain time).
        let grace = header_timeout.min(CLOSING_GRACE);
        let mut closing: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        let mut shutting_down = false;
        let mut closed_for = None;
        loop {
            tokio::select! {
                ended = connection.as_mut() => return (ended.map_err(Into::into), closed_for),
                // Gated: polled when the token or the deadline woke them, not on every wake of
                // the connection.
                _ = gated::Gated::new(self.shutdown.cancelled()), if !shutting_down && closing.is_none() => {
                    shutting_down = true;
                    connection.as_mut().graceful_shutdown();
                }
                why = gated::Gated::new(usage.close_wanted(limits, || activity.request_started())), if closing.is_none() && !shutting_down => {
                    if why == CloseWanted::Evicted && usage.in_progress() == 0 {
                        debug!(peer = %self.peer, "closed an idle connection to make room for a new one");
                        return (Ok(()), Some(why));
                    }
                    closed_for = Some(why);
                    if why == CloseWanted::IdleTooLong {
                        debug!(peer = %self.peer, "closing an idle connection");
                    }
                    connection.as_mut().graceful_shutdown();
                    closing = Some(Box::pin(tokio::time::sleep(grace)));
                }
                _ = async { closing.as_mut().expect("guarded").await }, if closing.is_some() => {
                    if usage.in_progress() > 0 {
                        // A request came in just before the GOAWAY: it is answered first.
                        closing = Some(Box::pin(tokio::time::sleep(grace)));
                        continue;
                    }
                    debug!(peer = %self.peer, "dropped a connection that did not close after its GOAWAY");
                    return (Ok(()), closed_for);
                }
            }
        }
    }
}

/// How a connection ended: hyper's result, and why the gateway closed it if it did.
type ConnectionEnd = (
    Result<(), Box<dyn std::error::Error + Send + Sync>>,
    Option<CloseWanted>,
);

/// What every HTTP/2 connection (prior knowledge) begins with.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Which protocol a connection may speak, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    /// Not the HTTP/2 preface: served by hyper's HTTP/1 connection alone, which starts with an
    /// empty 8 KB read buffer. (The auto builder hands hyper the bytes it read to tell the
    /// two apart, and hyper then reserves 16 KB for the connection's life; the second half is
    /// never written, so this saves heap, not resident memory, as measured.)
    Http1,
    /// The HTTP/2 preface so far, or a TLS connection: the auto builder tells them apart.
    Either,
}

impl Speaks {
    /// From the first bytes a client sent (at least one), before any is consumed.
    fn from_first_bytes(first: &[u8]) -> Speaks {
        if HTTP2_PREFACE.starts_with(first) {
            Speaks::Either
        } else {
            Speaks::Http1
        }
    }
}

/// What each request on one connection is served with, shared by its requests (and by no
/// other connection's).
struct Served<A> {
    service: Arc<A>,
    connection: ConnectionInfo,
}

/// The connection builders and the limits, made once and shared by every connection's task.
struct Builders {
    http1: hyper::server::conn::http1::Builder,
    either: hyper_util::server::conn::auto::Builder<TokioExecutor>,
    limits: ServeLimits,
}

impl Builders {
    fn new(limits: ServeLimits) -> Builders {
        // The header and keep-alive timeouts are the connection's idle deadline ([`idle`]: no
        // request in progress for `http.keep_alive_timeout_ms`, or the header timeout before
        // the first request and for a head begun), one timer per connection; hyper's own
        // header timeout would make a timer for every request.
        //
        // Half-closed: a client that shuts its side once its request is sent
        // (`shutdown(SHUT_WR)`) is still answered. Without it hyper takes the end of the
        // client's stream for the client gone, and drops the request while it is served, its
        // work perhaps done (a lease granted) and its answer never sent. A body cut
        // short by the end of the stream is still an incomplete body: refused, never acted on.
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .keep_alive(true)
            .half_close(true);
        let mut either = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        either
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .keep_alive(true)
            .half_close(true);
        Builders {
            http1,
            either,
            limits,
        }
    }
}

/// The longest an idle connection asked to close may take to finish closing.
const CLOSING_GRACE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::{HTTP2_PREFACE, Speaks};

    #[test]
    fn a_connection_is_http1_as_soon_as_its_first_bytes_leave_the_http2_preface() {
        assert_eq!(
            Speaks::from_first_bytes(b"GET /api/capabilities"),
            Speaks::Http1
        );
        assert_eq!(Speaks::from_first_bytes(b"G"), Speaks::Http1);
        // POST, PUT and PATCH begin like the preface: one byte is not enough to tell.
        assert_eq!(Speaks::from_first_bytes(b"P"), Speaks::Either);
        assert_eq!(Speaks::from_first_bytes(b"PUT /api"), Speaks::Http1);
        assert_eq!(Speaks::from_first_bytes(b"POST /api"), Speaks::Http1);
        assert_eq!(Speaks::from_first_bytes(b"PRI * HTTP/1.1"), Speaks::Http1);
        assert_eq!(Speaks::from_first_bytes(b"PRI * HT"), Speaks::Either);
        assert_eq!(Speaks::from_first_bytes(HTTP2_PREFACE), Speaks::Either);
    }
}

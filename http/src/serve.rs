//! The accept loop: [`serve`] takes connections until shutdown, gives each a task on the
//! thread the service's placer picks, and drains them; every stage of a request has its time
//! limit. Its shape is hyper-util's `server_graceful.rs`: `serve(listener, service, limits,
//! shutdown)`, the limits read once from `[http]` ([`ServeLimits::of`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue};
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info};

use crate::body::BodyTimeouts;
use crate::browser::{self, BrowserRules, RequestSite};
use crate::connections::{
    ConnectionLimits, ConnectionSlot, FirstByteDeadline, IoActivity, Refusal, SlotKind, TimedIo,
    is_reserved_request,
};
use crate::error::ApiError;
use crate::idle::{CloseWanted, ConnectionUse, CountedBody, IdleLimits};
use crate::reply::{Body, error_response};
use crate::{body, gated, routes, threads};

use crate::config::HttpConfig;
use crate::lab::{self, Stations};
use crate::stations::StationRoute;

/// What answers the requests (each station's [`crate::gateway::Gateway`], through
/// `routes::handle`, and the lab's own paths), and where each connection runs (the least busy
/// of the connection threads: [`threads`]).
pub struct HttpService {
    pub stations: Arc<Stations>,
    pub threads: threads::Placer,
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
pub async fn serve(
    listener: TcpListener,
    service: HttpService,
    limits: ServeLimits,
    shutdown: Shutdown,
) {
    let HttpService { stations, threads } = service;
    // The connection counters are the whole gateway's: kept in the first station's metrics.
    let gateway = stations.host().clone();
    let browser = Arc::new(BrowserRules::new(
        &gateway.config.http,
        gateway.tls.is_some(),
    ));
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
            gateway.metrics.http_connections_evicted.inc();
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
                    gateway.metrics.http_connections_refused.per_ip.inc();
                }
                debug!(%peer, "connection closed at once: {refusal}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        crate::events::sse::limit_unsent(&stream);
        let connection = Connection {
            stations: stations.clone(),
            browser: browser.clone(),
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
struct Connection {
    stations: Arc<Stations>,
    browser: Arc<BrowserRules>,
    peer: SocketAddr,
    /// The gateway's address the client reached (`api/modules/physical-system` reports it).
    local: Option<SocketAddr>,
    /// Its socket, open for as long as the connection is served ([`peer_end`]).
    socket: Option<std::os::fd::RawFd>,
    slot: ConnectionSlot,
    /// The gateway's shutdown: the connection finishes what is in progress and closes.
    shutdown: CancellationToken,
}

impl Connection {
    /// Serves the connection, plain or TLS, until it ends, counting and logging the timeout
    /// that ended it if one did.
    async fn serve(self, stream: TcpStream, builders: Arc<Builders>) {
        let limits = builders.limits;
        let header_timeout = limits.header_read;
        let peer = self.peer;
        let host = self.stations.host();
        let timed_out = |what: &str| {
            host.metrics.http_timeouts.headers.inc();
            info!(%peer, "HTTP: closed a connection: {what} within {}", body::readable(header_timeout));
        };
        let (io, activity) = TimedIo::new(stream, limits.write);
        let ended = match host.tls.clone() {
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
            host.metrics.http_timeouts.write.inc();
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
                stations: self.stations.clone(),
                browser: self.browser.clone(),
                builders: builders.clone(),
                usage: self.slot.usage.clone(),
                peers: routes::Peers {
                    remote: self.peer,
                    local: self.local,
                    socket: self.socket,
                },
                kind: self.slot.kind,
            });
            hyper::service::service_fn(move |request: Request<Incoming>| {
                let in_progress = served.usage.begin();
                if request.version() == Version::HTTP_2 {
                    served.usage.saw_http2();
                }
                let served = served.clone();
                async move {
                    // Boxed: hyper keeps a box sized for this future for as long as the
                    // connection lives, and `answer`'s future is about 0.7 KB (the request's
                    // own future boxed inside it), which every open event stream would
                    // otherwise hold after its answer went out.
                    let response = Box::pin(answer(&served, request)).await;
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
struct Served {
    stations: Arc<Stations>,
    /// What a browser may ask: the host names, the sites, CORS (`[http]`).
    browser: Arc<BrowserRules>,
    /// The connection builders and the limits, shared by every connection.
    builders: Arc<Builders>,
    usage: Arc<ConnectionUse>,
    peers: routes::Peers,
    kind: SlotKind,
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

/// Answers one request: first what its browser may ask (a host name the gateway is not known
/// by is 421, on every path, before routing; a CORS preflight is answered here), then
/// [`answer_routed`]; a page of a listed origin may read the answer (CORS).
async fn answer(served: &Served, request: Request<Incoming>) -> Response<Body> {
    let browser = &served.browser;
    let (head, body) = request.into_parts();
    let answered_here = match browser.host_refusal(&head) {
        Some(refusal) => {
            let response = error_response(&refusal);
            served
                .stations
                .note_unrouted(&head, served.peers.remote, response.status());
            Some(response)
        }
        None => browser.preflight(&head),
    };
    if let Some(response) = answered_here {
        // A reserved connection serves what the reserve is for, then closes.
        return if served.kind == SlotKind::Reserved {
            closing(response, head.version < Version::HTTP_2, &served.usage)
        } else {
            response
        };
    }
    let site = browser.site(&head);
    let cors = browser.cors_origin(&head);
    let mut response = answer_routed(served, head, body, site).await;
    if let Some(origin) = cors {
        browser::allow_origin(&mut response, origin);
    }
    response
}

/// Answers one request within the body time limits; on a reserved connection only what the
/// reserve is for. A timed-out body and a reserved connection end the connection after the
/// answer (HTTP/1: `Connection: close`; HTTP/2: GOAWAY once no request is in progress).
async fn answer_routed(
    served: &Served,
    mut head: hyper::http::request::Parts,
    body: Incoming,
    site: RequestSite,
) -> Response<Body> {
    let Served {
        stations,
        builders,
        usage,
        peers,
        kind,
        ..
    } = served;
    let (peers, kind, limits) = (*peers, *kind, builders.limits);
    let host = stations.host();
    let http = &host.config.http;
    let http1 = head.version < Version::HTTP_2;
    let reserved = kind == SlotKind::Reserved;
    // Which station the request is for: one station's paths are all its own (and also under
    // `/stations/{id}`), so its requests pass here without a copy.
    let index = match stations.paths().route(head.uri.path()) {
        StationRoute::Station { index, path } => {
            if let std::borrow::Cow::Owned(path) = path {
                let sent = crate::stations::SentPath(head.uri.path().to_owned());
                head.uri = with_path(&head.uri, &path);
                head.extensions.insert(sent);
            }
            Some(index)
        }
        StationRoute::Lab => None,
        route => {
            let error = ApiError::not_found(stations.paths().not_found(&route));
            let response = error_response(&error);
            stations.note_unrouted(&head, peers.remote, response.status());
            return if reserved {
                closing(response, http1, usage)
            } else {
                response
            };
        }
    };
    if reserved && !is_reserved_request(&http.path_prefix, &head.method, head.uri.path()) {
        host.metrics.http_connections_refused.reserve_only.inc();
        let error = ApiError::overloaded(format!(
            "the gateway is at its connection limit ({} connections): only health checks and renewing or releasing a lease are served now; try again shortly",
            limits.max_connections
        ));
        return closing(error_response(&error), http1, usage);
    }
    let Some(index) = index else {
        let below = head
            .uri
            .path()
            .strip_prefix(stations.paths().prefix())
            .unwrap_or_default();
        let below = below.to_owned();
        let answered = Box::pin(lab::answer(
            stations,
            &head,
            body,
            peers.remote,
            &below,
            site,
        ));
        let (response, timed_out) = body::with_body_limits(limits.body, answered).await;
        if timed_out.is_some() {
            host.metrics.http_timeouts.body.inc();
        }
        return if reserved || timed_out.is_some() {
            closing(response, http1, usage)
        } else {
            response
        };
    };
    let gateway = &stations.gateways()[index];
    // A body that timed out is logged by `handle`, which knows the request's redacted path.
    // Boxed where it is made: the request's future (0.9 KB) is then moved as a pointer, not
    // copied into the body limits' scope and again into `answer`'s own box.
    let handled = Box::pin(routes::handle(gateway, head, body, peers, site));
    let (response, timed_out) = body::with_body_limits(limits.body, handled).await;
    if timed_out.is_some() {
        host.metrics.http_timeouts.body.inc();
        return closing(response, http1, usage);
    }
    if reserved {
        return closing(response, http1, usage);
    }
    response
}

/// `uri` with its path replaced by `path` (the station's own path of a
/// `/stations/{id}/...` request), its query kept.
fn with_path(uri: &hyper::Uri, path: &str) -> hyper::Uri {
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    // A path cut from a valid one at a `/` is valid: only if it were not would the URI stay.
    match path_and_query.parse() {
        Ok(path_and_query) => parts.path_and_query = Some(path_and_query),
        Err(_) => return uri.clone(),
    }
    hyper::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

/// `response`, and the connection closes after it: HTTP/1 by `Connection: close`, HTTP/2
/// (which has no such header) by a GOAWAY once no request is in progress.
fn closing(mut response: Response<Body>, http1: bool, usage: &ConnectionUse) -> Response<Body> {
    if http1 {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    } else {
        usage.close_when_idle();
    }
    response
}

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

//! Who may hold an HTTP connection, and for how long an answer may sit unwritten.
//!
//! - [`ConnectionLimits`]: `http.max_connections` ordinary slots, each address at most
//!   `http.max_connections_per_ip` of all its connections, and `http.reserved_connections`
//!   more that, once the ordinary ones are all taken, serve only what keeps the control lease
//!   reachable ([`is_reserved_request`]): health checks and lease renewal and release.
//! - [`TimedIo`]: an I/O wrapper that fails a write which made no progress for
//!   `http.write_timeout_ms` (a client that stopped reading), so the connection closes. A
//!   stream that is being read keeps making progress and is never cut.
//!   Once the ordinary slots are all taken, a newcomer makes room by closing an idle
//!   connection, of the address holding the most the one idle the longest
//!   ([`ConnectionLimits::make_room`]), as nginx reuses its keep-alive connections: idle
//!   connections, HTTP/1 or HTTP/2, never lock anyone out, and a flood evicts itself first.
//! - [`FirstByteDeadline`]: fails reads until a first byte comes within a limit: over TLS, a
//!   client that finishes its handshake and then says nothing.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::Method;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::idle::{Candidate, ConnectionUse, to_evict};

/// What a new connection may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// Anything.
    Ordinary,
    /// Only [`is_reserved_request`]s; closed after its answer.
    Reserved,
}

/// Why a new connection was turned away at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the address already holds its share of {0} connections (http.max_connections_per_ip)")]
    PerIp(usize),
    #[error("every connection, the reserved ones included, is taken")]
    Full,
}

#[derive(Debug, Default)]
struct Held {
    ordinary: usize,
    reserved: usize,
    by_ip: HashMap<IpAddr, usize>,
    /// Every connection holding a slot, by an id of its own: the candidates for eviction.
    connections: HashMap<u64, Holder>,
    next_id: u64,
}

#[derive(Debug)]
struct Holder {
    ip: IpAddr,
    kind: SlotKind,
    usage: Arc<ConnectionUse>,
}

impl Held {
    fn give_back(&mut self, ip: IpAddr, kind: SlotKind) {
        match kind {
            SlotKind::Ordinary => self.ordinary = self.ordinary.saturating_sub(1),
            SlotKind::Reserved => self.reserved = self.reserved.saturating_sub(1),
        }
        if let Some(count) = self.by_ip.get_mut(&ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.by_ip.remove(&ip);
            }
        }
    }
}

/// The connection limits of the HTTP listener; shared by the accept loop and the slots.
#[derive(Debug)]
pub struct ConnectionLimits {
    ordinary: usize,
    reserved: usize,
    per_ip: usize,
    held: Mutex<Held>,
    /// Idle times are measured from here, so that they compare across connections.
    epoch: Instant,
}

impl ConnectionLimits {
    pub fn new(ordinary: usize, reserved: usize, per_ip: usize) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            ordinary,
            reserved,
            per_ip: per_ip.max(1),
            held: Mutex::new(Held::default()),
            epoch: Instant::now(),
        })
    }

    /// Every connection the listener takes at once: the ordinary ones and the reserve. Past
    /// that the accept loop stops accepting and new clients wait in the listen backlog.
    pub fn total(&self) -> usize {
        self.ordinary + self.reserved
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // Only counts behind this lock: a panic elsewhere leaves them usable.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A slot for a new connection from `ip`: an ordinary one while any is free, else one of
    /// the reserve.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnectionSlot, Refusal> {
        let mut held = self.held();
        let of_ip = held.by_ip.get(&ip).copied().unwrap_or(0);
        if of_ip >= self.per_ip {
            return Err(Refusal::PerIp(self.per_ip));
        }
        let kind = if held.ordinary < self.ordinary {
            held.ordinary += 1;
            SlotKind::Ordinary
        } else if held.reserved < self.reserved {
            held.reserved += 1;
            SlotKind::Reserved
        } else {
            return Err(Refusal::Full);
        };
        *held.by_ip.entry(ip).or_insert(0) += 1;
        let usage = ConnectionUse::new(self.epoch);
        let id = held.next_id;
        held.next_id += 1;
        held.connections.insert(
            id,
            Holder {
                ip,
                kind,
                usage: usage.clone(),
            },
        );
        Ok(ConnectionSlot {
            limits: self.clone(),
            id,
            kind,
            usage,
        })
    }

    /// Before a newcomer is admitted: when every ordinary slot is taken, closes an idle
    /// ordinary connection (or, with the reserve full too and no ordinary one idle, a reserved
    /// one) and gives its slot back at once: of the address holding the most connections, the
    /// one idle the longest ([`to_evict`]). Whether one was. Connections with a request in
    /// progress are never chosen.
    pub fn make_room(&self) -> bool {
        let mut held = self.held();
        if held.ordinary < self.ordinary {
            return false;
        }
        let idlest = |held: &Held, kind: SlotKind| {
            to_evict(
                held.connections
                    .iter()
                    .filter(|(_, holder)| holder.kind == kind)
                    .map(|(id, holder)| Candidate {
                        key: *id,
                        of_its_address: held.by_ip.get(&holder.ip).copied().unwrap_or(0),
                        idle_since: holder.usage.idle_since(),
                    }),
            )
        };
        let chosen = match idlest(&held, SlotKind::Ordinary) {
            Some(id) => Some(id),
            None if held.reserved >= self.reserved => idlest(&held, SlotKind::Reserved),
            None => None,
        };
        let Some(holder) = chosen.and_then(|id| held.connections.remove(&id)) else {
            return false;
        };
        holder.usage.evict();
        held.give_back(holder.ip, holder.kind);
        true
    }

    fn release(&self, id: u64) {
        let mut held = self.held();
        // An evicted connection gave its slot back when it was chosen.
        if let Some(holder) = held.connections.remove(&id) {
            held.give_back(holder.ip, holder.kind);
        }
    }
}

/// One connection's place in the [`ConnectionLimits`]; given back when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    limits: Arc<ConnectionLimits>,
    id: u64,
    pub kind: SlotKind,
    /// Its requests in progress and idle time, which the limits read to choose whom to evict.
    pub usage: Arc<ConnectionUse>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.limits.release(self.id);
    }
}

/// Whether a request is one the reserve serves: `GET /healthz`, `GET /readyz`, and renewing
/// or releasing a lease (`PUT`/`DELETE api/lease/{id}`, `v1/leases/{name}`,
/// `v1/semaphores/{name}`), below `prefix` (`http.path_prefix`).
pub fn is_reserved_request(prefix: &str, method: &Method, path: &str) -> bool {
    let Some(below) = path.strip_prefix(prefix.trim_end_matches('/')) else {
        return false;
    };
    if matches!(below, "/healthz" | "/readyz") {
        return matches!(*method, Method::GET | Method::HEAD);
    }
    if !matches!(*method, Method::PUT | Method::DELETE) {
        return false;
    }
    let below = below.trim_end_matches('/');
    let named = |rest: Option<&str>| rest.is_some_and(|id| !id.is_empty() && !id.contains('/'));
    named(below.strip_prefix("/api/lease/"))
        || named(below.strip_prefix("/v1/leases/"))
        || named(below.strip_prefix("/v1/semaphores/"))
}

/// What the connection's I/O saw, read by the accept loop once hyper is done with it.
#[derive(Debug, Default)]
pub struct IoActivity {
    /// Bytes of a request came in after the last answer's bytes went out: a header timeout
    /// then cut a request short, rather than closing an idle keep-alive connection.
    request_started: AtomicBool,
    /// The write timeout closed the connection.
    write_stalled: AtomicBool,
    /// No byte came within a [`FirstByteDeadline`].
    first_byte_late: AtomicBool,
}

impl IoActivity {
    pub fn request_started(&self) -> bool {
        self.request_started.load(Ordering::Relaxed)
    }

    pub fn write_stalled(&self) -> bool {
        self.write_stalled.load(Ordering::Relaxed)
    }

    pub fn first_byte_late(&self) -> bool {
        self.first_byte_late.load(Ordering::Relaxed)
    }
}

/// Wraps a connection's I/O: a write (or flush, or shutdown) that stays pending for `limit`
/// fails with [`io::ErrorKind::TimedOut`]; any progress starts the limit again.
pub struct TimedIo<T> {
    inner: T,
    limit: Duration,
    /// Running while a write is pending.
    stalled: Option<Pin<Box<Sleep>>>,
    activity: Arc<IoActivity>,
}

impl<T> TimedIo<T> {
    pub fn new(inner: T, limit: Duration) -> (TimedIo<T>, Arc<IoActivity>) {
        let activity = Arc::new(IoActivity::default());
        (
            TimedIo {
                inner,
                limit,
                stalled: None,
                activity: activity.clone(),
            },
            activity,
        )
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Called with the inner write's outcome: progress resets the timer; pending starts it
    /// (or fails once it ran out).
    fn check<R>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match outcome {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if timer.as_mut().poll(cx).is_ready() {
                    self.stalled = None;
                    self.activity.write_stalled.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no progress writing the answer for {} ms: the client stopped reading",
                            limit.as_millis()
                        ),
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let outcome = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(outcome, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.request_started.store(true, Ordering::Relaxed);
        }
        outcome
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(outcome, Poll::Ready(Ok(n)) if n > 0) {
            self.activity
                .request_started
                .store(false, Ordering::Relaxed);
        }
        self.check(cx, outcome)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(outcome, Poll::Ready(Ok(n)) if n > 0) {
            self.activity
                .request_started
                .store(false, Ordering::Relaxed);
        }
        self.check(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_flush(cx);
        self.check(cx, outcome)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.check(cx, outcome)
    }
}

/// Wraps a connection's (decrypted) I/O: a read that brings no first byte within the limit
/// fails with [`io::ErrorKind::TimedOut`]; the first byte disarms it for good.
pub struct FirstByteDeadline<T> {
    inner: T,
    deadline: Option<Pin<Box<Sleep>>>,
    activity: Arc<IoActivity>,
}

impl<T> FirstByteDeadline<T> {
    pub fn new(inner: T, limit: Duration, activity: Arc<IoActivity>) -> FirstByteDeadline<T> {
        FirstByteDeadline {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(limit))),
            activity,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FirstByteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let outcome = Pin::new(&mut self.inner).poll_read(cx, buf);
        match outcome {
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.deadline = None,
            Poll::Pending => {
                if let Some(deadline) = self.deadline.as_mut()
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    self.deadline = None;
                    self.activity.first_byte_late.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "nothing received in time",
                    )));
                }
            }
            _ => {}
        }
        outcome
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FirstByteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn an_address_holds_at_most_its_share_and_gets_it_back() {
        let limits = ConnectionLimits::new(8, 2, 2);
        let first = limits.admit(A).unwrap();
        let _second = limits.admit(A).unwrap();
        assert_eq!(limits.admit(A).unwrap_err(), Refusal::PerIp(2));
        assert_eq!(limits.admit(B).unwrap().kind, SlotKind::Ordinary);
        drop(first);
        assert!(limits.admit(A).is_ok());
    }

    #[test]
    fn past_the_ordinary_slots_come_the_reserved_then_none() {
        let limits = ConnectionLimits::new(2, 1, 10);
        let ordinary: Vec<_> = (0..2).map(|_| limits.admit(A).unwrap()).collect();
        assert!(ordinary.iter().all(|s| s.kind == SlotKind::Ordinary));
        let reserved = limits.admit(B).unwrap();
        assert_eq!(reserved.kind, SlotKind::Reserved);
        assert_eq!(limits.admit(B).unwrap_err(), Refusal::Full);
        drop(reserved);
        assert_eq!(limits.admit(B).unwrap().kind, SlotKind::Reserved);
        drop(ordinary);
        assert_eq!(limits.admit(B).unwrap().kind, SlotKind::Ordinary);
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_limit_an_idle_connection_of_the_heaviest_address_makes_room_never_one_in_use() {
        let second = Duration::from_secs(1);
        let limits = ConnectionLimits::new(3, 1, 10);
        let oldest = limits.admit(A).unwrap();
        assert!(!limits.make_room(), "evicted with ordinary slots free");
        tokio::time::sleep(second).await;
        let busy = limits.admit(A).unwrap();
        let _request = busy.usage.begin();
        tokio::time::sleep(second).await;
        let newer = limits.admit(B).unwrap();
        tokio::time::sleep(second).await;
        // Full now (3 ordinary): A holds two, B one: A's idle one goes, its slot at once free.
        assert!(limits.make_room());
        assert!(oldest.usage.evicted());
        assert!(!busy.usage.evicted() && !newer.usage.evicted());
        let newest = limits.admit(B).unwrap();
        assert_eq!(newest.kind, SlotKind::Ordinary);
        // The evicted one's own end gives nothing back twice.
        drop(oldest);
        let reserved = limits.admit(A).unwrap();
        assert_eq!(reserved.kind, SlotKind::Reserved);
        // Ordinary full of one busy (A) and two idle (B, which holds two): the one idle
        // longer goes next.
        assert!(limits.make_room());
        assert!(newer.usage.evicted());
        assert!(!busy.usage.evicted() && !newest.usage.evicted());
    }

    #[test]
    fn the_reserve_serves_health_and_lease_renewal_and_release_only() {
        let reserved =
            |prefix: &str, method: Method, path: &str| is_reserved_request(prefix, &method, path);
        assert!(reserved("", Method::GET, "/healthz"));
        assert!(reserved("", Method::GET, "/readyz"));
        assert!(reserved("", Method::PUT, "/api/lease/abc"));
        assert!(reserved("", Method::DELETE, "/api/lease/abc/"));
        assert!(reserved("/st3", Method::PUT, "/st3/api/lease/abc"));
        assert!(reserved("/st3/", Method::GET, "/st3/healthz"));
        assert!(reserved("", Method::PUT, "/v1/leases/job"));
        assert!(reserved("", Method::DELETE, "/v1/semaphores/pool"));
        assert!(!reserved("", Method::POST, "/api/lease"));
        assert!(!reserved("", Method::POST, "/api/lease/abc"));
        assert!(!reserved("", Method::POST, "/v1/leases/job"));
        assert!(!reserved("", Method::DELETE, "/api/lease"));
        assert!(!reserved("", Method::GET, "/api/capabilities"));
        assert!(!reserved("", Method::GET, "/metrics"));
        assert!(!reserved("/st3", Method::GET, "/healthz"));
        assert!(!reserved("", Method::PUT, "/api/lease/a/b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_without_progress_fails_after_the_limit() {
        // A 16-byte pipe whose far end is never read: a client that stopped reading.
        let (near, _far) = tokio::io::duplex(16);
        let (mut io, activity) = TimedIo::new(near, Duration::from_secs(10));
        let started = Instant::now();
        let error = io.write_all(&[0u8; 32]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert!(activity.write_stalled());
    }

    #[tokio::test(start_paused = true)]
    async fn an_armed_read_fails_without_a_byte_in_time_and_a_byte_disarms_it() {
        use tokio::io::AsyncReadExt;
        let (near, _far) = tokio::io::duplex(16);
        let activity = Arc::new(IoActivity::default());
        let mut io = FirstByteDeadline::new(near, Duration::from_secs(3), activity.clone());
        let started = Instant::now();
        let error = io.read(&mut [0u8; 4]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert!(activity.first_byte_late());

        let (near, mut far) = tokio::io::duplex(16);
        let activity = Arc::new(IoActivity::default());
        let mut io = FirstByteDeadline::new(near, Duration::from_secs(3), activity.clone());
        far.write_all(b"x").await.unwrap();
        io.read_exact(&mut [0u8; 1]).await.unwrap();
        // Disarmed: a later silence is not cut.
        let waited = tokio::time::timeout(Duration::from_secs(60), io.read(&mut [0u8; 4])).await;
        assert!(waited.is_err(), "{waited:?}");
        assert!(!activity.first_byte_late());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_never_cut() {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(16);
        let (mut io, activity) = TimedIo::new(near, Duration::from_secs(10));
        let writer = tokio::spawn(async move { io.write_all(&[7u8; 24]).await });
        // A byte every 6 s: every write waits, none as long as the limit.
        let mut byte = [0u8; 1];
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            far.read_exact(&mut byte).await.unwrap();
        }
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(1), far.read_to_end(&mut rest)).await;
        writer.await.unwrap().unwrap();
        assert_eq!(rest.len(), 16);
        assert!(!activity.write_stalled());
    }
}

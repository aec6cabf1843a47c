//! The simulated serial line or socket between a gateway and the station: an in-memory duplex
//! pipe the simulation can cut (the link dropped from either side) or hold (a paused gateway:
//! what it wrote before the pause reaches the station only when it runs again).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::FutureExt;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Whether the pipes of one gateway deliver now.
#[derive(Default)]
struct HoldState {
    held: bool,
    waiting: Vec<Waker>,
}

/// The controls of one gateway's line to the station: cut the current connection, hold and
/// release everything on it; and how many requests the station takes at once on it.
#[derive(Clone, Default)]
pub struct LineControl {
    cut: Arc<Mutex<CancellationToken>>,
    hold: Arc<Mutex<HoldState>>,
    /// The station's window on this line (0: the usual 4); 1 for a serial line.
    window: Arc<std::sync::atomic::AtomicU16>,
}

impl LineControl {
    /// A line whose station takes `window` requests at once (a serial line takes one).
    pub fn with_window(window: u16) -> LineControl {
        let line = LineControl::default();
        line.window
            .store(window, std::sync::atomic::Ordering::Relaxed);
        line
    }

    /// How many requests the station takes at once on this line (its HELLO says so).
    pub fn window(&self) -> u16 {
        match self.window.load(std::sync::atomic::Ordering::Relaxed) {
            0 => 4,
            window => window,
        }
    }

    /// A token for a new connection: cutting cuts this one.
    pub fn new_connection(&self) -> CancellationToken {
        let token = CancellationToken::new();
        *self.cut.lock().unwrap() = token.clone();
        token
    }

    /// Drops the current connection (both sides see it closed).
    pub fn cut(&self) {
        self.cut.lock().unwrap().cancel();
    }

    /// Holds (or releases) everything written on this gateway's line.
    pub fn set_held(&self, held: bool) {
        let mut state = self.hold.lock().unwrap();
        state.held = held;
        if !held {
            for waker in state.waiting.drain(..) {
                waker.wake();
            }
        }
    }

    fn poll_released(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.hold.lock().unwrap();
        if state.held {
            state.waiting.push(cx.waker().clone());
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// One end of a connection: fails once cut, and moves no byte while held.
pub struct SimStream {
    inner: DuplexStream,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    control: LineControl,
}

impl SimStream {
    pub fn new(inner: DuplexStream, token: CancellationToken, control: LineControl) -> SimStream {
        SimStream {
            inner,
            cut: Box::pin(token.cancelled_owned()),
            control,
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.cut.poll_unpin(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the simulated line was cut",
            )));
        }
        match self.control.poll_released(cx) {
            Poll::Ready(()) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.check(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_read(cx, buf),
            other => other,
        }
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.check(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_write(cx, buf),
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.check(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

//! A pseudo-terminal's master side as an async byte stream, so the serial path can be tested
//! without hardware: clients open the slave device (`/dev/pts/N`) as if it were a serial port.
//!
//! While no client has the slave open, Linux answers reads on the master with EIO. That is not
//! an end: the stream waits a moment and tries again, so clients may come and go.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// How long to wait before reading again while no client has the slave open.
const NO_CLIENT_RETRY: Duration = Duration::from_millis(20);

/// The master side of a pseudo-terminal. Clones share the device; one session at a time
/// should use it.
///
/// Each clone watches its own duplicate of the master descriptor. When the last client closes
/// the slave, the master reports a hang-up, and tokio keeps a hang-up as readiness for good: a
/// watcher that saw one would find the master "readable" forever and spin on reads that would
/// block. So after a hang-up the duplicate is replaced by a fresh one, watched anew.
pub(crate) struct PtyPort {
    master: Arc<OwnedFd>,
    fd: AsyncFd<OwnedFd>,
    retry: Option<Pin<Box<Sleep>>>,
}

/// A duplicate of `master`, registered with the runtime.
fn watch(master: &OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    let duplicate = master.try_clone()?;
    // SAFETY: an `OwnedFd` keeps its descriptor open and unchanged until it is dropped, which
    // only happens when the `AsyncFd` is.
    unsafe { AsyncFd::register(duplicate) }.map_err(|error| error.into())
}

impl PtyPort {
    /// Opens a new pseudo-terminal pair in raw mode; returns the master and the slave's path.
    pub(crate) fn open() -> io::Result<(PtyPort, PathBuf)> {
        let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_NONBLOCK)?;
        grantpt(&master)?;
        unlockpt(&master)?;
        let path = PathBuf::from(ptsname_r(&master)?);
        // Termios calls on the master reach the slave's settings: raw, so no byte is
        // translated, echoed or taken as a signal.
        let mut termios = tcgetattr(master.as_fd())?;
        cfmakeraw(&mut termios);
        tcsetattr(master.as_fd(), SetArg::TCSANOW, &termios)?;
        let master = Arc::new(OwnedFd::from(master));
        let fd = watch(&master)?;
        Ok((
            PtyPort {
                master,
                fd,
                retry: None,
            },
            path,
        ))
    }

    /// Another handle on the same master, for the next session.
    pub(crate) fn try_clone(&self) -> io::Result<PtyPort> {
        Ok(PtyPort {
            master: self.master.clone(),
            fd: watch(&self.master)?,
            retry: None,
        })
    }

    /// Forgets a hang-up: watches a fresh duplicate of the master.
    fn watch_again(&mut self) -> io::Result<()> {
        self.fd = watch(&self.master)?;
        Ok(())
    }
}

impl AsyncRead for PtyPort {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if let Some(retry) = self.retry.as_mut() {
                ready!(retry.as_mut().poll(cx));
                self.retry = None;
            }
            let this = &mut *self;
            let mut guard = ready!(this.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let hung_up = guard.ready().is_read_closed();
            let result = guard.try_io(|inner| {
                nix::unistd::read(inner.get_ref(), unfilled).map_err(io::Error::from)
            });
            drop(guard);
            match result {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // No client has the slave open: try again in a moment.
                Ok(Err(error)) if error.raw_os_error() == Some(Errno::EIO as i32) => {
                    this.watch_again()?;
                    this.retry = Some(Box::pin(tokio::time::sleep(NO_CLIENT_RETRY)));
                }
                Ok(Err(error)) => return Poll::Ready(Err(error)),
                // A client has the slave open again since the hang-up this watch still shows.
                Err(_would_block) if hung_up => this.watch_again()?,
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for PtyPort {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            let mut guard = ready!(this.fd.poll_write_ready(cx))?;
            let hung_up = guard.ready().is_write_closed();
            let result = guard
                .try_io(|inner| nix::unistd::write(inner.get_ref(), buf).map_err(io::Error::from));
            drop(guard);
            match result {
                Ok(Ok(n)) => return Poll::Ready(Ok(n)),
                // Nobody on the line: the bytes are lost, as on a real serial line.
                Ok(Err(error)) if error.raw_os_error() == Some(Errno::EIO as i32) => {
                    return Poll::Ready(Ok(buf.len()));
                }
                Ok(Err(error)) => return Poll::Ready(Err(error)),
                Err(_would_block) if hung_up => this.watch_again()?,
                Err(_would_block) => {}
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// The master is shared by later sessions, so a session's end does not close it.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

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

/// The master side of a pseudo-terminal. Clones share the descriptor; one session at a time
/// should use it.
pub(crate) struct PtyPort {
    fd: Arc<AsyncFd<OwnedFd>>,
    retry: Option<Pin<Box<Sleep>>>,
}

impl Clone for PtyPort {
    fn clone(&self) -> PtyPort {
        PtyPort {
            fd: self.fd.clone(),
            retry: None,
        }
    }
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
        // SAFETY: an `OwnedFd` keeps its descriptor open and unchanged until it is dropped,
        // which only happens when the `AsyncFd` is.
        let fd = unsafe { AsyncFd::register(OwnedFd::from(master)) }?;
        Ok((
            PtyPort {
                fd: Arc::new(fd),
                retry: None,
            },
            path,
        ))
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
            let fd = self.fd.clone();
            let mut guard = ready!(fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|inner| {
                nix::unistd::read(inner.get_ref(), unfilled).map_err(io::Error::from)
            }) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(error)) if error.raw_os_error() == Some(Errno::EIO as i32) => {
                    // No client has the slave open; readiness stays set so the next try reads.
                    self.retry = Some(Box::pin(tokio::time::sleep(NO_CLIENT_RETRY)));
                }
                Ok(Err(error)) => return Poll::Ready(Err(error)),
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
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard
                .try_io(|inner| nix::unistd::write(inner.get_ref(), buf).map_err(io::Error::from))
            {
                Ok(Ok(n)) => return Poll::Ready(Ok(n)),
                // Nobody on the line: the bytes are lost, as on a real serial line.
                Ok(Err(error)) if error.raw_os_error() == Some(Errno::EIO as i32) => {
                    return Poll::Ready(Ok(buf.len()));
                }
                Ok(Err(error)) => return Poll::Ready(Err(error)),
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

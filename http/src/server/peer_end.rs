//! Whether a client ended its side of the connection while its request waits: a `POST
//! api/lease?waitMs=N` in line leaves it when its client closes (hyper, serving half-closed
//! clients, no longer reads the connection while a request is in progress, so it cannot tell).
//! Looked at only while a request waits in line, ten times a second, by peeking at the socket.

use std::os::fd::RawFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, recv};

/// How often a waiting request's socket is looked at.
const EVERY: Duration = Duration::from_millis(100);

/// Resolves once the client of the connection on `socket` has ended its side (the end of its
/// stream, with nothing unread before it) or the connection failed; never for `None` (a
/// connection whose socket is not known). `socket` must stay open while this is polled: it is
/// the connection's own, open for as long as its request is served.
pub async fn ended(socket: Option<RawFd>) {
    let Some(socket) = socket else {
        return std::future::pending().await;
    };
    let mut byte = [0u8; 1];
    loop {
        tokio::time::sleep(EVERY).await;
        match recv(
            socket,
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            // Bytes not yet read (a next request, TLS records): still there.
            Ok(n) if n > 0 => {}
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Ok(_) | Err(_) => return,
        }
    }
}

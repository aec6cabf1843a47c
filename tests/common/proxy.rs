//! A TCP proxy in front of a backend that a test can stall: while stalled, bytes in either
//! direction are held (the connection stays open, nothing moves), as a database that stopped
//! answering would; new connections are accepted and held too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct StallingProxy {
    pub addr: SocketAddr,
    stalled: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl StallingProxy {
    /// A proxy on 127.0.0.1:0 to `target`.
    pub async fn start(target: SocketAddr) -> StallingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stalled = Arc::new(AtomicBool::new(false));
        let flag = stalled.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let flag = flag.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, flag.clone()),
                        pump(server_read, client_write, flag)
                    );
                });
            }
        });
        StallingProxy {
            addr,
            stalled,
            task,
        }
    }

    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding each chunk while the proxy is stalled.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Held, not dropped: the bytes go on once the stall ends.
        while stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

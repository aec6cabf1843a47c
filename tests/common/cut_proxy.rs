//! A TCP proxy in front of a gateway that a test can cut: every connection through it closed at
//! once (a network blip, as a browser sees it), new ones refused for a while (the network still
//! down, or the gateway gone), and pointed at another address (the gateway restarted on a port
//! of its own), while the browser keeps the proxy's address.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct CuttingProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

struct Shared {
    target: Mutex<SocketAddr>,
    refusing: AtomicBool,
    /// The tasks carrying the connections open now.
    connections: Mutex<Vec<JoinHandle<()>>>,
}

impl CuttingProxy {
    /// A proxy on 127.0.0.1:0 to `target`.
    pub async fn start(target: SocketAddr) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            refusing: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
        });
        let accepting = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                // Refused: closed at once, as a connection to a port nobody listens on fails.
                if accepting.refusing.load(Ordering::SeqCst) {
                    continue;
                }
                let target = *accepting.target.lock().unwrap();
                let carried = tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                let mut connections = accepting.connections.lock().unwrap();
                connections.retain(|connection| !connection.is_finished());
                connections.push(carried);
            }
        });
        CuttingProxy { addr, shared, task }
    }

    /// Closes every connection through the proxy now.
    pub fn cut(&self) {
        for connection in self.shared.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// While `refusing`, new connections are closed as soon as they come.
    pub fn set_refusing(&self, refusing: bool) {
        self.shared.refusing.store(refusing, Ordering::SeqCst);
    }

    /// Where new connections go from now on.
    pub fn set_target(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap() = target;
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

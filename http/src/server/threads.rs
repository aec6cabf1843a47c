//! The threads that serve HTTP connections: the gateway's own runtime and, with `http.threads`
//! above 1 (the default on a machine of more than one core), runtimes of their own on threads
//! of their own. Each connection is served start to end on one of them, the one with the fewest
//! open connections, the gateway's own first: there a request that goes to the station costs
//! no hop between threads, so a lone client (a test script) gets the shortest way to it.
//!
//! Why not one work-stealing runtime for all (measured, BENCHMARKS.md "The cached read"): with
//! two workers, connections' tasks move between them and each is preempted far more often on
//! cores shared with its clients; a connection kept on one thread costs about a tenth less a
//! request, and the station's own work (the link, the lease, the change runner) stays on the
//! gateway's runtime of one worker, where a forced read never crosses a thread.
//!
//! Nothing that must finish runs here beyond a request's own future: a change, its audit line,
//! a lease's transition are spawned on the gateway's runtime (`station::ChangeRunner`,
//! `lease::control::shell`). The extra threads stop when their [`ConnectionThreads`] is dropped
//! (with the `GatewayHandle` of station-gateway, after its `stop` has drained the connections); the
//! connections still open on them end with them, as on a runtime shut down.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::debug;

/// The most threads `http.threads` may ask for.
pub use crate::config::MAX_HTTP_THREADS as MAX_THREADS;

/// The runtimes connections are served on; dropping it stops the extra threads.
pub struct ConnectionThreads {
    placer: Placer,
    _stop: DropGuard,
}

/// Where the next connection goes: cheap to clone, held by the accept loop.
#[derive(Clone)]
pub struct Placer {
    /// The gateway's own runtime first (`None`: the runtime the connection was accepted on),
    /// then one per extra thread.
    places: Arc<[Place]>,
}

struct Place {
    runtime: Option<Handle>,
    /// Connections open on it now.
    open: AtomicUsize,
}

impl ConnectionThreads {
    /// `count` threads in all (at least 1), the gateway's own runtime, the current one,
    /// included: `count - 1` threads are started, each with a single-threaded runtime.
    pub fn start(count: usize) -> std::io::Result<ConnectionThreads> {
        let stop = CancellationToken::new();
        // Made first: a thread that fails to start stops those started before it.
        let stop_guard = stop.clone().drop_guard();
        let mut places = vec![Place {
            runtime: None,
            open: AtomicUsize::new(0),
        }];
        for index in 1..count.max(1) {
            let (handle_to, handle) = std::sync::mpsc::channel();
            let stopped = stop.clone();
            std::thread::Builder::new()
                .name(format!("http-{index}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(error) => {
                            let _ = handle_to.send(Err(error));
                            return;
                        }
                    };
                    let _ = handle_to.send(Ok(runtime.handle().clone()));
                    runtime.block_on(stopped.cancelled());
                })?;
            let runtime = handle.recv().map_err(|_| {
                std::io::Error::other("an HTTP connection thread ended before it started")
            })??;
            places.push(Place {
                runtime: Some(runtime),
                open: AtomicUsize::new(0),
            });
        }
        Ok(ConnectionThreads {
            placer: Placer {
                places: places.into(),
            },
            _stop: stop_guard,
        })
    }

    /// How many threads serve connections, the gateway's own included.
    pub fn count(&self) -> usize {
        self.placer.places.len()
    }

    /// The accept loop's way to place connections.
    pub fn placer(&self) -> Placer {
        self.placer.clone()
    }
}

impl Placer {
    /// Serves `stream` with `serve` on the place with the fewest open connections (the first
    /// such, the gateway's own before the others), tracked by `tracker`.
    pub fn spawn<F, Fut>(&self, tracker: &TaskTracker, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let index = self.least_busy();
        let open = OpenConnection::new(self.places.clone(), index);
        match &self.places[index].runtime {
            None => {
                tracker.spawn(async move {
                    serve(stream).await;
                    drop(open);
                });
            }
            Some(runtime) => {
                // A socket is registered with the runtime that polls it: handed over as a
                // plain socket, registered again on the thread that serves it.
                let stream = match stream.into_std() {
                    Ok(stream) => stream,
                    Err(error) => {
                        debug!("cannot hand a connection to its thread: {error}");
                        return;
                    }
                };
                tracker.spawn_on(
                    async move {
                        match TcpStream::from_std(stream) {
                            Ok(stream) => serve(stream).await,
                            Err(error) => {
                                debug!("cannot serve a connection on its thread: {error}")
                            }
                        }
                        drop(open);
                    },
                    runtime,
                );
            }
        }
    }

    fn least_busy(&self) -> usize {
        least_busy(
            self.places
                .iter()
                .map(|place| place.open.load(Ordering::Relaxed)),
        )
    }
}

/// The index of the smallest count, the first of equals.
fn least_busy(open: impl Iterator<Item = usize>) -> usize {
    let mut best = (0, usize::MAX);
    for (index, count) in open.enumerate() {
        if count < best.1 {
            best = (index, count);
        }
    }
    best.0
}

/// A connection counted on its place until it ends (or its task is dropped).
struct OpenConnection {
    places: Arc<[Place]>,
    index: usize,
}

impl OpenConnection {
    fn new(places: Arc<[Place]>, index: usize) -> OpenConnection {
        places[index].open.fetch_add(1, Ordering::Relaxed);
        OpenConnection { places, index }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.places[self.index].open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[test]
    fn the_least_busy_place_is_the_first_of_the_fewest() {
        assert_eq!(least_busy([0, 0, 0].into_iter()), 0);
        assert_eq!(least_busy([1, 0, 0].into_iter()), 1);
        assert_eq!(least_busy([1, 1, 0].into_iter()), 2);
        assert_eq!(least_busy([2, 1, 1].into_iter()), 1);
        assert_eq!(least_busy([0].into_iter()), 0);
    }

    /// Accepts `count` connections and places each; each answers with its thread's name.
    async fn serve_names(placer: &Placer, tracker: &TaskTracker, count: usize) -> Vec<String> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        for _ in 0..count {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (stream, _) = listener.accept().await.unwrap();
            placer.spawn(tracker, stream, |mut stream| async move {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                let _ = stream.write_all(name.as_bytes()).await;
                // Open until the client hangs up, so the next one is placed beside it.
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
            });
        }
        let mut names = Vec::new();
        for client in &mut clients {
            let mut name = vec![0u8; 64];
            let read = client.read(&mut name).await.unwrap();
            names.push(String::from_utf8_lossy(&name[..read]).into_owned());
        }
        names
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn connections_go_to_the_gateways_runtime_first_then_to_the_least_busy_thread() {
        let threads = ConnectionThreads::start(3).unwrap();
        assert_eq!(threads.count(), 3);
        let tracker = TaskTracker::new();
        let names = serve_names(&threads.placer(), &tracker, 4).await;
        // The gateway's own runtime's worker, then each extra thread, then the first again.
        assert!(!names[0].starts_with("http-"), "{names:?}");
        assert_eq!(names[1], "http-1", "{names:?}");
        assert_eq!(names[2], "http-2", "{names:?}");
        assert!(!names[3].starts_with("http-"), "{names:?}");
    }

    #[tokio::test]
    async fn one_thread_serves_everything_on_the_gateways_runtime() {
        let threads = ConnectionThreads::start(1).unwrap();
        assert_eq!(threads.count(), 1);
        let tracker = TaskTracker::new();
        let names = serve_names(&threads.placer(), &tracker, 3).await;
        assert!(
            names.iter().all(|name| !name.starts_with("http-")),
            "{names:?}"
        );
    }

    #[tokio::test]
    async fn a_closed_connection_frees_its_place_and_dropping_the_threads_ends_theirs() {
        let threads = ConnectionThreads::start(2).unwrap();
        let placer = threads.placer();
        let tracker = TaskTracker::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Two connections: one here, one on http-1.
        let mut clients = Vec::new();
        for _ in 0..2 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (stream, _) = listener.accept().await.unwrap();
            placer.spawn(&tracker, stream, |mut stream| async move {
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
            });
        }
        assert_eq!(placer.least_busy(), 0);
        // The one here hangs up: its place is the least busy again once its task ended.
        drop(clients.remove(0));
        until(&placer, 0, 0, "the closed connection is still counted").await;
        assert_eq!(placer.places[1].open.load(Ordering::Relaxed), 1);
        // Dropping the threads ends the connection still open on http-1: its client reads
        // the end of the stream.
        drop(threads);
        let mut rest = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            clients[0].read_to_end(&mut rest),
        )
        .await;
        assert!(matches!(read, Ok(Ok(0))), "{read:?}");
        until(&placer, 1, 0, "the ended connection is still counted").await;
    }

    /// Waits (at most 10 s, else fails with `why`) until `place` counts `open` connections.
    async fn until(placer: &Placer, place: usize, open: usize, why: &str) {
        let counted = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while placer.places[place].open.load(Ordering::Relaxed) != open {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        });
        assert!(counted.await.is_ok(), "{why}");
    }
}

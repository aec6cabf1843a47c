//! The gateway's own runtime, remembered where work that must finish is spawned from a
//! request: a change, its audit line, a lease's transition. A request may run on a connection
//! thread's runtime (`http::threads`), which stops when the gateway's handle is dropped; this
//! work goes where the link and the lease live, and ends as the gateway does, not as a
//! connection's thread does. It runs in the span it was made in: in a gateway of several
//! stations, its station's, so what such work logs is that station's (`api/application/log`).

use std::future::Future;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::{Instrument as _, Span};

/// Where work that must finish is spawned, and the span it runs in; cheap to clone.
#[derive(Clone, Debug)]
pub struct GatewayRuntime {
    handle: Option<Handle>,
    span: Span,
}

impl GatewayRuntime {
    /// The runtime this is called on, and the span it is called in: made where the gateway
    /// starts (a station's). Outside any runtime (a test building a part alone), each spawn
    /// goes to the runtime it is called on.
    pub fn current() -> GatewayRuntime {
        GatewayRuntime {
            handle: Handle::try_current().ok(),
            span: Span::current(),
        }
    }

    /// Runs `task` on the gateway's runtime.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = task.instrument(self.span.clone());
        match &self.handle {
            Some(runtime) => runtime.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Runs `task` on the gateway's runtime, tracked by `tracker`.
    pub fn spawn_tracked<F>(&self, tracker: &TaskTracker, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = task.instrument(self.span.clone());
        match &self.handle {
            Some(runtime) => tracker.spawn_on(task, runtime),
            None => tracker.spawn(task),
        }
    }
}

/// Runs the future `make` makes on a runtime of its own on a thread of its own, as a request
/// on a connection thread runs, and drops that runtime (and whatever it still runs) when the
/// future is done: what a connection thread's end does to work spawned there.
#[cfg(test)]
pub(crate) fn on_a_thread_of_its_own<F>(
    make: impl FnOnce() -> F + Send + 'static,
) -> std::thread::JoinHandle<()>
where
    F: Future<Output = ()>,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(make());
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_spawned_from_another_runtime_runs_on_the_gateways() {
        let gateway = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("the-gateway")
            .enable_all()
            .build()
            .unwrap();
        let home = gateway.block_on(async { GatewayRuntime::current() });
        let other = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let tracker = TaskTracker::new();
        let names = other.block_on(async {
            let name = || std::thread::current().name().unwrap_or("").to_owned();
            let spawned = home.spawn(async move { name() }).await.unwrap();
            let tracked = home
                .spawn_tracked(&tracker, async move { name() })
                .await
                .unwrap();
            (spawned, tracked)
        });
        assert_eq!(names, ("the-gateway".to_owned(), "the-gateway".to_owned()));
        assert!(tracker.is_empty());
    }

    #[test]
    fn outside_a_runtime_it_spawns_where_it_is_called() {
        let home = GatewayRuntime::current();
        let here = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ran = here.block_on(async { home.spawn(async { 7 }).await.unwrap() });
        assert_eq!(ran, 7);
    }
}

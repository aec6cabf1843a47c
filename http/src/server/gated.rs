//! A future polled only after its own waker fired: for the side branches of a connection's
//! `select!` (the shutdown token, the idle deadline), which `select!` would otherwise poll on
//! every wake of the connection, that is twice a request (a thirtieth of a cached read's
//! instructions).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// Wraps a future so that it is polled at first and then only once something it waits for
/// woke it; the task polling the wrapper is woken then too.
pub struct Gated<F> {
    inner: Pin<Box<F>>,
    gate: Arc<Gate>,
    /// The gate as a waker, made once.
    waker: Waker,
}

/// Whether the inner future's waker fired since it was last polled, and the task to wake.
struct Gate {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.task.wake();
    }
}

impl<F: Future> Gated<F> {
    pub fn new(inner: F) -> Gated<F> {
        let gate = Arc::new(Gate {
            // The first poll goes through: the inner future has registered nothing yet.
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Gated {
            inner: Box::pin(inner),
            waker: Waker::from(gate.clone()),
            gate,
        }
    }
}

impl<F: Future> Future for Gated<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // The task first: a wake that comes after the flag is read still reaches it.
        self.gate.task.register(cx.waker());
        if !self.gate.woken.swap(false, Ordering::SeqCst) {
            return Poll::Pending;
        }
        let this = &mut *self;
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A future that counts its polls and is ready once `ready` is set; keeps the last waker.
    struct Probe {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            if self.ready.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    struct CountingWake(AtomicUsize);
    impl Wake for CountingWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_inner_future_is_polled_first_and_then_only_after_its_own_wake() {
        let (polls, ready) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let inner_waker = Arc::new(std::sync::Mutex::new(None));
        let mut gated = Gated::new(Probe {
            polls: polls.clone(),
            ready: ready.clone(),
            waker: inner_waker.clone(),
        });
        let task = Arc::new(CountingWake(AtomicUsize::new(0)));
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        let mut gated = Pin::new(&mut gated);

        assert!(gated.as_mut().poll(&mut cx).is_pending());
        assert_eq!(
            polls.load(Ordering::SeqCst),
            1,
            "the first poll goes through"
        );
        // Woken for something else (the connection's I/O): the inner future is not polled.
        for _ in 0..5 {
            assert!(gated.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);

        // Its own waker fires: the task is woken and the next poll reaches it.
        ready.store(true, Ordering::SeqCst);
        inner_waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task was woken");
        assert!(gated.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gated_timer_still_fires() {
        let started = tokio::time::Instant::now();
        Gated::new(tokio::time::sleep(std::time::Duration::from_secs(5))).await;
        assert!(started.elapsed() >= std::time::Duration::from_secs(5));
    }
}

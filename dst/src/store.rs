//! The simulated lease store: the lease engine's memory store behind the [`LeaseStore`] trait,
//! seen by each gateway through its own view whose calls the simulation can delay, lose (the
//! call carried out, its answer never arriving) or partition away, and stall for everyone.
//! It also records who took the link-owner lease when: the epochs invariant 4 judges by (the
//! configured link-owner lease's, or, when the gateways name the station differently and each
//! has a configured one of its own, the station's own, named after its HELLO identity).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use station_lease::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseKind, LeaseStore, LeaseStoreError, LeaseToken,
    MemoryLeaseStore,
};
use tokio::time::Instant;

use crate::rng::SimRng;
use crate::trace::Trace;

/// Faults of the store as the simulation sets them.
#[derive(Debug, Default, Clone)]
pub struct StoreFaults {
    /// Per gateway: its calls hang until the store's timeout would end them, then fail.
    pub partitioned: Vec<bool>,
    /// Every call waits until then before it is carried out (a stalled or failing-over store).
    pub stalled_until: Option<Instant>,
    /// The chance (per mille) that a call's answer is lost after it was carried out.
    pub lose_answer_per_mille: u32,
    /// The most a call's answer is delayed.
    pub max_delay: Duration,
}

/// A step of the store's clock (an NTP step on the host whose clock it reads): due at `at`,
/// by `by_ms` milliseconds (negative: back).
#[derive(Debug, Clone, Copy)]
pub struct ClockStep {
    pub at: Instant,
    pub by_ms: i64,
}

/// One acquisition of a link-owner lease: who took it, when, under which fence.
#[derive(Debug, Clone)]
pub struct OwnerEpoch {
    pub gateway: usize,
    pub at: Instant,
    pub fence: u64,
}

/// The store every gateway of the lab shares.
pub struct SimStore {
    inner: MemoryLeaseStore,
    faults: Mutex<StoreFaults>,
    epochs: Mutex<Vec<OwnerEpoch>>,
    /// The epochs are the station's own link-owner lease's (`link-owner:station:<identity>`).
    station_lease_epochs: AtomicBool,
    /// The step of its clock still to come, if any.
    clock_step: Mutex<Option<ClockStep>>,
    rng: SimRng,
    trace: Trace,
}

impl SimStore {
    pub fn new(gateways: usize, rng: SimRng, trace: Trace) -> Arc<SimStore> {
        Arc::new(SimStore {
            inner: MemoryLeaseStore::new(),
            faults: Mutex::new(StoreFaults {
                partitioned: vec![false; gateways],
                ..StoreFaults::default()
            }),
            epochs: Mutex::new(Vec::new()),
            station_lease_epochs: AtomicBool::new(false),
            clock_step: Mutex::new(None),
            rng,
            trace,
        })
    }

    /// Gateway `gateway`'s view of the store.
    pub fn view(self: &Arc<Self>, gateway: usize) -> Arc<dyn LeaseStore> {
        Arc::new(StoreView {
            store: self.clone(),
            gateway,
        })
    }

    pub fn set_faults(&self, change: impl FnOnce(&mut StoreFaults)) {
        change(&mut self.faults.lock().unwrap());
    }

    pub fn heal(&self) {
        let mut faults = self.faults.lock().unwrap();
        let gateways = faults.partitioned.len();
        *faults = StoreFaults {
            partitioned: vec![false; gateways],
            ..StoreFaults::default()
        };
    }

    /// Every acquisition of the control lease's link-owner lease, oldest first.
    pub fn owner_epochs(&self) -> Vec<OwnerEpoch> {
        self.epochs.lock().unwrap().clone()
    }

    /// From now on the epochs are the acquisitions of the station's own link-owner lease: the
    /// gateways name the station differently, so each configured link-owner lease has one
    /// holder only, and the lease that keeps the second gateway off the station is the one
    /// named after HELLO's identity.
    pub fn epochs_of_the_station_lease(&self) {
        self.station_lease_epochs.store(true, Ordering::Relaxed);
    }

    /// Whether an acquisition of `name` starts an owner epoch.
    fn starts_an_epoch(&self, name: &str) -> bool {
        let station = name.starts_with("link-owner:station:");
        name.starts_with("link-owner:")
            && !name.ends_with(":released")
            && station == self.station_lease_epochs.load(Ordering::Relaxed)
    }

    /// Draws the seed's step of the store's clock, from a generator of its own (so that the
    /// seed's other draws stay as they were): in one seed in three, once within the faulty
    /// time, forward or back.
    pub fn draw_clock_step(&self, seed: u64, faulty_for: Duration) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x636c_6f63_6b5f_6473);
        if faulty_for < Duration::from_secs(10) || !rng.gen_ratio(1, 3) {
            return;
        }
        let at = rng.gen_range(5_000..faulty_for.as_millis() as u64 - 5_000);
        let size = match rng.gen_range(0..3u32) {
            0 => rng.gen_range(50..1_000),
            1 => rng.gen_range(1_000..5_000),
            _ => rng.gen_range(5_000..15_000),
        };
        let by_ms = if rng.gen_bool(0.5) { size } else { -size };
        *self.clock_step.lock().unwrap() = Some(ClockStep {
            at: self.trace.start() + Duration::from_millis(at),
            by_ms,
        });
    }

    /// The step of the store's clock, once it is due (at the first call after its time).
    fn step_clock_when_due(&self) {
        let mut pending = self.clock_step.lock().unwrap();
        let Some(step) = *pending else {
            return;
        };
        if Instant::now() < step.at {
            return;
        }
        *pending = None;
        drop(pending);
        self.step_clock(step.by_ms);
    }

    /// Steps the store's clock now by `by_ms` milliseconds (negative: back).
    pub fn step_clock(&self, by_ms: i64) {
        self.inner.step_clock(by_ms);
        self.trace.note(format!(
            "fault: the store's clock steps {} by {}.{:03} s",
            if by_ms > 0 { "forward" } else { "back" },
            by_ms.unsigned_abs() / 1000,
            by_ms.unsigned_abs() % 1000
        ));
    }

    /// Waits out the faults before a call of `gateway`: `Err` for a partitioned one.
    async fn before(&self, gateway: usize, what: &str) -> Result<(), LeaseStoreError> {
        self.step_clock_when_due();
        let (partitioned, stalled_until, delay) = {
            let faults = self.faults.lock().unwrap();
            let delay = if faults.max_delay.is_zero() {
                Duration::ZERO
            } else {
                let most = faults.max_delay.as_micros() as u64;
                Duration::from_micros(self.rng.lock().unwrap().gen_range(0..=most))
            };
            (
                faults.partitioned.get(gateway).copied().unwrap_or(false),
                faults.stalled_until,
                delay,
            )
        };
        if partitioned {
            // A partitioned store hangs until the client gives up (the gateway's own timeouts
            // end it earlier where it has them).
            tokio::time::sleep(Duration::from_millis(3_000)).await;
            self.trace
                .note(format!("store: {what} of gw{gateway} lost (partitioned)"));
            return Err(LeaseStoreError::Unavailable(
                "the simulated store is partitioned from this gateway".into(),
            ));
        }
        if let Some(until) = stalled_until {
            tokio::time::sleep_until(until).await;
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }

    /// After a call was carried out: its answer lost, now and then.
    fn answer_lost(&self, gateway: usize, what: &str) -> bool {
        let per_mille = self.faults.lock().unwrap().lose_answer_per_mille;
        let lost = per_mille > 0 && self.rng.lock().unwrap().gen_range(0..1000) < per_mille;
        if lost {
            self.trace.note(format!(
                "store: the answer to {what} of gw{gateway} was lost"
            ));
        }
        lost
    }
}

fn lost() -> LeaseStoreError {
    LeaseStoreError::Unavailable("the simulated store's answer was lost".into())
}

struct StoreView {
    store: Arc<SimStore>,
    gateway: usize,
}

impl LeaseStore for StoreView {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>> {
        Box::pin(async move {
            self.store.before(self.gateway, "acquire").await?;
            let result = self.store.inner.try_acquire_kind(kind, name, request).await;
            if let Ok(Acquisition::Taken(grant)) = &result
                && self.store.starts_an_epoch(name)
            {
                self.store.epochs.lock().unwrap().push(OwnerEpoch {
                    gateway: self.gateway,
                    at: Instant::now(),
                    fence: grant.fence,
                });
                self.store.trace.note(format!(
                    "store: gw{} took {name} (fence {})",
                    self.gateway, grant.fence
                ));
            }
            if self.store.answer_lost(self.gateway, "acquire") {
                return Err(lost());
            }
            result
        })
    }

    fn refresh_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move {
            self.store.before(self.gateway, "refresh").await?;
            let result = self.store.inner.refresh_kind(kind, name, token, ttl).await;
            if self.store.answer_lost(self.gateway, "refresh") {
                return Err(lost());
            }
            result
        })
    }

    fn release_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>> {
        Box::pin(async move {
            self.store.before(self.gateway, "release").await?;
            let result = self.store.inner.release_kind(kind, name, token).await;
            if self.store.answer_lost(self.gateway, "release") {
                return Err(lost());
            }
            result
        })
    }

    fn holders<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move {
            self.store.before(self.gateway, "holders").await?;
            let result = self.store.inner.holders(kind, name).await;
            if self.store.answer_lost(self.gateway, "holders") {
                return Err(lost());
            }
            result
        })
    }
}

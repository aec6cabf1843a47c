//! The lease's own task (the expiry task) and what the shell needs of the store and the station
//! for a lease's end: resuming at start, the store's mark that a safe state is owed, and the
//! safe state's writes with their typed failure.

use std::sync::Arc;

use station_protocol::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::super::LeaseError;
use super::events::{Action, Event, SafeStateError};
use super::read_back::{self, Differs};
use super::state::{LeaseState, SafeStateStep};
use super::{ControlLease, SafeState, lock};
use crate::link::LinkHandle;

impl ControlLease {
    /// Loads the store's live lease, if any (a backend that outlives the process): its holder
    /// goes on. What the station is owed otherwise (a safe state, a lock-delay, an end nobody
    /// recorded, changes in doubt) is read from its ledger when the link meets it
    /// ([`ControlLease::adopt_station`]).
    pub async fn resume(&self) -> Result<(), LeaseError> {
        let _turn = self.transitions.lock().await;
        let asked_at = Instant::now();
        let held = self.store.current(&self.name).await?;
        if let Some(grant) = &held {
            info!(owner = %grant.owner, fence = grant.fence, "control lease resumed from the store");
        }
        self.resumed_live
            .store(held.is_some(), std::sync::atomic::Ordering::Release);
        let actions = self.on(Event::Resumed { held, asked_at }, Instant::now());
        debug_assert!(actions.is_empty(), "resuming asked for {actions:?}");
        // The ledger of the station this control lease served last, read now.
        if let Some(adopted) = self.resume_ledger().await? {
            for action in self.on(adopted, Instant::now()) {
                match action {
                    Action::StoreEnd(lock_delay) => self.store_end(lock_delay).await,
                    Action::Publish(view) => self.publish(view),
                    Action::HandOver => {}
                    other => debug_assert!(false, "resuming asked for {other:?}"),
                }
            }
            self.write_ledger().await;
        }
        self.resumed.send_replace(true);
        self.expiry_changed.notify_one();
        Ok(())
    }

    /// Why the station is not ready while a safe state is owed and not yet confirmed (for
    /// `/readyz` and the status page).
    pub fn safe_state_pending(&self) -> Option<String> {
        match lock(&self.machine).state() {
            LeaseState::Ending(ending) if ending.safe_state_owed => Some(format!(
                "the safe state after {}'s lease is not yet done ({}; {} failed tries{})",
                ending.owner,
                match ending.step {
                    SafeStateStep::Check => "being read back before it is written",
                    SafeStateStep::Write => "being written",
                    SafeStateStep::ReadBack(_) => "being read back",
                    SafeStateStep::SecondReadBackAt(_) =>
                        "read back right, to be read back again after the longest processing",
                },
                ending.tries,
                ending
                    .last_error
                    .as_deref()
                    .map(|why| format!("; last: {why}"))
                    .unwrap_or_default()
            )),
            _ => None,
        }
    }

    /// Why the station is not ready because of the control lease: a lease being ended (its
    /// changes may still be at the station), or a safe state owed and not yet confirmed (for
    /// `/readyz`).
    pub fn not_ready(&self) -> Option<String> {
        if let Some(pending) = self.safe_state_pending() {
            return Some(pending);
        }
        let owner = match lock(&self.machine).state() {
            LeaseState::Held(live) if !live.is_live(Instant::now()) => live.owner.clone(),
            LeaseState::Ending(ending) => ending.owner.clone(),
            _ => return None,
        };
        Some(format!(
            "the control lease is ending: {owner}'s lease has ended and the gateway is finishing it (waiting for its changes to leave the station)"
        ))
    }

    /// The lease's own task: sleeps until the live lease's deadline, a pending safe state's
    /// next try, a change of the station link, or a change of the lease; then drives the
    /// machine (a lease that ran out ends: its changes settle, the safe state, free, the next
    /// in line; a safe state owed is tried again). Returns on `shutdown`, never in the middle
    /// of a transition.
    pub async fn run_expiry(self: Arc<Self>, shutdown: CancellationToken) {
        let mut station = self.safe_state.as_ref().map(|s| s.link.watch_info());
        // The station's changes in doubt, recorded in its ledger as they change.
        let mut doubts = self
            .link
            .as_ref()
            .filter(|_| self.ledger_kept())
            .map(LinkHandle::watch_doubts);
        // Whenever the link may serve the station again after it could not: the line waits
        // for that (no lease is granted while this process does not own the link).
        let mut regained = self
            .custody
            .as_ref()
            .and_then(super::super::link_custody::LinkCustody::regained);
        if let Some(station) = &station {
            let info = station.borrow().clone();
            let baseline = Event::Link {
                connected: info.connected,
                generation: info.generation,
            };
            self.turn().await.feed(baseline).await;
        }
        loop {
            let wake_at = lock(&self.machine).next_wake();
            let due = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let link_changed = async {
                match station.as_mut() {
                    Some(station) => {
                        if station.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            let doubts_changed = async {
                match doubts.as_mut() {
                    Some(doubts) => {
                        if doubts.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            let link_regained = async {
                match regained.as_mut() {
                    Some(regained) => {
                        if regained.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                // In order: a deterministic simulation replays the same choice.
                biased;
                () = shutdown.cancelled() => return,
                () = self.expiry_changed.notified() => continue,
                () = doubts_changed => {
                    let Some(now) = doubts.as_mut().map(|d| d.borrow_and_update().clone()) else {
                        continue;
                    };
                    let _turn = self.turn().await;
                    self.record_doubts(&now, Instant::now()).await;
                    continue;
                }
                () = link_regained => {
                    if let Some(regained) = regained.as_mut() {
                        regained.borrow_and_update();
                    }
                    self.turn().await.hand_over().await;
                    continue;
                }
                () = link_changed => {
                    let Some(station) = station.as_ref() else { continue };
                    let info = station.borrow();
                    Event::Link { connected: info.connected, generation: info.generation }
                }
                () = due => Event::Deadline,
            };
            self.turn().await.feed(event).await;
        }
    }

    /// The safe state's writes as values of their channels' types (the station's channel
    /// table says which).
    fn safe_state_items(safe: &SafeState) -> Result<Vec<(String, Value)>, SafeStateError> {
        let channels = safe.link.info().channels.clone();
        let mut items = Vec::with_capacity(safe.writes.len());
        for write in &safe.writes {
            let Some(channel) = channels.get(&write.channel) else {
                return Err(SafeStateError::NoChannel(write.channel.clone()));
            };
            match Value::parse_as(channel.value_type, &write.value, &channel.options) {
                Ok(value) => items.push((write.channel.clone(), value)),
                Err(why) => {
                    return Err(SafeStateError::BadValue {
                        value: write.value.clone(),
                        channel: write.channel.clone(),
                        why,
                    });
                }
            }
        }
        Ok(items)
    }

    /// Reads the safe state's channels back from the hardware (never the cache) and compares
    /// them with it: the channels that differ.
    pub(super) async fn read_back_safe_state(&self) -> Result<Vec<Differs>, SafeStateError> {
        let Some(safe) = &self.safe_state else {
            return Ok(Vec::new());
        };
        let wanted = Self::safe_state_items(safe)?;
        let names = wanted.iter().map(|(name, _)| name.clone()).collect();
        let read = safe.link.read(names).await.map_err(SafeStateError::Link)?;
        read_back::compare(&wanted, read, safe.tolerance).map_err(SafeStateError::ReadBack)
    }

    /// Writes the safe state through the link; `Ok` only when the station confirmed every
    /// write.
    pub(super) async fn apply_safe_state(&self, after: &str) -> Result<(), SafeStateError> {
        let Some(safe) = &self.safe_state else {
            return Ok(());
        };
        let items = Self::safe_state_items(safe)?;
        let names: Vec<String> = items.iter().map(|(name, _)| name.clone()).collect();
        let results = safe
            .link
            .write(items, None)
            .await
            .map_err(SafeStateError::Link)?;
        let mut refused = Vec::new();
        for (name, result) in names.into_iter().zip(results) {
            match result {
                Ok(()) => warn!(
                    channel = %name,
                    "safe state applied to {name} after {after}'s lease ran out"
                ),
                Err(why) => refused.push((name, why.message)),
            }
        }
        match refused.is_empty() {
            true => Ok(()),
            false => Err(SafeStateError::Refused(refused)),
        }
    }
}

//! The end of a control lease: the expiry task, the safe state owed after a lease that ran
//! out (a duty retried until the station confirms it, kept across restarts in the store), and
//! finishing the end (free, the event, the next in line).

use std::sync::Arc;

use station_protocol::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::super::notice::LeaseNotice;
use super::super::store::AcquireRequest;
use super::super::{LeaseError, LeaseView};
use super::state::{EndingLease, LeaseState, LiveLease};
use super::{
    ControlLease, SAFE_STATE_FIRST_BACKOFF, SAFE_STATE_MAX_BACKOFF, SAFE_STATE_OWED_TTL,
    SafeStateRetry, lock,
};

impl ControlLease {
    /// The store's name for "a safe state is owed for this lease".
    pub(super) fn owed_name(&self) -> String {
        format!("{}:safe-state-owed", self.name)
    }

    /// Whether a lease that runs out leaves a safe state to apply.
    pub(super) fn has_safe_state(&self) -> bool {
        self.safe_state
            .as_ref()
            .is_some_and(|s| !s.writes.is_empty())
    }

    /// Loads the store's live lease, if any (a backend that outlives the process), and a safe
    /// state still owed for a lease that lapsed while the gateway was down.
    pub async fn resume(&self) -> Result<(), LeaseError> {
        let _transition = self.transitions.lock().await;
        let asked_at = Instant::now();
        if let Some(grant) = self.store.current(&self.name).await? {
            info!(owner = %grant.owner, fence = grant.fence, "control lease resumed from the store");
            *lock(&self.state) = LeaseState::Held(LiveLease::from_grant(grant, asked_at));
            self.expiry_changed.notify_one();
            return Ok(());
        }
        let Some(owed) = self.store.current(&self.owed_name()).await? else {
            return Ok(());
        };
        if !self.has_safe_state() {
            self.store.release(&self.owed_name(), &owed.token).await?;
            return Ok(());
        }
        warn!(
            owner = %owed.owner,
            "{}'s control lease lapsed while the gateway was down: the safe state is applied as soon as the station is reached",
            owed.owner
        );
        *lock(&self.state) = LeaseState::Ending(EndingLease {
            owner: owed.owner,
            fence: 0,
            safe_state_owed: true,
            tries: 0,
            last_error: None,
        });
        self.retry_now();
        Ok(())
    }

    /// Why the station is not ready while a safe state is owed and not yet confirmed (for
    /// `/readyz` and the status page).
    pub fn safe_state_pending(&self) -> Option<String> {
        match &*lock(&self.state) {
            LeaseState::Ending(ending) if ending.safe_state_owed => Some(format!(
                "the safe state after {}'s lease is not yet confirmed by the station ({} tries{})",
                ending.owner,
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
        let now = Instant::now();
        let owner = match &*lock(&self.state) {
            LeaseState::Held(live) if !live.is_live(now) => live.owner.clone(),
            LeaseState::Ending(ending) => ending.owner.clone(),
            _ => return None,
        };
        Some(format!(
            "the control lease is ending: {owner}'s lease has ended and the gateway is finishing it (waiting for its changes to leave the station)"
        ))
    }

    /// The expiry task: sleeps until the live lease's expiry, a pending safe state's next try,
    /// a reconnect of the station, or a change; then ends a lease that ran out (safe state,
    /// event, next in line) and retries a safe state still owed. Returns on `shutdown`.
    pub async fn run_expiry(self: Arc<Self>, shutdown: CancellationToken) {
        let mut station = self.safe_state.as_ref().map(|s| s.link.watch_info());
        let mut generation = station.as_ref().map(|s| s.borrow().generation);
        loop {
            let wake_at = match &*lock(&self.state) {
                LeaseState::Held(live) => Some(live.expires_at),
                LeaseState::Ending(ending) if ending.safe_state_owed => {
                    Some(lock(&self.retry).next_try)
                }
                _ => None,
            };
            let due = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let reconnected = async {
                match station.as_mut() {
                    Some(station) => {
                        if station.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.expiry_changed.notified() => continue,
                () = reconnected => {
                    let now = station.as_ref().map(|s| {
                        let info = s.borrow();
                        (info.connected, info.generation)
                    });
                    if let Some((true, current)) = now
                        && generation != Some(current)
                    {
                        generation = Some(current);
                        self.retry_now();
                    }
                    continue;
                }
                () = due => {}
            }
            let _transition = self.transitions.lock().await;
            self.settle_expiry().await;
            self.retry_safe_state().await;
        }
    }

    /// The next try of a pending safe state is due now, with the back-off reset.
    pub(super) fn retry_now(&self) {
        *lock(&self.retry) = SafeStateRetry {
            next_try: Instant::now(),
            backoff: SAFE_STATE_FIRST_BACKOFF,
        };
        self.expiry_changed.notify_one();
    }

    /// Marks in the store that a safe state is owed should the lease about to be taken lapse.
    pub(super) async fn remember_safe_state_owed(&self, owner: &str) -> Result<(), LeaseError> {
        let owed = self.owed_name();
        if self.store.current(&owed).await?.is_none() {
            let request = AcquireRequest::new(owner.to_owned(), SAFE_STATE_OWED_TTL);
            self.store.try_acquire(&owed, request).await?;
        }
        Ok(())
    }

    /// Clears the store's mark that a safe state is owed.
    pub(super) async fn forget_safe_state_owed(&self) {
        let owed = self.owed_name();
        let cleared = async {
            if let Some(mark) = self.store.current(&owed).await? {
                self.store.release(&owed, &mark.token).await?;
            }
            Ok::<(), super::super::LeaseStoreError>(())
        };
        if let Err(error) = cleared.await {
            warn!("the lease store could not clear its safe-state mark: {error}");
        }
    }

    /// Ends a lease whose time ran out. Caller holds `transitions`.
    pub(super) async fn settle_expiry(&self) {
        let now = Instant::now();
        let owed = self.has_safe_state();
        let ended = {
            let mut state = lock(&self.state);
            match &*state {
                LeaseState::Held(live) if !live.is_live(now) => {
                    let ended = live.clone();
                    *state = LeaseState::Ending(ended.ending(owed));
                    Some(ended)
                }
                _ => None,
            }
        };
        if let Some(ended) = ended {
            // End it in the store too, should the store's clock be a hair behind ours.
            if let Err(error) = self.store.release(&self.name, &ended.token).await {
                warn!("the lease store could not end the lease that ran out: {error}");
            }
            self.after_running_out(ended).await;
        }
    }

    /// A lease that ran out (state already "ending"): the safe state, then the event and the
    /// next in line, in that order, before anyone else may take it. Caller holds `transitions`.
    pub(super) async fn after_running_out(&self, ended: LiveLease) {
        warn!(owner = %ended.owner, fence = ended.fence, "control lease ran out: {} did not renew it in time", ended.owner);
        self.counters.expired.inc();
        self.notify(LeaseNotice::RanOut {
            owner: &ended.owner,
            fence: ended.fence,
        });
        self.settle_changes(Some(ended.fence)).await;
        *lock(&self.retry) = SafeStateRetry {
            next_try: Instant::now(),
            backoff: SAFE_STATE_FIRST_BACKOFF,
        };
        self.retry_safe_state().await;
    }

    /// Tries the safe state when one is owed and its try is due; on confirmation, finishes the
    /// lease's end. Caller holds `transitions`.
    pub(super) async fn retry_safe_state(&self) {
        let (owner, fence) = match &*lock(&self.state) {
            LeaseState::Ending(ending) if ending.safe_state_owed => {
                (ending.owner.clone(), ending.fence)
            }
            LeaseState::Ending(_) => (String::new(), 0),
            _ => return,
        };
        if owner.is_empty() {
            // Nothing owed (no safe state configured): the end is finished at once.
            self.finish_ending().await;
            return;
        }
        if lock(&self.retry).next_try > Instant::now() {
            return;
        }
        match self.apply_safe_state(&owner).await {
            Ok(()) => {
                self.counters.safe_state_applied.inc();
                self.notify(LeaseNotice::SafeState {
                    owner: &owner,
                    fence,
                    result: Ok(()),
                });
                self.finish_ending().await;
            }
            Err(why) => {
                self.counters.safe_state_failed.inc();
                self.notify(LeaseNotice::SafeState {
                    owner: &owner,
                    fence,
                    result: Err(&why),
                });
                let (tries, view) = {
                    let mut state = lock(&self.state);
                    let LeaseState::Ending(ending) = &mut *state else {
                        return;
                    };
                    ending.tries += 1;
                    ending.last_error = Some(why.clone());
                    (ending.tries, ending.view())
                };
                let wait = {
                    let mut retry = lock(&self.retry);
                    let wait = retry.backoff;
                    retry.next_try = Instant::now() + wait;
                    retry.backoff = (wait * 2).min(SAFE_STATE_MAX_BACKOFF);
                    wait
                };
                error!(
                    owner = %owner,
                    fence,
                    tries,
                    "the safe state after {owner}'s lease is not confirmed (try {tries}): {why}; trying again in {} ms; no change and no new lease until it is",
                    wait.as_millis()
                );
                self.publish(view);
            }
        }
    }

    /// The end of a lease is finished: free, the event, then the next in line. Caller holds
    /// `transitions`.
    pub(super) async fn finish_ending(&self) {
        if self.has_safe_state() {
            self.forget_safe_state_owed().await;
        }
        *lock(&self.state) = LeaseState::Free;
        self.publish(LeaseView::nobody());
        self.hand_over().await;
    }

    /// Writes the safe state through the link; `Ok` only when the station confirmed every
    /// write.
    pub(super) async fn apply_safe_state(&self, after: &str) -> Result<(), String> {
        let Some(safe) = &self.safe_state else {
            return Ok(());
        };
        let channels = safe.link.info().channels.clone();
        let mut items = Vec::with_capacity(safe.writes.len());
        for write in &safe.writes {
            let Some(channel) = channels.get(&write.channel) else {
                return Err(format!(
                    "the station has no channel {} (yet: the link may not have listed its channels)",
                    write.channel
                ));
            };
            match Value::parse_as(channel.value_type, &write.value, &channel.options) {
                Ok(value) => items.push((write.channel.clone(), value)),
                Err(why) => {
                    // A configuration mistake no retry can mend: say so every time.
                    return Err(format!(
                        "bad safe-state value {:?} for {}: {why}",
                        write.value, write.channel
                    ));
                }
            }
        }
        let names: Vec<String> = items.iter().map(|(name, _)| name.clone()).collect();
        let results = safe
            .link
            .write(items, None)
            .await
            .map_err(|why| why.to_string())?;
        let mut refused = Vec::new();
        for (name, result) in names.iter().zip(results) {
            match result {
                Ok(()) => warn!(
                    channel = %name,
                    "safe state applied to {name} after {after}'s lease ran out"
                ),
                Err(why) => refused.push(format!("the station refused {name}: {}", why.message)),
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(refused.join("; "))
        }
    }
}

//! The control lease's side of the station's ledger (`lease/ledger.rs`): the duties this gateway
//! owes the station it serves, kept in the lease store under the station's identity, and taken
//! over from whoever served the station before when the link first meets it
//! ([`ControlLease::adopt_station`]).
//!
//! Kept only where someone else could read it: a lease backend that outlives the process (a
//! restart, a standby, another gateway), or a gateway of several stations (another station of
//! it may serve the same physical station). A station whose ledger is kept grants no lease
//! before its link has met the station and its record was read: until then the gateway does not
//! know what the station is owed.
//!
//! Every write replaces the whole record; only the gateway that owns the station's link writes
//! it, one transition at a time (under the lease's `Turn`).

use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::time::Instant;
use tracing::{info, warn};

use super::super::LeaseStoreError;
use super::super::ledger::{RecordedDelay, RecordedDoubt, StationDuties, record_name};
use super::super::store::{AcquireRequest, Acquisition, LeaseStore};
use super::ControlLease;
use super::events::Event;
use super::state::{LockDelayWhy, StoredEnd, StoredLockDelay};
use crate::link::{ANY_FENCE, Doubt};

/// This gateway's copy of the station's record, and where it is kept.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Whether the record is kept in the store at all.
    pub(super) kept: bool,
    /// The station's identity (from its HELLO) the record is kept under, once the link met it.
    pub(super) station: Option<String>,
    /// The duties as this gateway knows them; written through on every change once `station`
    /// is known.
    pub(super) duties: StationDuties,
    /// The doubts last written, so that a write is made only when they change.
    written_doubts: Vec<(u64, Instant)>,
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(PoisonError::into_inner)
}

impl From<&StoredLockDelay> for RecordedDelay {
    fn from(delay: &StoredLockDelay) -> RecordedDelay {
        RecordedDelay {
            after: delay.after.clone(),
            fence: delay.fence,
            why: delay.why.code().to_owned(),
            left: delay.left,
        }
    }
}

impl From<&RecordedDelay> for StoredLockDelay {
    fn from(delay: &RecordedDelay) -> StoredLockDelay {
        StoredLockDelay {
            after: delay.after.clone(),
            fence: delay.fence,
            why: LockDelayWhy::from_code(&delay.why),
            left: delay.left,
        }
    }
}

/// What the station's record says this gateway must take over, in the machine's words.
struct Inheritance {
    owed_after: Option<String>,
    end: StoredEnd,
    doubts: Vec<Doubt>,
    /// What the record says of this gateway's own lease resumed live (its end pending, its
    /// safe state owed should it end unseen): kept in the copy, for this gateway to record.
    copy_end_pending: Option<String>,
    copy_owed: Option<String>,
}

impl ControlLease {
    /// Keeps the ledger of what the station is owed in the lease store, and grants no lease
    /// until the link has met the station and its record was read.
    pub fn with_station_ledger(mut self) -> Self {
        self.ledger
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .kept = true;
        self.reset_machine();
        self
    }

    pub(super) fn ledger_kept(&self) -> bool {
        lock(&self.ledger).kept
    }

    /// The identity of the station whose ledger this gateway keeps, once its link met it.
    pub fn station_served(&self) -> Option<String> {
        lock(&self.ledger).station.clone()
    }

    /// The link met the station that says `identity` in its HELLO, before it sends it anything
    /// else: the station's record is read and what it owes is taken over — the safe state, the
    /// lock-delay, an end nobody recorded, the changes still in doubt, whoever recorded them
    /// (this gateway before a restart, a standby's owner, a gateway that named the station
    /// otherwise). A lease of another control lease still live in the store is ended there:
    /// it can only be served under its own name, and its gateway no longer serves the station.
    /// Then this gateway's own duties are written under the station's identity, and leases may
    /// be granted. `Err` (the store could not say) leaves the station unserved; the link asks
    /// again.
    pub async fn adopt_station(self: &std::sync::Arc<Self>, identity: &str) -> Result<(), String> {
        if !self.ledger_kept() {
            return Ok(());
        }
        // A standby resumes the control lease once it owns the link; the record is read after.
        let mut resumed = self.resumed.subscribe();
        let _ = resumed.wait_for(|resumed| *resumed).await;
        let mut turn = self.turn().await;
        let key = super::super::ledger::identity_key(identity);
        let previous = lock(&self.ledger).station.clone();
        if previous.as_deref() == Some(key.as_str()) && !self.served_elsewhere(identity).await? {
            return Ok(());
        }
        if let Some(previous) = previous.filter(|previous| *previous != key) {
            warn!(
                "the link met the station {identity}, not the station {previous} it served before: what {previous} is owed stays in its record; this gateway now serves {identity}"
            );
            self.write_ledger().await;
        }
        let inheritance = self
            .read_inheritance(identity, true)
            .await
            .map_err(|why| {
                format!(
                    "the lease backend could not say what the station {identity} is owed: {why}"
                )
            })?
            .ok_or_else(|| format!("the station {identity}'s ledger could not be taken over"))?;
        let event = self.take_over(key, inheritance).await;
        turn.feed(event).await;
        // What this gateway owes the station now, under the station's identity, and which
        // station that is, for a restart.
        self.write_ledger().await;
        self.write_station_served(identity).await;
        info!("the station {identity}'s ledger of duties is read: this gateway serves it");
        Ok(())
    }

    /// Whether the station `identity`'s record was written by another control lease since this
    /// gateway last read it: a gateway naming the station otherwise served it meanwhile, and
    /// what it left (a lease live, a safe state owed, its doubts) is this gateway's to take over.
    async fn served_elsewhere(&self, identity: &str) -> Result<bool, String> {
        let record = self
            .store
            .current(&record_name(identity))
            .await
            .map_err(|why| {
                format!(
                    "the lease backend could not say what the station {identity} is owed: {why}"
                )
            })?;
        Ok(record.is_some_and(|record| {
            StationDuties::decode(&record.owner, record.expires_in)
                .map_or(true, |duties| duties.lease != self.name)
        }))
    }

    /// At start, before the link met the station: the station this control lease served last
    /// (its identity, kept beside the lease as `<name>:station`), if any, and only when that
    /// station's ledger was written under this control lease, is taken to be served again and
    /// its ledger read now, so that a restart honours a lock-delay or a safe state from its
    /// first request. The link's first HELLO confirms it (or, meeting another station, reads
    /// that one's ledger). A record another control lease wrote since waits for the HELLO:
    /// only the gateway that owns the station may end that lease.
    pub(super) async fn resume_ledger(&self) -> Result<Option<Event>, LeaseStoreError> {
        if !self.ledger_kept() {
            return Ok(None);
        }
        let Some(served) = self.store.current(&self.station_served_name()).await? else {
            return Ok(None);
        };
        let identity = served.owner;
        let Some(inheritance) = self.read_inheritance(&identity, false).await? else {
            return Ok(None);
        };
        let key = super::super::ledger::identity_key(&identity);
        Ok(Some(self.take_over(key, inheritance).await))
    }

    /// Keeps what `inheritance` says in this gateway's copy of the ledger of the station `key`,
    /// hands its doubts to the link, and says what the machine takes over.
    async fn take_over(&self, key: String, inheritance: Inheritance) -> Event {
        {
            let mut ledger = lock(&self.ledger);
            ledger.station = Some(key);
            ledger.written_doubts.clear();
            if let Some(owner) = &inheritance.copy_end_pending {
                ledger.duties.end_pending = Some(owner.clone());
            }
            if let Some(owner) = inheritance
                .copy_owed
                .as_ref()
                .or(inheritance.owed_after.as_ref())
            {
                ledger.duties.safe_state_owed = Some(owner.clone());
            }
        }
        if let Some(link) = &self.link {
            link.inherit_doubts(inheritance.doubts).await;
        }
        Event::Adopted {
            owed_after: inheritance.owed_after,
            end: inheritance.end,
        }
    }

    /// The name beside the control lease that keeps the identity of the station it serves.
    fn station_served_name(&self) -> String {
        format!("{}:station", self.name)
    }

    /// Keeps `identity` as the station this control lease serves (for a restart).
    async fn write_station_served(&self, identity: &str) {
        let name = self.station_served_name();
        let written = put_record(self.store.as_ref(), &name, Some(identity.to_owned()));
        if let Err(why) = written.await {
            warn!(
                "the lease backend could not keep which station {} serves: {why}; a restart reads its ledger once the link meets it",
                self.name
            );
        }
    }

    /// Reads the station's record and says what this gateway takes over from it: everything,
    /// when another control lease recorded it (its live lease, if any, is ended in the store);
    /// when this one did, what the machine does not know already (the end, safe state and
    /// lock-delay of a lease that ended while this process did not run; nothing of them when it
    /// resumed that lease live), and the doubts either way.
    /// With `end_foreign` false, a record another control lease wrote is not taken over
    /// (`None`): only the gateway that owns the station may end that lease.
    async fn read_inheritance(
        &self,
        identity: &str,
        end_foreign: bool,
    ) -> Result<Option<Inheritance>, LeaseStoreError> {
        let name = record_name(identity);
        let now = Instant::now();
        let record = self.store.current(&name).await?;
        let duties = match &record {
            None => StationDuties::none(self.name.clone()),
            Some(record) => match StationDuties::decode(&record.owner, record.expires_in) {
                Ok(duties) => duties,
                Err(why) => {
                    warn!("{why}: the next lease waits the whole lock-delay");
                    StationDuties {
                        end_pending: Some("an unknown holder".into()),
                        ..StationDuties::none(String::new())
                    }
                }
            },
        };
        let foreign = duties.lease != self.name;
        if foreign && record.is_some() && !end_foreign {
            return Ok(None);
        }
        if foreign && record.is_some() {
            warn!(
                lease = %duties.lease,
                "the station {identity} was served under another control lease ({}); this gateway takes over what it is owed",
                duties.lease
            );
            self.end_foreign_lease(&duties.lease).await?;
        }
        let doubts = duties
            .doubts
            .iter()
            .map(|doubt| Doubt {
                // Another control lease's fences are not this one's.
                fence: if foreign { ANY_FENCE } else { doubt.fence },
                until: now + doubt.left,
            })
            .collect();
        // A lease of this control lease resumed live: its end is this gateway's to record.
        let own_live = !foreign && self.resumed_live.load(std::sync::atomic::Ordering::Acquire);
        Ok(Some(match own_live {
            true => Inheritance {
                owed_after: None,
                end: StoredEnd::default(),
                doubts,
                copy_end_pending: duties.end_pending.clone(),
                copy_owed: duties.safe_state_owed.clone(),
            },
            false => Inheritance {
                owed_after: duties.safe_state_owed.clone(),
                end: StoredEnd {
                    lock_delay: duties.lock_delay.as_ref().map(StoredLockDelay::from),
                    end_pending: duties.end_pending.clone(),
                },
                doubts,
                copy_end_pending: None,
                copy_owed: None,
            },
        }))
    }

    /// Ends a lease of the control lease `other` still live in the store: the gateway that
    /// served the station under that name no longer does, and no gateway may serve it under
    /// two names. Its end is taken over as one nobody recorded (safe state, lock-delay).
    async fn end_foreign_lease(&self, other: &str) -> Result<(), LeaseStoreError> {
        if other.is_empty() {
            return Ok(());
        }
        if let Some(live) = self.store.current(other).await? {
            warn!(
                lease = other,
                owner = %live.owner,
                "{}'s lease of {other} ends here: the station is served under {} now; its safe state and lock-delay are applied as after any lease whose end nobody recorded",
                live.owner,
                self.name
            );
            self.store.release(other, &live.token).await?;
        }
        Ok(())
    }

    /// Writes this gateway's duties under the station's identity (removing the record when
    /// nothing is owed); before the link met the station, or where the ledger is not kept,
    /// nothing is written (the copy is written once the station is known). A failure is logged:
    /// the record then says less than is owed, and the lock-delay of an end nobody recorded
    /// covers a restart.
    pub(super) async fn write_ledger(&self) {
        if let Err(why) = self.try_write_ledger().await {
            warn!("the lease backend could not record what the station is owed: {why}");
        }
    }

    async fn try_write_ledger(&self) -> Result<(), LeaseStoreError> {
        let (name, text) = {
            let mut ledger = lock(&self.ledger);
            let Some(station) = ledger.station.clone().filter(|_| ledger.kept) else {
                return Ok(());
            };
            ledger.duties.lease = self.name.clone();
            let text = ledger
                .duties
                .owes_anything()
                .then(|| ledger.duties.encode());
            (record_name(&station), text)
        };
        put_record(self.store.as_ref(), &name, text).await
    }

    /// Before a lease is taken for `owner`: should the gateway stop (or another take the
    /// station over) before its end is recorded, the record says its end is pending
    /// (`end_pending`) and that a safe state is owed after it (`owed`). Written before the
    /// store is asked for the lease.
    pub(super) async fn mark_taking(
        &self,
        owner: &str,
        owed: bool,
        end_pending: bool,
    ) -> Result<(), LeaseStoreError> {
        {
            let mut ledger = lock(&self.ledger);
            if owed && ledger.duties.safe_state_owed.is_none() {
                ledger.duties.safe_state_owed = Some(owner.to_owned());
            }
            if end_pending {
                ledger.duties.end_pending = Some(owner.to_owned());
            }
        }
        if owed || end_pending {
            self.try_write_ledger().await?;
        }
        Ok(())
    }

    /// The safe state owed is done (or none is owed any more): the record says so.
    pub(super) async fn forget_safe_state_owed(&self) {
        lock(&self.ledger).duties.safe_state_owed = None;
        self.write_ledger().await;
    }

    /// Records a lease's end: the lock-delay it owes (unless one that lasts at least as long
    /// is recorded), and that no end is pending any more.
    pub(super) async fn store_end(&self, lock_delay: Option<StoredLockDelay>) {
        {
            let mut ledger = lock(&self.ledger);
            if let Some(delay) = lock_delay {
                let longer = ledger
                    .duties
                    .lock_delay
                    .as_ref()
                    .is_none_or(|recorded| recorded.left < delay.left);
                if longer {
                    ledger.duties.lock_delay = Some(RecordedDelay::from(&delay));
                }
            }
            ledger.duties.end_pending = None;
        }
        self.write_ledger().await;
    }

    /// This gateway's run before took its leases back after a crash: whatever it had at the
    /// station when it died (a change sent and not yet answered leaves no record) may still
    /// land until the longest the station may take, `max_processing` from now. Every settle
    /// waits for that, so neither the next grant nor the end of the lease it resumed comes
    /// before it.
    pub async fn after_a_crash(&self, max_processing: std::time::Duration) {
        // Hole put back (reintroduce-holes only): a crash restart forgets its changes in doubt.
        if crate::holes::active("crash-doubt-forgotten") {
            return;
        }
        warn!(
            "this gateway took its link back after a crash: whatever the crashed run had at the station counts as in doubt for another {} ms (station.max_processing_ms)",
            max_processing.as_millis()
        );
        if let Some(link) = &self.link {
            let until = Instant::now() + max_processing;
            link.inherit_doubts(vec![Doubt {
                fence: ANY_FENCE,
                until,
            }])
            .await;
        }
    }

    /// At a clean stop, once the link has stopped: what was still at the station goes into
    /// the ledger, so that whoever serves the station next waits for it. Only while this
    /// process still owns the station's link (`owned`); bounded by `limit`.
    pub async fn flush_ledger(
        self: &std::sync::Arc<Self>,
        owned: bool,
        limit: std::time::Duration,
    ) {
        if !owned || !self.ledger_kept() {
            return;
        }
        // Hole put back (reintroduce-holes only): a clean stop forgets what is still at the
        // station.
        if crate::holes::active("clean-stop-doubt-forgotten") {
            return;
        }
        let Some(doubts) = self
            .link
            .as_ref()
            .map(|link| link.watch_doubts().borrow().clone())
        else {
            return;
        };
        let flushed = async {
            let _turn = self.turn().await;
            self.record_doubts(&doubts, Instant::now()).await;
        };
        if tokio::time::timeout(limit, flushed).await.is_err() {
            warn!(
                "the station's ledger was not written before the gateway stopped: the next gateway waits for what it finds"
            );
        }
    }

    /// The station's changes in doubt changed (`doubts`, at `now`): the record keeps them.
    pub(super) async fn record_doubts(&self, doubts: &[Doubt], now: Instant) {
        let changed = {
            let mut ledger = lock(&self.ledger);
            let mut seen: Vec<(u64, Instant)> = doubts.iter().map(|d| (d.fence, d.until)).collect();
            seen.sort();
            if !ledger.kept || seen == ledger.written_doubts {
                false
            } else {
                ledger.duties.doubts = doubts
                    .iter()
                    .map(|doubt| RecordedDoubt {
                        fence: doubt.fence,
                        left: doubt.until.saturating_duration_since(now),
                    })
                    .filter(|doubt| !doubt.left.is_zero())
                    .collect();
                ledger.written_doubts = seen;
                true
            }
        };
        if changed {
            self.write_ledger().await;
        }
    }
}

/// Puts `text` in the store as the owner text of the record `name`, in one write (an acquire
/// with the current record's token rewrites it in place), or removes the record (`None`). A
/// crash at any moment leaves the old record or the new one, never none.
async fn put_record(
    store: &dyn LeaseStore,
    name: &str,
    text: Option<String>,
) -> Result<(), LeaseStoreError> {
    let current = store.current(name).await?;
    let Some(text) = text else {
        if let Some(old) = current {
            store.release(name, &old.token).await?;
        }
        return Ok(());
    };
    let mut request = AcquireRequest::new(text, super::super::ledger::RECORD_TTL);
    if let Some(old) = current {
        request = request.with_retry_token(old.token);
    }
    match store.try_acquire(name, request).await? {
        Acquisition::HeldByOther(_) => Err(LeaseStoreError::Backend(format!(
            "{name} was written by another writer meanwhile"
        ))),
        Acquisition::Taken(_) | Acquisition::Renewed(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_recorded_delay_reads_back_as_the_machines() {
        let delay = StoredLockDelay {
            after: "A".into(),
            fence: 4,
            why: LockDelayWhy::LeaselessDoubt,
            left: Duration::from_millis(1200),
        };
        assert_eq!(StoredLockDelay::from(&RecordedDelay::from(&delay)), delay);
    }
}

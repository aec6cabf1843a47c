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
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

use super::super::LeaseStoreError;
use super::super::ledger::{RecordedDelay, RecordedDoubt, StationDuties, record_name};
use super::super::store::{AcquireRequest, Acquisition, LeaseStore};
use super::ControlLease;
use super::events::Event;
use super::machine::LEASELESS_CHANGE;
use super::state::{LockDelayWhy, StoredEnd, StoredLockDelay};
use crate::link::{ANY_FENCE, AtStation, Doubt, FREE_FENCE, Lapse};

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
    /// When the recorded lock-delay ends: every write keeps what is left of it then, not what
    /// was left when it was set.
    delay_until: Option<Instant>,
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
            StationDuties::decode(&record.owner).map_or(true, |duties| duties.lease != self.name)
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
            Some(record) => match StationDuties::decode(&record.owner) {
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
        let mut doubts: Vec<Doubt> = duties
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
        if own_live && let Some(delay) = &duties.lock_delay {
            // The machine goes on with the live lease and takes no lock-delay from the record;
            // one still running there followed a doubt that lapsed under it (or before it) and
            // no settle took yet. Handed to the link as a doubt whose bound has passed, it
            // lapses at once, at that bound: the settle at the lease's end (or the next
            // grant's) takes it, and the lock-delay ends when the record says.
            let lapsed_at = (now + delay.left)
                .checked_sub(self.timing.lock_delay)
                .unwrap_or(now);
            doubts.push(Doubt {
                fence: delay.fence,
                until: lapsed_at,
            });
        }
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
            ledger.refresh_delay(Instant::now());
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
                ledger.keep_delay(RecordedDelay::from(&delay), Instant::now());
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
    pub async fn after_a_crash(&self, max_processing: Duration) {
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
    pub async fn flush_ledger(self: &std::sync::Arc<Self>, owned: bool, limit: Duration) {
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

    /// The station's changes in doubt or its lapses changed (`at_station`, at `now`): the
    /// record keeps the doubts, and the lock-delay that runs from the latest lapse.
    pub(super) async fn record_doubts(&self, at_station: &AtStation, now: Instant) {
        let changed = {
            let mut ledger = lock(&self.ledger);
            ledger.kept && ledger.note(at_station, self.timing.lock_delay, now)
        };
        if changed {
            self.write_ledger().await;
        }
    }
}

impl Ledger {
    /// Takes `at_station` into the copy at `now`: its doubts, and the lock-delay (`lock_delay`
    /// long) from its latest lapse when that outlasts the one recorded. A doubt that lapsed
    /// delays the next grant from that instant (the machine learns of it only when a settle
    /// takes it): recorded at once, a clean stop, a restart or a handover before that grant
    /// does not lose it. Whether the record must be written again.
    fn note(&mut self, at_station: &AtStation, lock_delay: Duration, now: Instant) -> bool {
        let mut seen: Vec<(u64, Instant)> = at_station
            .doubts
            .iter()
            .map(|d| (d.fence, d.until))
            .collect();
        seen.sort();
        let doubts_changed = seen != self.written_doubts;
        if doubts_changed {
            self.duties.doubts = at_station
                .doubts
                .iter()
                .map(|doubt| RecordedDoubt {
                    fence: doubt.fence,
                    left: doubt.until.saturating_duration_since(now),
                })
                .filter(|doubt| !doubt.left.is_zero())
                .collect();
            self.written_doubts = seen;
        }
        // Hole put back (reintroduce-holes only): a lapse's lock-delay is not recorded.
        let lapsed = match crate::holes::active("lapse-not-recorded") {
            true => &[][..],
            false => &at_station.lapsed[..],
        };
        let delay = lapsed
            .iter()
            .max_by_key(|lapse| lapse.at)
            .and_then(|lapse| self.lapse_delay(lapse, lock_delay, now));
        let delay_changed = delay.is_some_and(|delay| self.keep_delay(delay, now));
        doubts_changed || delay_changed
    }

    /// Keeps `delay` (its time left counted from `now`) unless the one recorded lasts at least
    /// as long; whether it was kept.
    fn keep_delay(&mut self, delay: RecordedDelay, now: Instant) -> bool {
        let until = now + delay.left;
        let longer = self.delay_until.is_none_or(|recorded| recorded < until);
        if longer {
            self.duties.lock_delay = Some(delay);
            self.delay_until = Some(until);
        }
        longer
    }

    /// The recorded lock-delay with what is left of it at `now`; none once it is over.
    fn refresh_delay(&mut self, now: Instant) {
        let left = self
            .delay_until
            .map(|until| until.saturating_duration_since(now));
        match (left, self.duties.lock_delay.as_mut()) {
            (Some(left), Some(delay)) if !left.is_zero() => delay.left = left,
            _ => {
                self.duties.lock_delay = None;
                self.delay_until = None;
            }
        }
    }

    /// The lock-delay after `lapse` as the record keeps it, if any of it is left at `now`:
    /// after a change made without a lease (or one a gateway before this one left), or after
    /// the holder of the lease it was made under.
    fn lapse_delay(
        &self,
        lapse: &Lapse,
        lock_delay: Duration,
        now: Instant,
    ) -> Option<RecordedDelay> {
        let left = (lapse.at + lock_delay).saturating_duration_since(now);
        if left.is_zero() {
            return None;
        }
        let leaseless = lapse.fence == FREE_FENCE || lapse.fence == ANY_FENCE;
        let (after, why) = match (leaseless, &self.duties.end_pending) {
            (true, _) => (LEASELESS_CHANGE.to_owned(), LockDelayWhy::LeaselessDoubt),
            (false, Some(holder)) => (holder.clone(), LockDelayWhy::ChangesInDoubt),
            (false, None) => ("an earlier holder".to_owned(), LockDelayWhy::ChangesInDoubt),
        };
        Some(RecordedDelay {
            after,
            fence: lapse.fence,
            why: why.code().to_owned(),
            left,
        })
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

    /// The latest lapse sets the recorded lock-delay, from the lapse (not from `now`), only
    /// when it outlasts the one recorded; a lapse whose lock-delay is over records nothing.
    #[test]
    fn the_latest_lapse_records_its_lock_delay_when_it_outlasts_the_recorded_one() {
        let t0 = Instant::now();
        let lock_delay = Duration::from_millis(1500);
        let mut ledger = Ledger::default();
        let lapses = |lapsed: Vec<Lapse>| AtStation {
            doubts: Vec::new(),
            lapsed,
        };
        let lapse = |fence, ms| Lapse {
            fence,
            at: t0 + Duration::from_millis(ms),
        };
        let now = t0 + Duration::from_millis(1000);
        assert!(!ledger.note(
            &lapses(vec![lapse(0, 400)]),
            lock_delay,
            t0 + Duration::from_secs(2)
        ));
        assert_eq!(ledger.duties.lock_delay, None, "its lock-delay is over");
        assert!(ledger.note(&lapses(vec![lapse(3, 900), lapse(0, 800)]), lock_delay, now));
        let recorded = ledger.duties.lock_delay.clone().unwrap();
        assert_eq!(
            (recorded.fence, recorded.why.as_str(), recorded.left),
            (3, "changes-in-doubt", Duration::from_millis(1400))
        );
        assert_eq!(recorded.after, "an earlier holder");
        assert!(
            !ledger.note(&lapses(vec![lapse(FREE_FENCE, 850)]), lock_delay, now),
            "a shorter one is not recorded"
        );
        ledger.duties.end_pending = Some("A".into());
        assert!(ledger.note(&lapses(vec![lapse(ANY_FENCE, 950)]), lock_delay, now));
        let recorded = ledger.duties.lock_delay.clone().unwrap();
        assert_eq!(
            (recorded.after.as_str(), recorded.why.as_str()),
            (LEASELESS_CHANGE, "leaseless-doubt")
        );
        ledger.refresh_delay(now + Duration::from_millis(1000));
        assert_eq!(
            ledger.duties.lock_delay.as_ref().map(|delay| delay.left),
            Some(Duration::from_millis(450)),
            "a later write keeps what is left of it"
        );
        ledger.refresh_delay(now + Duration::from_millis(1450));
        assert_eq!(ledger.duties.lock_delay, None, "over: no longer recorded");
    }
}

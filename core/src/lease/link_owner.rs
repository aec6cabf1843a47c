//! One gateway per station: the link-owner lease (`link-owner:<control lease name>`) in a
//! shared lease backend. A gateway takes it at start and keeps it renewed while it runs; a
//! second gateway on the same station and backend finds it held and refuses to start, because
//! two gateways would each admit changes under their own view of the control lease. After
//! HELLO every gateway also claims the station's own lease, named after the identity the
//! station gives ([`identity_key`]) whatever address or `station.id` names it: a second
//! gateway that names the station otherwise finds that one held and sends it nothing past
//! HELLO. A gateway that loses either (it could not renew it in time) stops, rather than go on
//! touching a station another gateway may now own.
//!
//! By default both leases are renewed every TTL/3 (each renewal given TTL/3 by the store), and
//! the link's `OwnerGate` lets frames out only until TTL − TTL/5 after the last confirmed
//! renewal was sent.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::ledger::Adopter;
use super::owner_state::{OwnerState, OwnerStateError};
use super::seconds_left;
use super::store::{
    AcquireRequest, Acquisition, LeaseHolder, LeaseStore, LeaseStoreError, LeaseToken,
};
use crate::link::OwnerGate;

/// How long the link-owner lease lives without renewal, by default.
pub const LINK_OWNER_TTL: Duration = Duration::from_secs(10);
/// How long after another's lease should have lapsed in the store it is asked for again (the
/// store's clock may lag this host's a little).
pub(crate) const RETRY_AFTER_LAPSE: Duration = Duration::from_millis(20);
/// How long the note of a clean release is kept: a gateway started later than that after a
/// clean stop waits the lock-delay (harmless after so long).
const RELEASE_NOTE_TTL: Duration = Duration::from_secs(3600);

pub use crate::config::identity_key;
pub use crate::config::link_owner_timing::{
    LinkOwnerTiming, RETRY_AFTER_FAILURE, TimingKeys, TimingRuleBroken,
};

/// Why the gateway may not own the station's link.
#[derive(Debug, thiserror::Error)]
pub enum LinkOwnerError {
    #[error(
        "another gateway owns this station through the lease backend: {owner} holds {name} for another {}; only one gateway may serve a station (stop the other one, or point this one at another station or backend)",
        seconds_left(*.expires_in)
    )]
    OwnedByOther {
        name: String,
        owner: String,
        expires_in: Duration,
    },
    #[error("the lease backend could not say who owns this station's link: {0}")]
    Store(#[from] LeaseStoreError),
    #[error(
        "the lease backend did not say within {} ms who owns this station's link",
        .0.as_millis()
    )]
    Timeout(Duration),
    #[error(transparent)]
    State(#[from] OwnerStateError),
}

/// This gateway's hold on the station's link: the lease in the store, and the gate the link
/// checks before every frame it writes.
pub struct LinkOwnership {
    store: Arc<dyn LeaseStore>,
    name: String,
    token: LeaseToken,
    timing: LinkOwnerTiming,
    gate: Arc<OwnerGate>,
    /// The locked state file keeping the token for a restart, if configured: held (and so
    /// locked) for as long as this gateway owns the link.
    state: Option<OwnerState>,
    /// Who this gateway is, as other gateways see it.
    owner: String,
    /// The station's own link-owner lease (`link-owner:station:<identity>`), once the link
    /// met the station: its identity, token and fence.
    station: Option<(String, LeaseToken, u64)>,
    /// The lock-delay after taking the station's lease when it had lapsed: the link is told
    /// to stand by until then.
    station_held_back_until: Option<Instant>,
    /// Whether this gateway found the station's lease held by another since it started.
    station_seen_held: bool,
    /// Whether this gateway waited the lock-delay for its link-owner lease (taken over when it
    /// had lapsed).
    waited_lock_delay: bool,
    /// When the station's lease was refused: how long its holder still has it (the next try
    /// comes then, not a whole renewal interval later).
    station_retry_in: Option<Duration>,
    /// `station.id`: the station's identity as configured (it names the control lease); only
    /// compared with HELLO's here, which names the station's own lease whatever it says.
    station_id: Option<String>,
    /// The fence this gateway took the lease with.
    fence: u64,
    /// What takes the station's ledger over once the station's lease is claimed, before the
    /// link may serve it.
    adopt: Option<Adopter>,
    /// Whether it was its own lease from before a restart (taken back with the state file).
    taken_back: bool,
    /// Whether the state file named a token of an earlier run of this gateway for this lease.
    kept_token: bool,
    /// When the last confirmed renewal (or the claim) was sent.
    confirmed_sent_at: Instant,
    /// The lock-delay after taking over a lapsed lease: the gate stays closed until then,
    /// while the lease is renewed.
    held_back_until: Option<Instant>,
}

impl LinkOwnership {
    /// The name of the link-owner lease for the control lease `control_name`.
    pub fn name_for(control_name: &str) -> String {
        format!("link-owner:{control_name}")
    }

    /// Takes the link-owner lease for `control_name` as `owner`, or says who holds it.
    /// With `state`, the token a crashed run of this gateway kept takes its own lease back at
    /// once (same lease, same fence), and the new token is kept for the next run.
    pub async fn claim(
        store: Arc<dyn LeaseStore>,
        control_name: &str,
        owner: String,
        timing: LinkOwnerTiming,
        mut state: Option<OwnerState>,
    ) -> Result<LinkOwnership, LinkOwnerError> {
        let gate = Arc::new(OwnerGate::new(Instant::now()));
        let name = Self::name_for(control_name);
        match Self::try_claim(store, &name, owner, timing, &mut state, gate).await? {
            Ok(ownership) => {
                if !ownership.lapsed_before().await {
                    return Ok(ownership.hold_back(Duration::ZERO));
                }
                warn!(
                    %name,
                    lock_delay_ms = timing.lock_delay.as_millis(),
                    "the link-owner lease was found free, but its last owner did not release it (it lapsed: that gateway may be paused, not gone): the link waits the lock-delay before it touches the station"
                );
                Ok(ownership.hold_back(timing.lock_delay))
            }
            Err(holder) => Err(LinkOwnerError::OwnedByOther {
                name,
                owner: holder.owner,
                expires_in: holder.expires_in,
            }),
        }
    }

    /// One try at the link-owner lease `name` for `owner`: `Ok(Ok(_))` owns it, its gate still
    /// closed until [`LinkOwnership::hold_back`] (taking `state` along); `Ok(Err(holder))` says who holds it, and for how long.
    pub async fn try_claim(
        store: Arc<dyn LeaseStore>,
        name: &str,
        owner: String,
        timing: LinkOwnerTiming,
        state: &mut Option<OwnerState>,
        gate: Arc<OwnerGate>,
    ) -> Result<Result<LinkOwnership, LeaseHolder>, LinkOwnerError> {
        let mut request = AcquireRequest::new(owner.clone(), timing.ttl);
        let kept = state.as_ref().and_then(OwnerState::token);
        let kept_token = kept.is_some();
        if let Some(kept) = kept {
            request = request.with_retry_token(kept);
        }
        let asked_at = Instant::now();
        let acquired = tokio::time::timeout(timing.store_timeout, store.try_acquire(name, request))
            .await
            .map_err(|_| LinkOwnerError::Timeout(timing.store_timeout))??;
        let taken_back = matches!(acquired, Acquisition::Renewed(_));
        match acquired {
            Acquisition::Taken(grant) | Acquisition::Renewed(grant) => {
                let how = if taken_back {
                    " (its own lease from before a restart, taken back)"
                } else {
                    ""
                };
                info!(%name, fence = grant.fence, "this gateway owns the station's link{how}");
                if let Some(state) = state.as_mut() {
                    state.remember_link(&grant.token)?;
                }
                // (The gate stays closed until the caller has decided on the lock-delay:
                // `hold_back`.)
                Ok(Ok(LinkOwnership {
                    fence: grant.fence,
                    taken_back,
                    kept_token,
                    confirmed_sent_at: asked_at,
                    held_back_until: None,
                    store,
                    name: name.to_owned(),
                    token: grant.token,
                    timing,
                    gate,
                    state: state.take(),
                    owner,
                    station: None,
                    station_held_back_until: None,
                    station_seen_held: false,
                    waited_lock_delay: false,
                    station_retry_in: None,
                    station_id: None,
                    adopt: None,
                }))
            }
            Acquisition::HeldByOther(holder) => Ok(Err(holder)),
        }
    }

    /// The name of the note a clean stop leaves beside the link-owner lease `name`.
    fn release_note_name(name: &str) -> String {
        format!("{name}:released")
    }

    /// What the note says: the fence of the lease released cleanly.
    fn release_note(fence: u64) -> String {
        format!("released cleanly at fence {fence}")
    }

    /// Whether the lease this gateway just took had lapsed rather than been released by its
    /// last owner: `false` for its own lease taken back, for a name never held before (fence
    /// 1), and when the note of a clean stop names the fence just before this one. A store
    /// that cannot say counts as a lapse (the lock-delay is the safe side).
    pub async fn lapsed_before(&self) -> bool {
        if self.taken_back || self.fence <= 1 {
            return false;
        }
        !self.released_cleanly(&self.name, self.fence).await
    }

    /// Whether the note of a clean stop beside the lease `name` names the fence just before
    /// `fence` (the one this gateway just took it with). A store that cannot say: `false`.
    async fn released_cleanly(&self, name: &str, fence: u64) -> bool {
        let note_name = Self::release_note_name(name);
        let note = self.store.current(&note_name);
        match tokio::time::timeout(self.timing.store_timeout, note).await {
            Ok(Ok(Some(note))) => note.owner == Self::release_note(fence.saturating_sub(1)),
            _ => false,
        }
    }

    /// Leaves the note that this gateway released the lease `name` (taken with `fence`)
    /// cleanly (before releasing it, so that whoever finds the lease free finds the note too).
    async fn note_clean_release(&self, name: &str, fence: u64) -> Result<(), LeaseStoreError> {
        let name = Self::release_note_name(name);
        if let Some(old) = self.store.current(&name).await? {
            self.store.release(&name, &old.token).await?;
        }
        let note = AcquireRequest::new(Self::release_note(fence), RELEASE_NOTE_TTL);
        self.store.try_acquire(&name, note).await?;
        Ok(())
    }

    /// `station.id`, compared with the identity HELLO gives once the link met the station (a
    /// mismatch is logged; the station's own lease is named after HELLO's identity either way,
    /// so that no configuration lets two gateways serve one station).
    pub fn with_station_id(mut self, station_id: Option<String>) -> LinkOwnership {
        self.station_id = station_id;
        self
    }

    /// Once it claimed a station's lease, `adopt` takes the station's ledger over before the
    /// link may serve it.
    pub fn with_adopter(mut self, adopt: Adopter) -> LinkOwnership {
        self.adopt = Some(adopt);
        self
    }

    /// Claims the station `said` (its lease) and takes its ledger over: `Err` says why the
    /// link may not serve it yet. The ledger is read within the store's time bound: a store
    /// slower than that is answered as one that could not say, and the link asks again.
    async fn serve_station(&mut self, said: &str) -> Result<(), String> {
        self.claim_station(said).await?;
        let Some(adopt) = &self.adopt else {
            return Ok(());
        };
        match tokio::time::timeout(self.timing.store_timeout, adopt(said.to_owned())).await {
            Ok(verdict) => verdict,
            Err(_) => Err(format!(
                "the lease backend did not say within {} ms what the station {said} is owed",
                self.timing.store_timeout.as_millis()
            )),
        }
    }

    /// Opens the gate, after the lock-delay `delay` when this gateway took over a lease that
    /// lapsed (its owner may have been paused, not dead): till then its link sends nothing
    /// (not even a HELLO), while the lease is kept. A claim leaves the gate closed until this.
    pub fn hold_back(mut self, delay: Duration) -> LinkOwnership {
        if !delay.is_zero() {
            self.held_back_until = Some(Instant::now() + delay);
            self.waited_lock_delay = true;
        }
        self.open_gate(Instant::now());
        self
    }

    /// Whether the last confirmed renewal still proves the lease is this gateway's at `now`
    /// (what the gate says, lock-delay or not).
    fn still_ours(&self, now: Instant) -> bool {
        now < self.confirmed_sent_at + self.timing.ttl.saturating_sub(self.timing.margin)
    }

    /// Opens the gate for the last confirmed renewal, unless the lock-delay still runs.
    fn open_gate(&mut self, now: Instant) {
        if self.held_back_until.is_some_and(|until| now < until) {
            return;
        }
        if self.held_back_until.take().is_some() {
            info!(name = %self.name, "the lock-delay is over: the link may send");
        }
        self.gate
            .renewed(self.confirmed_sent_at, self.timing.ttl, self.timing.margin);
    }

    /// Whether this gateway took its own link-owner lease back from a run before it that did
    /// not release it (a crash, with the state file): that run may have left changes at the
    /// station.
    pub fn taken_back(&self) -> bool {
        self.taken_back
    }

    /// Whether a run of this gateway before this one may have left changes at the station:
    /// it took its own lease back ([`Self::taken_back`]), or the state file named a token for
    /// this lease that the claim found lapsed, with no note of a clean release (the last run
    /// did not stop cleanly, and its lease lapsed before this restart: a restart later than
    /// the TTL, or the store's clock stepped forward). Either way the next grant waits for
    /// what that run may still have at the station.
    pub async fn after_own_crash(&self) -> bool {
        self.taken_back || (self.kept_token && self.lapsed_before().await)
    }

    /// The gate the link checks before every frame (`LinkTask::with_owner_gate`).
    pub fn gate(&self) -> Arc<OwnerGate> {
        self.gate.clone()
    }

    /// The name of the link-owner lease of the station `identity` (from its HELLO), after
    /// [`identity_key`].
    pub fn station_name_for(identity: &str) -> String {
        format!("link-owner:station:{}", identity_key(identity))
    }

    /// Claims the station's own link-owner lease for the link, which met the station that
    /// says `said` in its HELLO: `Err` names the gateway that owns it. The lease is named after
    /// what HELLO said whatever `station.id` says, so that two gateways reaching one station
    /// never serve it both, however each is configured.
    async fn claim_station(&mut self, said: &str) -> Result<(), String> {
        let identity = identity_key(said);
        if self
            .station
            .as_ref()
            .is_some_and(|(held, ..)| *held == identity)
        {
            return self.station_lock_delay_over(said);
        }
        let name = Self::station_name_for(&identity);
        let mut request = AcquireRequest::new(self.owner.clone(), self.timing.ttl);
        if let Some(kept) = self.state.as_ref().and_then(|s| s.station_token(&identity)) {
            request = request.with_retry_token(kept);
        }
        let asked = self.store.try_acquire(&name, request);
        let acquired = match tokio::time::timeout(self.timing.store_timeout, asked).await {
            Ok(Ok(acquired)) => acquired,
            Ok(Err(why)) => {
                return Err(format!(
                    "the lease backend could not say who owns the station {said}: {why}"
                ));
            }
            Err(_) => {
                return Err(format!(
                    "the lease backend did not say within {} ms who owns the station {said}",
                    self.timing.store_timeout.as_millis()
                ));
            }
        };
        let taken_back = matches!(acquired, Acquisition::Renewed(_));
        match acquired {
            Acquisition::Taken(grant) | Acquisition::Renewed(grant) => {
                let how = if taken_back {
                    " (its own lease from before a restart, taken back)"
                } else {
                    ""
                };
                info!(%name, fence = grant.fence, "this gateway owns the station {said}{how}");
                if let Some(configured) = &self.station_id
                    && identity_key(configured) != identity
                {
                    warn!(
                        "station.id \"{configured}\" is not the identity the station's HELLO gives (\"{said}\"): station.id names the control lease only; the station's own link-owner lease is named after HELLO's identity ({name})"
                    );
                }
                if let Some((old_identity, old, _)) = self.station.take() {
                    let old_name = Self::station_name_for(&old_identity);
                    let _ = self.store.release(&old_name, &old).await;
                }
                if let Some(state) = self.state.as_mut()
                    && let Err(why) = state.remember_station(&identity, &grant.token)
                {
                    warn!("{why}");
                }
                // Found free after another held it, it lapsed or was released. After a lapse
                // its last owner may be paused, not gone: the link waits the lock-delay, as
                // after taking over the link-owner lease. Not again, though, when this gateway
                // already waited it for its link-owner lease and never saw this one held: the
                // station's lease lapsed with the link-owner lease of the same gateway.
                let lapsed = !taken_back
                    && grant.fence > 1
                    && (self.station_seen_held || !self.waited_lock_delay)
                    && !self.released_cleanly(&name, grant.fence).await;
                if lapsed {
                    warn!(
                        %name,
                        lock_delay_ms = self.timing.lock_delay.as_millis(),
                        "the station's link-owner lease was found free, but its last owner did not release it (it lapsed: that gateway may be paused, not gone): the link waits the lock-delay before it serves the station"
                    );
                    self.station_held_back_until = Some(Instant::now() + self.timing.lock_delay);
                }
                self.station = Some((identity, grant.token, grant.fence));
                self.station_lock_delay_over(said)
            }
            Acquisition::HeldByOther(holder) => {
                self.station_seen_held = true;
                self.station_retry_in = Some(holder.expires_in);
                Err(format!(
                    "another gateway owns the station {said}: {} holds {name} for another {}; only one gateway may serve a station, whatever address, station.id or lease.name each reaches it by (this one sends it nothing, and serves it once that lease lapses: stop the other gateway, or run this one as its standby)",
                    holder.owner,
                    seconds_left(holder.expires_in)
                ))
            }
        }
    }

    /// Whether the link may serve the station `said` whose lease this gateway holds: `Err`
    /// while the lock-delay after taking it lapsed still runs (the next try comes when it ends).
    fn station_lock_delay_over(&mut self, said: &str) -> Result<(), String> {
        let now = Instant::now();
        match self.station_held_back_until {
            Some(until) if now < until => {
                self.station_retry_in = Some(until - now);
                Err(format!(
                    "this gateway took the station {said}'s link-owner lease after it lapsed (the gateway that held it may be paused, not gone): it waits the lock-delay, another {} ms, before it sends the station anything",
                    (until - now).as_millis()
                ))
            }
            Some(_) => {
                self.station_held_back_until = None;
                info!("the lock-delay on the station {said} is over: the link may serve it");
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Renews the link-owner lease and the station's own: `Ok(true)` when both were confirmed,
    /// `Ok(false)` when the store says one is no longer this gateway's.
    async fn renew(&self) -> Result<bool, String> {
        let mut held = vec![(self.name.clone(), &self.token)];
        if let Some((identity, token, _)) = &self.station {
            held.push((Self::station_name_for(identity), token));
        }
        for (name, token) in held {
            let renewal = self.store.refresh(&name, token, None);
            match tokio::time::timeout(self.timing.store_timeout, renewal).await {
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => return Ok(false),
                Ok(Err(why)) => return Err(why.to_string()),
                Err(_) => {
                    return Err(format!(
                        "no answer within {} ms",
                        self.timing.store_timeout.as_millis()
                    ));
                }
            }
        }
        Ok(true)
    }

    /// How long until the next renewal: a renewal interval, or less while the link stands by
    /// for a station whose other owner's lease lapses sooner (a failover takes it then).
    fn next_pause(&mut self) -> Duration {
        let every = self.timing.renew_every;
        match self.station_retry_in.take() {
            Some(left) if self.gate.refused_identity().is_some() => {
                every.min(left + RETRY_AFTER_LAPSE)
            }
            _ => every,
        }
    }

    /// Renews the leases until `shutdown`, then releases them. Each confirmed renewal opens
    /// the link's gate until TTL − margin after it was sent; a renewal that fails is tried
    /// again while the gate is open. When the gate closes (lost to another gateway, or the
    /// store unreachable or too slow), the link has already stopped sending: this logs why and
    /// cancels `stop_gateway`. The link asks here, after each HELLO, whether it may serve the
    /// station that answered (its identity's own lease).
    pub async fn keep(mut self, shutdown: CancellationToken, stop_gateway: CancellationToken) {
        let timing = self.timing;
        let mut pause = timing.renew_every;
        let mut identities = self.gate.identities_asked();
        // An identity the link asked for before this task first ran (a standby's link wakes
        // the moment the gate opens) is decided at once, not left to its 5 s limit.
        identities.mark_changed();
        loop {
            tokio::select! {
                // In order: a deterministic simulation replays the same choice.
                biased;
                () = shutdown.cancelled() => break,
                changed = identities.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let asked = identities.borrow_and_update().clone();
                    if let Some(identity) = asked {
                        let verdict = self.serve_station(&identity).await;
                        if let Err(why) = &verdict {
                            warn!("{why}");
                        }
                        self.gate.decide_identity(identity, verdict);
                        pause = self.next_pause();
                    }
                    continue;
                }
                () = sleep_until_opt(self.held_back_until) => {
                    self.open_gate(Instant::now());
                    continue;
                }
                () = tokio::time::sleep(pause) => {}
            }
            // Standing by for a station another gateway owns: try its lease again (the store
            // only; the link does not touch the station meanwhile).
            if let Some(identity) = self.gate.refused_identity() {
                let verdict = self.serve_station(&identity).await;
                if verdict.is_ok() {
                    info!("the station {identity} is free again: this gateway takes it over");
                }
                self.gate.decide_identity(identity, verdict);
            }
            let asked_at = Instant::now();
            match self.renew().await {
                Ok(true) => {
                    self.confirmed_sent_at = asked_at;
                    self.open_gate(Instant::now());
                    pause = self.next_pause();
                }
                Ok(false) => {
                    self.gate.revoke();
                    error!(name = %self.name, "this gateway lost the station's link-owner lease (another gateway may own the station now): it sends the station nothing more, and stops");
                    stop_gateway.cancel();
                    return;
                }
                Err(why) if self.still_ours(Instant::now()) => {
                    warn!(name = %self.name, "could not renew the link-owner lease ({why}); trying again");
                    pause = RETRY_AFTER_FAILURE;
                }
                Err(why) => {
                    error!(name = %self.name, "could not renew the link-owner lease in time ({why}): the link stopped sending when it could no longer prove it owns the station, and the gateway stops, since another gateway may take the station");
                    stop_gateway.cancel();
                    return;
                }
            }
        }
        self.gate.revoke();
        // A lease taken after it lapsed, whose lock-delay still runs, is not released cleanly:
        // what its lapsed owner sent last may still land, so the next owner waits the
        // lock-delay as this one did (a note would tell it none is owed).
        let now = Instant::now();
        let still_waiting = |until: Option<Instant>| until.is_some_and(|until| now < until);
        if let Some((identity, token, fence)) = self.station.take() {
            let name = Self::station_name_for(&identity);
            if still_waiting(self.station_held_back_until) {
                warn!(%name, "stopped during the lock-delay after the station's lease lapsed: no clean release is noted, so the next gateway to serve it waits the lock-delay too");
            } else {
                let noted = self.note_clean_release(&name, fence);
                if !matches!(
                    tokio::time::timeout(timing.store_timeout, noted).await,
                    Ok(Ok(()))
                ) {
                    warn!(%name, "could not note the clean release of the station's lease: the next gateway to serve it waits the lock-delay");
                }
            }
            let _ = self.store.release(&name, &token).await;
        }
        // (The state file's lock goes with this task: a restart may take it at once.)
        if still_waiting(self.held_back_until) {
            warn!(name = %self.name, "stopped during the lock-delay after the link-owner lease lapsed: no clean release is noted, so the next owner waits the lock-delay too");
        } else {
            let noted = self.note_clean_release(&self.name, self.fence);
            match tokio::time::timeout(timing.store_timeout, noted).await {
                Ok(Ok(())) => {}
                Ok(Err(why)) => {
                    warn!(name = %self.name, "could not note the clean release ({why}): the next owner waits the lock-delay")
                }
                Err(_) => {
                    warn!(name = %self.name, "could not note the clean release in time: the next owner waits the lock-delay")
                }
            }
        }
        if let Err(why) = self.store.release(&self.name, &self.token).await {
            warn!(name = %self.name, "could not release the link-owner lease ({why}); it lapses in {} s", timing.ttl.as_secs());
        }
    }
}

/// Completes at `until`; never without one.
async fn sleep_until_opt(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod keep_tests {
    use super::*;

    /// A gateway that claims `control`'s link-owner lease as `who` on `store` and keeps it: its
    /// gate, the token that stops it cleanly, and its task (aborted: killed).
    async fn keeping(
        store: &Arc<dyn LeaseStore>,
        timing: LinkOwnerTiming,
        control: &str,
        who: &str,
    ) -> (
        Arc<OwnerGate>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let ownership = LinkOwnership::claim(store.clone(), control, who.into(), timing, None)
            .await
            .unwrap();
        let gate = ownership.gate();
        let stop = CancellationToken::new();
        let task = tokio::spawn(ownership.keep(stop.clone(), CancellationToken::new()));
        (gate, stop, task)
    }

    #[test]
    fn identities_are_compared_and_leases_named_after_normalising_case_and_spaces() {
        assert_eq!(identity_key("  HVS-3   ESH1\t"), "hvs-3 esh1");
        assert_eq!(
            LinkOwnership::station_name_for("HVS-3 ESH1"),
            LinkOwnership::station_name_for("hvs-3  esh1 ")
        );
        assert_eq!(
            LinkOwnership::station_name_for("HVS-3 ESH1"),
            "link-owner:station:hvs-3 esh1"
        );
        assert_ne!(identity_key("HVS-3 ESH1"), identity_key("HVS-3 ESH2"));
    }

    #[tokio::test]
    async fn an_identity_asked_before_the_owner_task_first_ran_is_decided_at_once() {
        let store: Arc<dyn LeaseStore> = Arc::new(station_lease::MemoryLeaseStore::new());
        let timing = LinkOwnerTiming::for_ttl(Duration::from_secs(3));
        let ownership = LinkOwnership::claim(store, "control:test", "me".into(), timing, None)
            .await
            .unwrap();
        let gate = ownership.gate();
        // The link meets the station and asks, before the owner task has run at all.
        let asking = {
            let gate = gate.clone();
            tokio::spawn(async move {
                gate.verify_identity("HVS-3 ESH1", Duration::from_secs(2))
                    .await
            })
        };
        tokio::task::yield_now().await;
        let shutdown = CancellationToken::new();
        let keeping = tokio::spawn(ownership.keep(shutdown.clone(), CancellationToken::new()));
        let verdict = tokio::time::timeout(Duration::from_secs(1), asking)
            .await
            .expect("decided within a second, not at the ask's limit")
            .unwrap();
        assert_eq!(verdict, Ok(()));
        shutdown.cancel();
        keeping.await.unwrap();
    }

    /// One owner whatever `station.id` says.
    /// The owner names the station by `station.id`; a second gateway names
    /// it otherwise (another control lease: no `station.id`, or another address). Once each
    /// met the station, the second is refused it, naming the owner, whatever case and spacing
    /// the identity comes in.
    #[tokio::test]
    async fn a_second_gateway_is_refused_the_station_whatever_station_id_the_owner_has() {
        let store: Arc<dyn LeaseStore> = Arc::new(station_lease::MemoryLeaseStore::new());
        let timing = LinkOwnerTiming::for_ttl(Duration::from_secs(3));
        let owner = LinkOwnership::claim(
            store.clone(),
            "control:station:HV bench",
            "gateway A".into(),
            timing,
            None,
        )
        .await
        .unwrap()
        .with_station_id(Some("HV bench".into()));
        let second = LinkOwnership::claim(
            store,
            "control:tcp://10.0.0.7:4000",
            "gateway B".into(),
            timing,
            None,
        )
        .await
        .expect("another control lease: another link-owner lease");
        let (owner_gate, second_gate) = (owner.gate(), second.gate());
        let shutdown = CancellationToken::new();
        let keeping = [
            tokio::spawn(owner.keep(shutdown.clone(), CancellationToken::new())),
            tokio::spawn(second.keep(shutdown.clone(), CancellationToken::new())),
        ];
        let limit = Duration::from_secs(2);
        assert_eq!(
            owner_gate.verify_identity("HVS-3 ESH1", limit).await,
            Ok(())
        );
        let refused = second_gate.verify_identity("hvs-3  esh1", limit).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|why| why.contains("another gateway owns the station")
                    && why.contains("gateway A")),
            "{refused:?}"
        );
        shutdown.cancel();
        for task in keeping {
            task.await.unwrap();
        }
    }

    /// The lock-delay on the station's own lease: its owner dies (or is paused) without
    /// releasing it; a second gateway that names the station otherwise stands by and, once
    /// that lease lapsed, waits the lock-delay before it serves the station (a change the old
    /// owner sent last may still be under way). After a clean stop the next serves at once.
    #[tokio::test]
    async fn a_gateway_that_takes_the_station_after_its_lease_lapsed_waits_the_lock_delay() {
        let store: Arc<dyn LeaseStore> = Arc::new(station_lease::MemoryLeaseStore::new());
        let lock_delay = Duration::from_millis(1_500);
        let timing = LinkOwnerTiming {
            lock_delay,
            ..LinkOwnerTiming::for_ttl(Duration::from_secs(1))
        };
        let limit = Duration::from_secs(2);
        let (gate_a, _, task_a) = keeping(&store, timing, "control:a", "gateway A").await;
        assert_eq!(gate_a.verify_identity("HVS-3 ESH1", limit).await, Ok(()));
        task_a.abort();
        let died = Instant::now();
        let (gate_b, stop_b, task_b) = keeping(&store, timing, "control:b", "gateway B").await;
        let refused = gate_b.verify_identity("HVS-3 ESH1", limit).await;
        assert!(
            refused.as_ref().is_err_and(|why| why.contains("gateway A")),
            "{refused:?}"
        );
        tokio::time::timeout(Duration::from_secs(5), async {
            while gate_b.refused_identity().is_some() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the second gateway serves the station once the lock-delay is over");
        assert!(
            died.elapsed() >= lock_delay,
            "it served the station {:?} after its owner died: before the lock-delay ({lock_delay:?}) after the lease lapsed",
            died.elapsed()
        );
        stop_b.cancel();
        task_b.await.unwrap();
        let (gate_c, stop_c, task_c) = keeping(&store, timing, "control:c", "gateway C").await;
        let asked = Instant::now();
        assert_eq!(gate_c.verify_identity("HVS-3 ESH1", limit).await, Ok(()));
        assert!(
            asked.elapsed() < lock_delay,
            "after a clean stop the next waited {:?}",
            asked.elapsed()
        );
        stop_c.cancel();
        task_c.await.unwrap();
    }

    /// A gateway that took the station after its lease lapsed, and stops cleanly while it
    /// still waits the lock-delay, leaves no note of a clean release: what the lapsed owner
    /// sent last may still land, so the next gateway waits the lock-delay too.
    #[tokio::test]
    async fn a_clean_stop_during_the_lock_delay_after_a_lapse_makes_the_next_wait_it_too() {
        let store: Arc<dyn LeaseStore> = Arc::new(station_lease::MemoryLeaseStore::new());
        let lock_delay = Duration::from_millis(1_500);
        let timing = LinkOwnerTiming {
            lock_delay,
            ..LinkOwnerTiming::for_ttl(Duration::from_secs(1))
        };
        let limit = Duration::from_secs(2);
        let (gate_a, _, task_a) = keeping(&store, timing, "control:a", "gateway A").await;
        assert_eq!(gate_a.verify_identity("HVS-3 ESH1", limit).await, Ok(()));
        task_a.abort();
        let died = Instant::now();
        let (gate_b, stop_b, task_b) = keeping(&store, timing, "control:b", "gateway B").await;
        let refused = gate_b.verify_identity("HVS-3 ESH1", limit).await;
        assert!(refused.is_err(), "{refused:?}");
        // B takes the station's lease once A's lapsed, and waits the lock-delay; it stops
        // cleanly meanwhile.
        let station = LinkOwnership::station_name_for("HVS-3 ESH1");
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let holders = store
                    .holders(super::super::store::LeaseKind::Exclusive, &station)
                    .await
                    .unwrap();
                if holders
                    .iter()
                    .any(|grant| grant.owner.contains("gateway B"))
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("B takes the station's lease once A's lapsed");
        assert!(
            gate_b.refused_identity().is_some(),
            "B still waits the lock-delay"
        );
        stop_b.cancel();
        task_b.await.unwrap();
        let (gate_c, stop_c, task_c) = keeping(&store, timing, "control:c", "gateway C").await;
        let _first = gate_c.verify_identity("HVS-3 ESH1", limit).await;
        tokio::time::timeout(Duration::from_secs(5), async {
            while gate_c.refused_identity().is_some() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("C serves the station once the lock-delay is over");
        assert!(
            died.elapsed() >= lock_delay,
            "C served the station {:?} after A died: before the lock-delay ({lock_delay:?}) after A's lease lapsed",
            died.elapsed()
        );
        stop_c.cancel();
        task_c.await.unwrap();
    }
}

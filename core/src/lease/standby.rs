//! A standby gateway (`[ha] mode = "standby"`, `--standby`): it watches the station's
//! link-owner lease in the shared backend, points clients at the gateway that holds it (whose
//! HTTP address is in the lease's owner text, [`owner_label`]), and once that lease lapses
//! takes it: from then on this gateway owns the station (the server resumes the control lease
//! and announces the failover).
//!
//! While it stands by, [`HaRole`] makes the request entry, `/readyz` and `/metrics` answer 503
//! naming the owner; a lease that lapsed (not released) keeps the link's `OwnerGate` closed for
//! the link-owner lock-delay. On takeover the server (`server::stand_by`) resumes the control
//! lease, writes the `GATEWAY failover` audit line and keeps the lease renewed as the
//! link-owner task does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::link_owner::{LinkOwnerTiming, LinkOwnership, RETRY_AFTER_LAPSE};
use super::owner_state::OwnerState;
use super::store::LeaseStore;
use crate::link::OwnerGate;

/// What a gateway publishes as the owner of its link-owner lease: its process and the HTTP
/// address a standby points clients at.
pub fn owner_label(pid: u32, http_url: &str) -> String {
    format!("station-gateway pid {pid} at {http_url}")
}

/// The HTTP address in an owner text written by [`owner_label`] (`None` for any other text,
/// e.g. a gateway of an older version).
pub fn http_url_of(owner: &str) -> Option<&str> {
    let (_, url) = owner.rsplit_once(" at ")?;
    (url.starts_with("http://") || url.starts_with("https://")).then_some(url)
}

/// This gateway's part: the owner, or a standby (with what it last saw of the owner).
#[derive(Debug, Default)]
pub struct HaRole {
    standby: Mutex<Option<Watching>>,
    /// `standby` is `Some`: asked by every request, so an owner answers it without the lock
    /// (a lock is a write every worker thread shares).
    standing: AtomicBool,
}

/// What a standby last found in the store.
#[derive(Debug, Clone, Default)]
struct Watching {
    /// The owner text of the lease's holder.
    owner: Option<String>,
    /// Why the store could not say, when it could not.
    store_error: Option<String>,
    /// The lease is this gateway's now; it waits out the lock-delay and resumes the control
    /// lease before it serves.
    taking_over: bool,
}

impl HaRole {
    /// The owner of the station (the only gateway there is, or one that took over).
    pub fn owner() -> HaRole {
        HaRole::default()
    }

    /// A standby that has not yet looked at the store.
    pub fn standby() -> HaRole {
        HaRole {
            standby: Mutex::new(Some(Watching::default())),
            standing: AtomicBool::new(true),
        }
    }

    fn watching(&self) -> std::sync::MutexGuard<'_, Option<Watching>> {
        self.standby.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// While this gateway stands by: why it serves no API request, naming the owner and the
    /// HTTP address where it serves.
    pub fn standing_by(&self) -> Option<String> {
        if !self.standing.load(Ordering::Acquire) {
            return None;
        }
        let watching = self.watching().clone()?;
        if watching.taking_over {
            return Some(
                "this gateway is taking the station over from a gateway whose link-owner lease lapsed (the lock-delay, then the control lease): try again in a moment".to_owned(),
            );
        }
        let owner = match &watching.owner {
            Some(owner) => match http_url_of(owner) {
                Some(url) => format!("{owner}; its API is at {url}"),
                None => owner.clone(),
            },
            None => "not yet known".to_owned(),
        };
        let store = watching
            .store_error
            .map(|why| format!(" (the lease backend did not answer the last look: {why})"))
            .unwrap_or_default();
        Some(format!(
            "this gateway is a standby: another gateway owns the station, {owner}{store}; this one takes over once that gateway's link-owner lease lapses"
        ))
    }

    fn saw(&self, watching: Watching) {
        if let Some(seen) = self.watching().as_mut() {
            *seen = watching;
        }
    }

    /// The standby holds the link-owner lease now, and is not yet serving.
    pub fn taking_over(&self) {
        if let Some(seen) = self.watching().as_mut() {
            seen.taking_over = true;
        }
    }

    /// The standby has taken the station over: it is the owner now.
    pub fn took_over(&self) {
        *self.watching() = None;
        self.standing.store(false, Ordering::Release);
    }
}

/// When a standby looks at the store again: just after the owner's lease should lapse, and
/// at least every renewal interval (a lease released early is taken that much sooner).
pub fn next_look(owner_expires_in: Option<Duration>, timing: &LinkOwnerTiming) -> Duration {
    match owner_expires_in {
        Some(left) => (left + RETRY_AFTER_LAPSE).min(timing.renew_every),
        None => timing.renew_every,
    }
}

/// A standby's watch over the link-owner lease `name`.
pub struct Standby {
    pub store: Arc<dyn LeaseStore>,
    pub name: String,
    /// Who this gateway is, as the owner text of the lease once it takes it.
    pub me: String,
    pub timing: LinkOwnerTiming,
    pub state: Option<OwnerState>,
    /// The link's gate, closed until this gateway takes the lease.
    pub gate: Arc<OwnerGate>,
    pub role: Arc<HaRole>,
    /// `station.id`, compared with HELLO's identity once it owns the link (logged if not it).
    pub station_id: Option<String>,
}

/// A standby that took the station: its ownership, and who owned it before.
pub struct TakenOver {
    pub ownership: LinkOwnership,
    pub previous_owner: Option<String>,
    /// Whether the owner's lease lapsed (found free at or after the deadline it was last seen
    /// with), rather than released: then the link waits the lock-delay.
    pub lapsed: bool,
}

/// Whether a lease found free at `found_free` had lapsed rather than been released: its owner
/// was last seen holding it until `last_seen_until`. A lease found free only after that might
/// have lapsed (or been renewed and released since: the lock-delay is then waited for
/// nothing); one found free before it was released. A lease never seen held (this standby
/// started after it ended) counts as lapsed.
pub fn lapsed(last_seen_until: Option<Instant>, found_free: Instant) -> bool {
    last_seen_until.is_none_or(|until| found_free + RETRY_AFTER_LAPSE >= until)
}

impl Standby {
    /// Looks at the store until the owner's lease has lapsed and this gateway took it; `None`
    /// on `shutdown`.
    pub async fn until_lapsed(mut self, shutdown: &CancellationToken) -> Option<TakenOver> {
        let mut previous_owner = None;
        let mut last_seen_until = None;
        loop {
            let asked_at = Instant::now();
            let claimed = LinkOwnership::try_claim(
                self.store.clone(),
                &self.name,
                self.me.clone(),
                self.timing,
                &mut self.state,
                self.gate.clone(),
            )
            .await;
            let look = match claimed {
                Ok(Ok(ownership)) => {
                    let lapsed =
                        lapsed(last_seen_until, asked_at) && ownership.lapsed_before().await;
                    let delay = if lapsed {
                        self.timing.lock_delay
                    } else {
                        Duration::ZERO
                    };
                    info!(
                        name = %self.name,
                        previous = previous_owner.as_deref().unwrap_or("nobody"),
                        lock_delay_ms = delay.as_millis(),
                        "the owner's link-owner lease {}: this standby takes the station over",
                        if lapsed { "lapsed (its owner may be paused, not gone: the link waits the lock-delay first)" } else { "was released" }
                    );
                    self.role.taking_over();
                    return Some(TakenOver {
                        ownership: ownership
                            .with_station_id(self.station_id.clone())
                            .hold_back(delay),
                        previous_owner,
                        lapsed,
                    });
                }
                Ok(Err(holder)) => {
                    let left = holder.expires_in;
                    last_seen_until = Some(asked_at + left);
                    if previous_owner.as_deref() != Some(holder.owner.as_str()) {
                        info!(name = %self.name, owner = %holder.owner, "standing by: another gateway owns the station");
                    }
                    self.role.saw(Watching {
                        owner: Some(holder.owner.clone()),
                        ..Watching::default()
                    });
                    previous_owner = Some(holder.owner);
                    next_look(Some(left), &self.timing)
                }
                Err(why) => {
                    warn!(name = %self.name, "standing by: {why}");
                    self.role.saw(Watching {
                        owner: previous_owner.clone(),
                        store_error: Some(why.to_string()),
                        ..Watching::default()
                    });
                    next_look(None, &self.timing)
                }
            };
            tokio::select! {
                // In order: a deterministic simulation replays the same choice.
                biased;
                () = shutdown.cancelled() => return None,
                () = tokio::time::sleep(look) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_text_carries_the_http_address_a_standby_points_at() {
        let label = owner_label(4242, "http://gw1.lab:5000");
        assert_eq!(label, "station-gateway pid 4242 at http://gw1.lab:5000");
        assert_eq!(http_url_of(&label), Some("http://gw1.lab:5000"));
        assert_eq!(
            http_url_of("station-gateway pid 1 (HTTP 10.0.0.1:5000)"),
            None
        );
        assert_eq!(http_url_of("a lab script at the bench"), None);
    }

    #[test]
    fn a_standby_names_the_owner_and_its_address_until_it_takes_over() {
        let role = HaRole::standby();
        assert!(role.standing_by().unwrap().contains("not yet known"));
        role.saw(Watching {
            owner: Some(owner_label(7, "http://127.0.0.1:5000")),
            ..Watching::default()
        });
        let why = role.standing_by().unwrap();
        assert!(why.contains("standby"), "{why}");
        assert!(why.contains("its API is at http://127.0.0.1:5000"), "{why}");
        role.taking_over();
        assert!(
            role.standing_by()
                .unwrap()
                .contains("taking the station over")
        );
        role.took_over();
        assert_eq!(role.standing_by(), None);
        assert_eq!(HaRole::owner().standing_by(), None);
    }

    #[test]
    fn a_lease_found_free_before_its_last_seen_deadline_was_released_and_after_it_lapsed() {
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs(2);
        assert!(
            !lapsed(Some(until), t0 + Duration::from_secs(1)),
            "released"
        );
        assert!(lapsed(Some(until), until), "found free at its deadline");
        assert!(lapsed(Some(until), until + Duration::from_secs(1)));
        assert!(lapsed(None, t0), "never seen held: it may have lapsed");
    }

    #[test]
    fn a_standby_looks_again_just_after_the_owner_lease_should_lapse_and_at_least_every_renewal_interval()
     {
        let timing = LinkOwnerTiming::for_ttl(Duration::from_secs(3));
        assert_eq!(
            next_look(Some(Duration::from_millis(400)), &timing),
            Duration::from_millis(400) + RETRY_AFTER_LAPSE
        );
        assert_eq!(
            next_look(Some(Duration::from_secs(3)), &timing),
            timing.renew_every
        );
        assert_eq!(next_look(None, &timing), timing.renew_every);
    }
}

//! Self-fencing: the link sends a frame only while this gateway provably owns the station's
//! link. The link-owner lease's validity is kept here on the monotonic clock as "mine until
//! T − margin", T counted from when the confirmed renewal was *sent* (the store's own clock
//! started the lease no earlier); the link task asks [`OwnerGate::owned_at`] right before it
//! writes any frame, and before it connects. Past it the gateway sends nothing more — however
//! it got there: a store it cannot reach, a process paused for longer than the lease, a
//! renewal that came back too late — until a renewal is confirmed again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// What the owner of the gate decided about a station identity: `Err` says why the link may
/// not serve that station (another gateway owns it, however each is configured).
pub type IdentityVerdict = Result<(), String>;

/// How long a gate [`OwnerGate::open_for_good`] stays open: a hundred years.
const FOR_GOOD_NANOS: u64 = 100 * 365 * 24 * 3600 * 1_000_000_000;

/// This gateway's hold on the station's link, as the link checks it.
#[derive(Debug)]
pub struct OwnerGate {
    /// The instant the nanoseconds below count from.
    base: Instant,
    /// Owned until `base` + this many nanoseconds; 0 while never owned (or revoked).
    until_nanos: AtomicU64,
    /// The station identity (from HELLO) the link asks to serve, for the link-owner task.
    identity_asked: watch::Sender<Option<String>>,
    /// The link-owner task's verdict on an identity.
    identity_verdict: watch::Sender<Option<(String, IdentityVerdict)>>,
    /// Why the link stands by: the station it met is another gateway's. It does not connect
    /// (not even for a HELLO) until the link-owner task has claimed that station's lease.
    standing_by: std::sync::Mutex<Option<String>>,
    /// Bumped whenever the link may connect again (the gate opened from closed, a refused
    /// station was accepted): a link waiting out its back-off tries at once (a failover).
    reopened: watch::Sender<u64>,
}

impl OwnerGate {
    /// A gate that is closed until [`OwnerGate::renewed`] opens it.
    pub fn new(now: Instant) -> OwnerGate {
        OwnerGate {
            base: now,
            until_nanos: AtomicU64::new(0),
            identity_asked: watch::channel(None).0,
            identity_verdict: watch::channel(None).0,
            standing_by: std::sync::Mutex::new(None),
            reopened: watch::channel(0).0,
        }
    }

    /// A gate no lease closes, for a station of a gateway of several whose lease backend no
    /// other gateway shares: it only asks, after each HELLO, whether another station of this
    /// gateway serves the same physical station already (`lease::lab_identities`).
    pub fn open_for_good(now: Instant) -> OwnerGate {
        let gate = OwnerGate::new(now);
        gate.until_nanos.store(FOR_GOOD_NANOS, Ordering::Release);
        gate
    }

    /// The station's identity: may the link serve the station that said `identity` in its
    /// HELLO? Asks the link-owner task (which claims the station's own link-owner lease, so
    /// that a gateway reaching the same station by another address or name is refused) and
    /// waits at most `limit` for its verdict.
    pub async fn verify_identity(&self, identity: &str, limit: Duration) -> IdentityVerdict {
        let mut verdicts = self.identity_verdict.subscribe();
        if let Some((decided, Ok(()))) = &*verdicts.borrow_and_update()
            && decided == identity
        {
            return Ok(());
        }
        // Asked anew after a refusal too: the other owner may have gone meanwhile.
        self.identity_asked.send_replace(Some(identity.to_owned()));
        let verdict = async {
            loop {
                if verdicts.changed().await.is_err() {
                    return Err("nobody decides on the station's identity".to_owned());
                }
                if let Some((decided, verdict)) = &*verdicts.borrow_and_update()
                    && decided == identity
                {
                    return verdict.clone();
                }
            }
        };
        tokio::time::timeout(limit, verdict).await.unwrap_or_else(|_| {
            Err(format!(
                "the lease backend did not confirm within {} ms that this gateway may serve the station {identity}",
                limit.as_millis()
            ))
        })
    }

    /// The identities the link asks to serve (the link-owner task watches it).
    pub fn identities_asked(&self) -> watch::Receiver<Option<String>> {
        self.identity_asked.subscribe()
    }

    /// The link-owner task's verdict on `identity`: a refusal makes the link stand by, an
    /// acceptance ends standing by.
    pub fn decide_identity(&self, identity: String, verdict: IdentityVerdict) {
        let was_standing_by =
            std::mem::replace(&mut *self.standing(), verdict.as_ref().err().cloned());
        if was_standing_by.is_some() && verdict.is_ok() {
            self.reopened.send_modify(|n| *n += 1);
        }
        self.identity_verdict
            .send_replace(Some((identity, verdict)));
    }

    /// Why the link may not connect now: the station it last met is another gateway's.
    pub fn standing_by(&self) -> Option<String> {
        self.standing().clone()
    }

    fn standing(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.standing_by
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The identity the link was refused, while it stands by (the link-owner task keeps trying
    /// to claim it).
    pub fn refused_identity(&self) -> Option<String> {
        match &*self.identity_verdict.borrow() {
            Some((identity, Err(_))) if self.standing().is_some() => Some(identity.clone()),
            _ => None,
        }
    }

    /// A renewal sent at `sent_at` was confirmed for `ttl`: owned until `sent_at + ttl -
    /// margin`. Never moves the end back (an older renewal confirmed late changes nothing).
    pub fn renewed(&self, sent_at: Instant, ttl: Duration, margin: Duration) {
        let was_open = self.owned_at(Instant::now());
        let until = (sent_at + ttl.saturating_sub(margin)).saturating_duration_since(self.base);
        // (An end at the base itself is 0, "closed": it opens nothing.)
        let nanos = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX);
        self.until_nanos.fetch_max(nanos, Ordering::AcqRel);
        if !was_open && self.owned_at(Instant::now()) {
            self.reopened.send_modify(|n| *n += 1);
        }
    }

    /// Changes whenever the link may connect again after it could not (see `reopened`).
    pub fn reopenings(&self) -> watch::Receiver<u64> {
        self.reopened.subscribe()
    }

    /// The lease is lost (the store says another owns it, or the gateway stops): closed now.
    pub fn revoke(&self) {
        self.until_nanos.store(0, Ordering::Release);
    }

    /// Until when the link may send; `None` while closed.
    pub fn until(&self) -> Option<Instant> {
        match self.until_nanos.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(self.base + Duration::from_nanos(nanos)),
        }
    }

    /// True while this gateway may send to the station at `now`.
    pub fn owned_at(&self, now: Instant) -> bool {
        // Hole put back (reintroduce-holes only): a gate once opened never closes by itself.
        if crate::holes::active("owner-gate-never-closes") {
            return self.until().is_some();
        }
        self.until().is_some_and(|until| now < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(2);

    #[test]
    fn a_gate_is_closed_until_its_first_renewal() {
        let t0 = Instant::now();
        let gate = OwnerGate::new(t0);
        assert!(!gate.owned_at(t0));
        assert_eq!(gate.until(), None);
        gate.renewed(t0, TTL, MARGIN);
        assert!(gate.owned_at(t0));
        assert_eq!(gate.until(), Some(t0 + Duration::from_secs(8)));
    }

    #[test]
    fn it_is_owned_until_the_ttl_less_the_margin_from_when_the_renewal_was_sent() {
        let t0 = Instant::now();
        let gate = OwnerGate::new(t0);
        let sent = t0 + Duration::from_secs(1);
        gate.renewed(sent, TTL, MARGIN);
        assert!(gate.owned_at(sent + Duration::from_millis(7_999)));
        assert!(
            !gate.owned_at(sent + Duration::from_secs(8)),
            "the end is excluded"
        );
        assert!(!gate.owned_at(sent + Duration::from_secs(60)));
    }

    #[test]
    fn a_late_confirmation_of_an_older_renewal_never_moves_the_end_back() {
        let t0 = Instant::now();
        let gate = OwnerGate::new(t0);
        gate.renewed(t0 + Duration::from_secs(5), TTL, MARGIN);
        gate.renewed(t0 + Duration::from_secs(1), TTL, MARGIN);
        assert_eq!(gate.until(), Some(t0 + Duration::from_secs(13)));
    }

    #[test]
    fn a_revoked_gate_is_closed_at_once_and_a_renewal_opens_it_again() {
        let t0 = Instant::now();
        let gate = OwnerGate::new(t0);
        gate.renewed(t0, TTL, MARGIN);
        gate.revoke();
        assert!(!gate.owned_at(t0));
        gate.renewed(t0 + Duration::from_secs(1), TTL, MARGIN);
        assert!(gate.owned_at(t0 + Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn an_identity_is_served_once_the_owner_task_said_yes_and_refused_when_it_said_no() {
        let gate = std::sync::Arc::new(OwnerGate::new(Instant::now()));
        let mut asked = gate.identities_asked();
        let decider = {
            let gate = gate.clone();
            tokio::spawn(async move {
                for verdict in [Ok(()), Err("owned by G1".to_owned())] {
                    asked.changed().await.unwrap();
                    let identity = asked.borrow_and_update().clone().unwrap();
                    gate.decide_identity(identity, verdict);
                }
            })
        };
        let limit = Duration::from_secs(5);
        assert_eq!(gate.verify_identity("station A", limit).await, Ok(()));
        assert_eq!(
            gate.verify_identity("station A", limit).await,
            Ok(()),
            "an identity decided is not asked again"
        );
        assert_eq!(
            gate.verify_identity("station B", limit).await,
            Err("owned by G1".to_owned())
        );
        decider.await.unwrap();
    }

    #[test]
    fn a_refused_identity_makes_the_link_stand_by_until_it_is_accepted() {
        let gate = OwnerGate::new(Instant::now());
        assert_eq!(gate.standing_by(), None);
        gate.decide_identity("station A".into(), Err("owned by G1".into()));
        assert_eq!(gate.standing_by().as_deref(), Some("owned by G1"));
        assert_eq!(gate.refused_identity().as_deref(), Some("station A"));
        gate.decide_identity("station A".into(), Ok(()));
        assert_eq!(gate.standing_by(), None);
        assert_eq!(gate.refused_identity(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_identity_nobody_decides_on_is_refused_after_the_limit() {
        let gate = OwnerGate::new(Instant::now());
        let _asked = gate.identities_asked();
        let verdict = gate
            .verify_identity("station A", Duration::from_millis(500))
            .await;
        assert!(verdict.is_err_and(|why| why.contains("did not confirm within 500 ms")));
    }

    #[test]
    fn a_link_waiting_to_connect_hears_when_the_gate_opens_or_its_station_is_accepted() {
        let t0 = Instant::now();
        let gate = OwnerGate::new(t0);
        let mut reopenings = gate.reopenings();
        gate.renewed(t0, TTL, MARGIN);
        assert!(reopenings.has_changed().unwrap(), "opened from closed");
        reopenings.borrow_and_update();
        gate.renewed(t0, TTL, MARGIN);
        assert!(
            !reopenings.has_changed().unwrap(),
            "an open gate renewed is no news"
        );
        gate.decide_identity("station A".into(), Err("owned by G1".into()));
        assert!(
            !reopenings.has_changed().unwrap(),
            "a refusal is no reason to connect"
        );
        gate.decide_identity("station A".into(), Ok(()));
        assert!(
            reopenings.has_changed().unwrap(),
            "the station is ours again"
        );
    }

    #[test]
    fn a_margin_as_long_as_the_ttl_never_opens_it_for_a_renewal_sent_at_the_start() {
        let t0 = Instant::now();
        let gate = OwnerGate::new(t0);
        gate.renewed(t0, TTL, TTL);
        assert!(!gate.owned_at(t0), "owned until its own start: never");
    }
}

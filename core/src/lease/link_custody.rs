//! Does this process own this station's link now? The one question every door that acts on a
//! station asks first — a safe stop (the station's and the lab's), a change (REST and the
//! legacy port), a lease's end (release, break) — so that a door that cannot act says so,
//! naming who serves the station, instead of answering "done" for what never reached it.
//!
//! Two things say "not this process": a standby ([`HaRole`], `--standby`) while another
//! gateway holds the link-owner lease, and a link standing by on the station's identity
//! ([`OwnerGate::standing_by`]): the station it met is served by another gateway (the station's
//! own link-owner lease on a shared backend, `link_owner.rs`) or by another station of this
//! gateway (`lab_identities.rs`), or this gateway still waits out the lock-delay after taking
//! the station's lease over.

use std::sync::Arc;

use tokio::sync::watch;

use crate::link::OwnerGate;

use super::standby::HaRole;

pub use super::NotLinkOwner;

/// `Ok` when this process owns the station's link now: neither a standby (`role`) nor a link
/// standing by on the station's identity (`gate`, the link's own, when it has one).
pub fn owns_link(role: &HaRole, gate: Option<&OwnerGate>) -> Result<(), NotLinkOwner> {
    if let Some(why) = role.standing_by() {
        return Err(NotLinkOwner(why));
    }
    match gate.and_then(OwnerGate::standing_by) {
        Some(why) => Err(NotLinkOwner(format!(
            "this gateway does not serve the station now, so nothing it was asked reached it: {why}"
        ))),
        None => Ok(()),
    }
}

/// What says whether this process owns the station's link, kept where a decision needs it at
/// the moment it is made (the control lease asks it before it grants, not only at the door).
#[derive(Clone)]
pub struct LinkCustody {
    role: Arc<HaRole>,
    gate: Option<Arc<OwnerGate>>,
}

impl LinkCustody {
    /// The custody `role` and the link's own `gate` (when it has one) say.
    pub fn new(role: Arc<HaRole>, gate: Option<Arc<OwnerGate>>) -> LinkCustody {
        LinkCustody { role, gate }
    }

    /// [`owns_link`], now.
    pub fn owns_link(&self) -> Result<(), NotLinkOwner> {
        owns_link(&self.role, self.gate.as_deref())
    }

    /// Changes whenever the link may serve the station again after it could not (a refused
    /// station accepted, the gate opened from closed); `None` without a gate.
    pub fn regained(&self) -> Option<watch::Receiver<u64>> {
        self.gate.as_ref().map(|gate| gate.reopenings())
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::error_kind::ErrorKind;

    #[test]
    fn an_owner_with_no_gate_or_an_open_one_owns_the_link() {
        assert_eq!(owns_link(&HaRole::owner(), None), Ok(()));
        let gate = OwnerGate::open_for_good(Instant::now());
        assert_eq!(owns_link(&HaRole::owner(), Some(&gate)), Ok(()));
        // A closed gate alone (a renewal late, the lock-delay of its own link-owner lease)
        // is this process's link still: the link holds what it sends until it opens.
        let closed = OwnerGate::new(Instant::now());
        assert_eq!(owns_link(&HaRole::owner(), Some(&closed)), Ok(()));
    }

    #[test]
    fn a_standby_does_not_own_the_link_and_says_who_does() {
        let refused = owns_link(&HaRole::standby(), None).unwrap_err();
        assert!(refused.to_string().contains("standby"), "{refused}");
        assert_eq!(refused.kind(), ErrorKind::StandingBy);
        let role = HaRole::standby();
        role.took_over();
        assert_eq!(owns_link(&role, None), Ok(()));
    }

    #[test]
    fn a_link_standing_by_on_the_stations_identity_does_not_own_it_and_names_the_other() {
        let gate = OwnerGate::open_for_good(Instant::now());
        let other = "station st1 of this gateway already serves the station HVS-3 ESH1";
        gate.decide_identity("hvs-3 esh1".into(), Err(other.into()));
        let refused = owns_link(&HaRole::owner(), Some(&gate)).unwrap_err();
        assert!(
            refused.to_string().contains(other) && refused.to_string().contains("nothing"),
            "{refused}"
        );
        // Accepted again (the other let go): it owns the link.
        gate.decide_identity("hvs-3 esh1".into(), Ok(()));
        assert_eq!(owns_link(&HaRole::owner(), Some(&gate)), Ok(()));
    }
}

//! One physical station, one station of the gateway: in a gateway of several stations, two
//! `[[station]]` tables may reach one physical station by two addresses (an IP and a host
//! name, TCP and a serial console server). With a lease backend other gateways share, each
//! station's link-owner lease already refuses the second (`link_owner.rs`: the station's own
//! lease, named after HELLO's identity). With one only this process sees, [`LabIdentities`]
//! does it in memory: after each HELLO a station's link asks its gate ([`OwnerGate`]) whether
//! it may serve the identity it met, and the first station to claim an identity keeps it until
//! its link meets another station or the gateway stops; the other stands by, and serves once
//! the identity is free again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ledger::Adopter;
use crate::config::identity_key;
use crate::link::{IdentityVerdict, OwnerGate};

/// Which station of this gateway serves which physical station (by its HELLO identity).
#[derive(Debug, Default)]
pub struct LabIdentities {
    /// identity key → the id of the station serving it.
    held: Mutex<HashMap<String, String>>,
    /// Told when an identity is let go: a station standing by for it asks again.
    released: watch::Sender<()>,
}

/// Station `station` asks to serve the physical station that said `identity`: granted when no
/// other station holds it; what `station` held before is let go (a link meets one station at a
/// time). `true` in the second place when something was let go.
pub fn claim(
    held: &mut HashMap<String, String>,
    station: &str,
    identity: &str,
) -> (IdentityVerdict, bool) {
    let key = identity_key(identity);
    if let Some(other) = held.get(&key)
        && other != station
    {
        return (
            Err(format!(
                "station {other} of this gateway already serves the station {identity} (reached by another address): a physical station may be one station of the gateway only; station {station} stands by until {other} no longer serves it"
            )),
            false,
        );
    }
    let before = held.len();
    held.retain(|held_key, holder| holder != station || *held_key == key);
    let let_go = held.len() < before;
    held.insert(key, station.to_owned());
    (Ok(()), let_go)
}

impl LabIdentities {
    pub fn new() -> Arc<LabIdentities> {
        Arc::new(LabIdentities::default())
    }

    fn claim(&self, station: &str, identity: &str) -> IdentityVerdict {
        let (verdict, let_go) = claim(
            &mut self.held.lock().unwrap_or_else(PoisonError::into_inner),
            station,
            identity,
        );
        if let_go {
            self.released.send_replace(());
        }
        verdict
    }

    /// Lets go of whatever `station` serves (it stops), and tells the stations standing by.
    fn release(&self, station: &str) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, holder| holder != station);
        self.released.send_replace(());
    }

    /// Decides station `station`'s link's identities (asked through `gate`) until `shutdown`:
    /// an identity no other station serves is claimed, then `adopt` takes the station's ledger
    /// over, and only then may the link serve it.
    pub async fn serve(
        self: Arc<LabIdentities>,
        station: String,
        gate: Arc<OwnerGate>,
        adopt: Option<Adopter>,
        shutdown: CancellationToken,
    ) {
        let mut asked = gate.identities_asked();
        // An identity asked before this task first ran is decided at once.
        asked.mark_changed();
        let mut released = self.released.subscribe();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                changed = asked.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let Some(identity) = asked.borrow_and_update().clone() else {
                        continue;
                    };
                    let verdict = match self.claim(&station, &identity) {
                        Ok(()) => adopted(adopt.as_ref(), &identity).await,
                        refused => refused,
                    };
                    if let Err(why) = &verdict {
                        warn!("{why}");
                    }
                    gate.decide_identity(identity, verdict);
                }
                changed = released.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    if let Some(identity) = gate.refused_identity()
                        && self.claim(&station, &identity).is_ok()
                    {
                        let verdict = adopted(adopt.as_ref(), &identity).await;
                        if verdict.is_ok() {
                            info!("station {station} serves the station {identity} now: no other station of this gateway does");
                        }
                        gate.decide_identity(identity, verdict);
                    }
                }
            }
        }
        self.release(&station);
    }
}

/// The station's ledger taken over by `adopt`, if any.
async fn adopted(adopt: Option<&Adopter>, identity: &str) -> IdentityVerdict {
    match adopt {
        Some(adopt) => adopt(identity.to_owned()).await,
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_station_to_meet_an_identity_keeps_it_and_the_other_is_refused_naming_both() {
        let mut held = HashMap::new();
        assert_eq!(claim(&mut held, "st1", "HVS-3 ESH1"), (Ok(()), false));
        let (verdict, let_go) = claim(&mut held, "st2", "hvs-3  esh1");
        let why = verdict.unwrap_err();
        assert!(!let_go);
        assert!(
            why.contains("station st1 of this gateway already serves the station hvs-3  esh1"),
            "{why}"
        );
        assert!(why.contains("station st2 stands by"), "{why}");
        // Asked again by its holder: still its own, nothing let go.
        assert_eq!(claim(&mut held, "st1", "HVS-3 ESH1"), (Ok(()), false));
    }

    #[test]
    fn a_station_that_meets_another_identity_lets_the_first_go() {
        let mut held = HashMap::new();
        assert!(claim(&mut held, "st1", "A").0.is_ok());
        assert!(claim(&mut held, "st2", "A").0.is_err());
        // st1's link now meets station B: A is free for st2.
        assert_eq!(claim(&mut held, "st1", "B"), (Ok(()), true));
        assert_eq!(claim(&mut held, "st2", "A"), (Ok(()), false));
        assert_eq!(held.len(), 2);
    }

    const LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

    /// Two stations' gates, each decided by the registry until its token is cancelled, after
    /// st1 took identity S and st2 was refused it; st2's reopenings, watched from then on.
    async fn st1_holds_s_and_st2_stands_by(
        stop_one: &CancellationToken,
        stop_two: &CancellationToken,
    ) -> (Arc<OwnerGate>, Arc<OwnerGate>, watch::Receiver<u64>) {
        let identities = LabIdentities::new();
        let now = tokio::time::Instant::now();
        let (one, two) = (
            Arc::new(OwnerGate::open_for_good(now)),
            Arc::new(OwnerGate::open_for_good(now)),
        );
        tokio::spawn(
            identities
                .clone()
                .serve("st1".into(), one.clone(), None, stop_one.clone()),
        );
        tokio::spawn(identities.serve("st2".into(), two.clone(), None, stop_two.clone()));
        assert_eq!(one.verify_identity("S", LIMIT).await, Ok(()));
        assert!(two.verify_identity("S", LIMIT).await.is_err());
        assert!(two.standing_by().is_some());
        let reopened = two.reopenings();
        (one, two, reopened)
    }

    /// Waits until st2 is told it may serve S again.
    async fn told_s_is_free(two: &OwnerGate, reopened: &mut watch::Receiver<u64>) {
        tokio::time::timeout(LIMIT, reopened.changed())
            .await
            .expect("st2 told that S is free")
            .unwrap();
        assert_eq!(two.standing_by(), None);
        assert_eq!(two.verify_identity("S", LIMIT).await, Ok(()));
    }

    #[tokio::test]
    async fn a_station_standing_by_serves_once_the_other_lets_the_identity_go() {
        let (stop_one, stop_two) = (CancellationToken::new(), CancellationToken::new());
        let (_one, two, mut reopened) = st1_holds_s_and_st2_stands_by(&stop_one, &stop_two).await;
        // st1 stops.
        stop_one.cancel();
        told_s_is_free(&two, &mut reopened).await;
        stop_two.cancel();
    }

    #[tokio::test]
    async fn a_station_standing_by_serves_once_the_other_meets_another_station() {
        let stop = CancellationToken::new();
        let (one, two, mut reopened) = st1_holds_s_and_st2_stands_by(&stop, &stop).await;
        // st1's link now meets another station: S is let go.
        assert_eq!(one.verify_identity("T", LIMIT).await, Ok(()));
        told_s_is_free(&two, &mut reopened).await;
        stop.cancel();
    }
}

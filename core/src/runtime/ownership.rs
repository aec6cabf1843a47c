//! Who owns a station's link: with a lease backend others can reach, the link-owner lease
//! taken before the link touches the station (or, a standby, watched until it lapses); with
//! several stations on a backend only this process sees, the lab's registry of identities.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::info;

use super::{LabShared, StationRuntime, StationStartError};
use crate::config::{Config, HaMode};
use crate::lease::lab_identities::LabIdentities;
use crate::lease::link_owner::{LinkOwnerError, LinkOwnership};
use crate::lease::owner_state::OwnerState;
use crate::lease::standby::{HaRole, Standby, owner_label};
use crate::lease::{BackendUrl, ControlLease};
use crate::link::OwnerGate;

/// How this station's link is owned.
pub(super) enum Custody {
    /// Alone on a backend only this process sees: nobody else could serve the station.
    Alone,
    /// The link-owner lease, claimed.
    Owner(LinkOwnership),
    /// A standby's watch of the owner's link-owner lease.
    Standby(Standby),
    /// A station of several on a backend only this process sees: the lab's registry says
    /// which station serves which physical station, through this gate.
    InLab(Arc<LabIdentities>, Arc<OwnerGate>),
}

impl Custody {
    /// Claims the link-owner lease of the station `config` describes (or watches it, a
    /// standby), on `lab`'s backend when others can reach it.
    pub(super) async fn claim(
        config: &Config,
        station_id: Option<&str>,
        lab: &LabShared,
    ) -> Result<Custody, StationStartError> {
        let leases = &lab.leases;
        let shared = BackendUrl::parse(leases.default_url())
            .map_err(StationStartError::LeaseBackend)?
            .is_shared();
        if !shared {
            return Ok(match &lab.identities {
                Some(identities) => Custody::InLab(
                    identities.clone(),
                    Arc::new(OwnerGate::open_for_good(tokio::time::Instant::now())),
                ),
                None => Custody::Alone,
            });
        }
        let published = match config.ha.advertise_url.as_str() {
            "" => lab.published_url.clone(),
            url => url.trim_end_matches('/').to_owned(),
        };
        // A station of several is reached at its own base URL: where a standby points its
        // clients, and what tells this station's leases from its neighbours'.
        let published = match station_id {
            Some(id) => format!("{published}/stations/{id}"),
            None => published,
        };
        let me = owner_label(lab.pid, &published);
        let timing = config.link_owner_timing();
        let name = config.link_owner_key();
        // Each station of several its own state file (each is locked by its owner).
        let state_path = config
            .lease
            .link_owner_state_path()
            .map(|path| match station_id {
                Some(id) => crate::config::lab::station_file(&path, id),
                None => path,
            });
        let state = match state_path {
            Some(path) => Some(OwnerState::open(&path).map_err(LinkOwnerError::from)?),
            None => None,
        };
        if config.ha.mode == HaMode::Standby {
            return Ok(Custody::Standby(Standby {
                store: leases.default_store(),
                name: LinkOwnership::name_for(&name),
                me,
                timing,
                state,
                gate: Arc::new(OwnerGate::new(tokio::time::Instant::now())),
                role: Arc::new(HaRole::standby()),
                station_id: config.station_id(),
            }));
        }
        let claimed =
            LinkOwnership::claim(leases.default_store(), &name, me, timing, state).await?;
        Ok(Custody::Owner(claimed.with_station_id(config.station_id())))
    }

    /// Whether someone else may read what the station is owed (a restart, a standby, another
    /// gateway, another station of this one): then its ledger is kept, and read when the
    /// link meets it.
    pub(super) fn keeps_ledger(&self) -> bool {
        !matches!(self, Custody::Alone)
    }

    /// Whether this process stands by rather than owns the station.
    pub(super) fn standing_by(&self) -> bool {
        matches!(self, Custody::Standby(_))
    }

    /// Owner of the station, or a standby until it takes over.
    pub(super) fn role(&self) -> Arc<HaRole> {
        match self {
            Custody::Standby(watch) => watch.role.clone(),
            _ => Arc::new(HaRole::owner()),
        }
    }

    /// The gate the link checks before connecting and before every flush, also asked by
    /// every door that acts on the station.
    pub(super) fn gate(&self) -> Option<Arc<OwnerGate>> {
        match self {
            Custody::Alone => None,
            Custody::Owner(ownership) => Some(ownership.gate()),
            Custody::Standby(watch) => Some(watch.gate.clone()),
            Custody::InLab(_, gate) => Some(gate.clone()),
        }
    }

    /// Starts keeping the custody on `runtime`'s tasks: the lab's registry asked after each
    /// HELLO, the link-owner lease renewed (after a crash restart, the next grant held for the
    /// longest processing first), or a standby's watch.
    pub(super) async fn keep(self, runtime: &Arc<StationRuntime>) {
        let adopter = adopter_of(&runtime.lease);
        match self {
            Custody::Alone => {}
            Custody::InLab(identities, gate) => runtime.spawn(identities.serve(
                runtime.lab_station_id.clone().unwrap_or_default(),
                gate,
                Some(adopter),
                runtime.shutdown.clone(),
            )),
            Custody::Owner(ownership) => {
                if ownership.after_own_crash().await {
                    runtime
                        .lease
                        .after_a_crash(runtime.config.max_processing())
                        .await;
                }
                let keep = ownership
                    .with_adopter(adopter)
                    .keep(runtime.release.clone(), runtime.shutdown.clone());
                runtime.spawn_owner_task(keep);
            }
            Custody::Standby(watch) => {
                runtime.spawn_owner_task(stand_by(watch, runtime.clone(), runtime.release.clone()));
            }
        }
    }
}

/// A standby's life: watch the owner's link-owner lease until it lapses, take it, wait the
/// lock-delay (after a lapse), resume the control lease from the store (its holder keeps its
/// id and fence; a safe state owed is applied by the lease task once the link is up), and only
/// then serve, announcing the failover in the audit trail. From then on it owns the station
/// like any owner.
async fn stand_by(watch: Standby, runtime: Arc<StationRuntime>, release: CancellationToken) {
    let shutdown = runtime.shutdown.clone();
    let (me, retry) = (watch.me.clone(), watch.timing.renew_every);
    let Some(taken) = watch.until_lapsed(&shutdown).await else {
        return;
    };
    // Renewals (and the station identity's verdict the link waits for, which reads the
    // station's ledger once the control lease is resumed) go on meanwhile.
    let gate = taken.ownership.gate();
    let taken_back = taken.ownership.after_own_crash().await;
    let keep = taken
        .ownership
        .with_adopter(adopter_of(&runtime.lease))
        .keep(release, shutdown.clone());
    tokio::pin!(keep);
    let resumed = async {
        // After a lapse, the lock-delay first: a holder's request still queued at a paused old
        // owner may yet change the control lease in the store; it is read after that. Until
        // then requests are answered as by a standby.
        let mut reopenings = gate.reopenings();
        while !gate.owned_at(tokio::time::Instant::now()) {
            if reopenings.changed().await.is_err() {
                break;
            }
        }
        // A standby that took its own lease back after a crash (or found it lapsed, unreleased):
        // what the crashed run had at the station counts as in doubt, as at an owner's crash
        // restart.
        if taken_back {
            runtime
                .lease
                .after_a_crash(runtime.config.max_processing())
                .await;
        }
        while let Err(why) = runtime.lease.resume().await {
            tracing::warn!(
                "taking over: cannot resume the control lease from lease.backend ({why}); trying again"
            );
            tokio::time::sleep(retry).await;
        }
    };
    // In order, so that a simulation under one seed replays exactly.
    tokio::select! {
        biased;
        () = &mut keep => return,
        () = resumed => {}
    }
    let lease = runtime.lease.view();
    runtime
        .audit
        .note_change(crate::audit::lease_lines::failover_line(
            &me,
            taken.previous_owner.as_deref(),
            lease.owner.as_deref(),
            std::time::SystemTime::now(),
        ));
    runtime.ha.took_over();
    info!(
        previous = taken.previous_owner.as_deref().unwrap_or("unknown"),
        lapsed = taken.lapsed,
        "failover: this gateway owns the station now"
    );
    keep.await;
}

/// What reads the station's ledger and takes its duties over once the link met the station:
/// the control lease's [`ControlLease::adopt_station`].
fn adopter_of(lease: &Arc<ControlLease>) -> crate::lease::ledger::Adopter {
    let lease = lease.clone();
    Arc::new(move |identity: String| {
        let lease = lease.clone();
        Box::pin(async move { lease.adopt_station(&identity).await })
    })
}

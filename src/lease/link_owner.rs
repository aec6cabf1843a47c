//! One gateway per station: the link-owner lease (`link-owner:<control lease name>`) in a
//! shared lease backend. A gateway takes it at start and keeps it renewed while it runs; a
//! second gateway on the same station and backend finds it held and refuses to start, because
//! two gateways would each admit changes under their own view of the control lease. A gateway
//! that loses it (it could not renew it in time) stops, rather than go on touching a station
//! another gateway may now own.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::owner_state::{OwnerState, OwnerStateError};
use super::seconds_left;
use super::store::{AcquireRequest, Acquisition, LeaseStore, LeaseStoreError, LeaseToken};
use crate::link::OwnerGate;

/// How long the link-owner lease lives without renewal, by default.
pub const LINK_OWNER_TTL: Duration = Duration::from_secs(10);
/// The pause before trying again after a renewal failed while the lease is still ours.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(200);

/// The link-owner lease's timing, all from its TTL, in the manner of Patroni's
/// `loop_wait + 2 × retry_timeout ≤ ttl`: renewals every TTL/3, each given at most TTL/3 by
/// the store, and the link may send only until TTL − TTL/5 after the last confirmed renewal
/// was sent. So a gateway that cannot renew stops sending a fifth of the TTL before the store
/// lets another take the station, and a renewal that failed at its timeout is tried once more
/// before the link stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkOwnerTiming {
    pub ttl: Duration,
    pub renew_every: Duration,
    pub store_timeout: Duration,
    /// How long before the lease lapses in the store the link stops sending.
    pub margin: Duration,
}

impl LinkOwnerTiming {
    pub fn for_ttl(ttl: Duration) -> LinkOwnerTiming {
        LinkOwnerTiming {
            ttl,
            renew_every: ttl / 3,
            store_timeout: ttl / 3,
            margin: ttl / 5,
        }
    }

    /// Whether a renewal that fails at its timeout leaves time for another before the link
    /// must stop: `renew_every + store_timeout + retry pause < ttl − margin`, and a margin.
    pub fn holds(&self) -> bool {
        !self.margin.is_zero()
            && self.renew_every + self.store_timeout + RETRY_AFTER_FAILURE
                < self.ttl.saturating_sub(self.margin)
    }
}

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
    _state: Option<OwnerState>,
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
        let name = Self::name_for(control_name);
        let mut request = AcquireRequest::new(owner, timing.ttl);
        if let Some(kept) = state.as_mut().and_then(OwnerState::token) {
            request = request.with_retry_token(kept);
        }
        let asked_at = Instant::now();
        let acquired =
            tokio::time::timeout(timing.store_timeout, store.try_acquire(&name, request))
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
                    state.remember(&grant.token)?;
                }
                let gate = Arc::new(OwnerGate::new(asked_at));
                gate.renewed(asked_at, timing.ttl, timing.margin);
                Ok(LinkOwnership {
                    store,
                    name,
                    token: grant.token,
                    timing,
                    gate,
                    _state: state,
                })
            }
            Acquisition::HeldByOther(holder) => Err(LinkOwnerError::OwnedByOther {
                name,
                owner: holder.owner,
                expires_in: holder.expires_in,
            }),
        }
    }

    /// The gate the link checks before every frame (`LinkTask::with_owner_gate`).
    pub fn gate(&self) -> Arc<OwnerGate> {
        self.gate.clone()
    }

    /// Renews the lease until `shutdown`, then releases it. Each confirmed renewal opens the
    /// link's gate until TTL − margin after it was sent; a renewal that fails is tried again
    /// while the gate is open. When the gate closes (lost to another gateway, or the store
    /// unreachable or too slow), the link has already stopped sending: this logs why and
    /// cancels `stop_gateway`.
    pub async fn keep(self, shutdown: CancellationToken, stop_gateway: CancellationToken) {
        let timing = self.timing;
        let mut pause = timing.renew_every;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
            let asked_at = Instant::now();
            let renewal = self.store.refresh(&self.name, &self.token, None);
            let answer = match tokio::time::timeout(timing.store_timeout, renewal).await {
                Ok(answer) => answer.map_err(|why| why.to_string()),
                Err(_) => Err(format!(
                    "no answer within {} ms",
                    timing.store_timeout.as_millis()
                )),
            };
            match answer {
                Ok(Some(_)) => {
                    self.gate.renewed(asked_at, timing.ttl, timing.margin);
                    pause = timing.renew_every;
                }
                Ok(None) => {
                    self.gate.revoke();
                    error!(name = %self.name, "this gateway lost the station's link-owner lease (another gateway may own the station now): it sends the station nothing more, and stops");
                    stop_gateway.cancel();
                    return;
                }
                Err(why) if self.gate.owned_at(Instant::now()) => {
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
        // (The state file's lock goes with this task: a restart may take it at once.)
        if let Err(why) = self.store.release(&self.name, &self.token).await {
            warn!(name = %self.name, "could not release the link-owner lease ({why}); it lapses in {} s", timing.ttl.as_secs());
        }
    }
}

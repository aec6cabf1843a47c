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

use super::seconds_left;
use super::store::{AcquireRequest, Acquisition, LeaseStore, LeaseStoreError, LeaseToken};

/// How long the link-owner lease lives without renewal, and how often it is renewed.
pub const LINK_OWNER_TTL: Duration = Duration::from_secs(10);
const RENEW_EVERY: Duration = Duration::from_secs(3);

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
}

/// This gateway's hold on the station's link.
pub struct LinkOwnership {
    store: Arc<dyn LeaseStore>,
    name: String,
    token: LeaseToken,
}

impl LinkOwnership {
    /// The name of the link-owner lease for the control lease `control_name`.
    pub fn name_for(control_name: &str) -> String {
        format!("link-owner:{control_name}")
    }

    /// Takes the link-owner lease for `control_name` as `owner`, or says who holds it.
    pub async fn claim(
        store: Arc<dyn LeaseStore>,
        control_name: &str,
        owner: String,
    ) -> Result<LinkOwnership, LinkOwnerError> {
        let name = Self::name_for(control_name);
        let request = AcquireRequest::new(owner, LINK_OWNER_TTL);
        match store.try_acquire(&name, request).await? {
            Acquisition::Taken(grant) | Acquisition::Renewed(grant) => {
                info!(%name, fence = grant.fence, "this gateway owns the station's link");
                Ok(LinkOwnership {
                    store,
                    name,
                    token: grant.token,
                })
            }
            Acquisition::HeldByOther(holder) => Err(LinkOwnerError::OwnedByOther {
                name,
                owner: holder.owner,
                expires_in: holder.expires_in,
            }),
        }
    }

    /// Renews the lease until `shutdown`, then releases it. When it cannot be renewed before
    /// it would lapse (lost to another gateway, or the backend unreachable for its whole TTL),
    /// logs why and cancels `stop_gateway`.
    pub async fn keep(self, shutdown: CancellationToken, stop_gateway: CancellationToken) {
        let mut confirmed_at = Instant::now();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(RENEW_EVERY) => {}
            }
            let asked_at = Instant::now();
            match self.store.refresh(&self.name, &self.token, None).await {
                Ok(Some(_)) => confirmed_at = asked_at,
                Ok(None) => {
                    error!(name = %self.name, "this gateway lost the station's link-owner lease (another gateway may own the station now): stopping");
                    stop_gateway.cancel();
                    return;
                }
                Err(why)
                    if asked_at.duration_since(confirmed_at) + RENEW_EVERY < LINK_OWNER_TTL =>
                {
                    warn!(name = %self.name, "could not renew the link-owner lease ({why}); trying again");
                }
                Err(why) => {
                    error!(name = %self.name, "could not renew the link-owner lease before it lapses ({why}): stopping, since another gateway may take the station");
                    stop_gateway.cancel();
                    return;
                }
            }
        }
        if let Err(why) = self.store.release(&self.name, &self.token).await {
            warn!(name = %self.name, "could not release the link-owner lease ({why}); it lapses in {} s", LINK_OWNER_TTL.as_secs());
        }
    }
}

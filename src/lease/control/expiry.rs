//! The end of a control lease that ran out: the expiry task, then the safe state, the event
//! and the next in line, in that order.

use std::sync::Arc;

use station_protocol::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use super::{ControlLease, LiveLease, lock};
use crate::lease::LeaseView;

impl ControlLease {
    /// The expiry task: sleeps until the live lease's expiry or a change, then ends a lease
    /// that ran out (safe state, event, next in line). Returns on `shutdown`.
    pub async fn run_expiry(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let next_expiry = lock(&self.live).as_ref().map(|live| live.expires_at);
            let ran_out = async {
                match next_expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.expiry_changed.notified() => continue,
                () = ran_out => {}
            }
            let _transition = self.transitions.lock().await;
            self.settle_expiry().await;
        }
    }

    /// Ends a lease whose time ran out. Caller holds `transitions`.
    pub(super) async fn settle_expiry(&self) {
        let now = Instant::now();
        let ended = {
            let mut live = lock(&self.live);
            if live.as_ref().is_some_and(|l| !l.is_live(now)) {
                live.take()
            } else {
                None
            }
        };
        if let Some(ended) = ended {
            // End it in the store too, should the store's clock be a hair behind ours.
            if let Err(error) = self.store.release(&self.name, &ended.token).await {
                warn!("the lease store could not end the lease that ran out: {error}");
            }
            self.after_running_out(ended).await;
        }
    }

    /// Safe state, the event, then the next in line: in that order, before anyone else may
    /// take it. Caller holds `transitions`.
    pub(super) async fn after_running_out(&self, ended: LiveLease) {
        warn!(owner = %ended.owner, fence = ended.fence, "control lease ran out: {} did not renew it in time", ended.owner);
        self.counters.expired.inc();
        self.apply_safe_state(&ended).await;
        self.publish(LeaseView::nobody());
        self.hand_over().await;
    }

    async fn apply_safe_state(&self, ended: &LiveLease) {
        let Some(safe) = &self.safe_state else { return };
        if safe.writes.is_empty() {
            return;
        }
        let channels = safe.link.info().channels.clone();
        let mut items = Vec::with_capacity(safe.writes.len());
        for write in &safe.writes {
            let Some(channel) = channels.get(&write.channel) else {
                error!(channel = %write.channel, "safe state: the station has no channel {}", write.channel);
                continue;
            };
            match Value::parse_as(channel.value_type, &write.value, &channel.options) {
                Ok(value) => items.push((write.channel.clone(), value)),
                Err(why) => {
                    error!(channel = %write.channel, "safe state: bad value {:?}: {why}", write.value)
                }
            }
        }
        if items.is_empty() {
            return;
        }
        let names: Vec<String> = items.iter().map(|(name, _)| name.clone()).collect();
        match safe.link.write(items, None).await {
            Ok(results) => {
                for (name, result) in names.iter().zip(results) {
                    match result {
                        Ok(()) => warn!(
                            channel = %name,
                            owner = %ended.owner,
                            fence = ended.fence,
                            "safe state applied to {name} after {}'s lease ran out",
                            ended.owner
                        ),
                        Err(why) => {
                            error!(channel = %name, "safe state: the station refused {name}: {}", why.message)
                        }
                    }
                }
            }
            Err(why) => error!(
                "safe state could not be applied after {}'s lease ran out: {why}",
                ended.owner
            ),
        }
    }
}

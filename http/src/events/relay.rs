//! The relay: one task that turns the link's connection and configuration changes and the
//! lease's changes of hands into `connection`, `configuration` and `lease` events on every
//! open stream.

use std::sync::Arc;

use serde_json::json;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use super::Events;
use crate::lease::LeaseView;
use crate::link::LinkEvent;

/// Runs until `shutdown` (or until both sources are gone).
pub async fn run(
    events: Arc<Events>,
    mut link_events: broadcast::Receiver<LinkEvent>,
    mut lease_events: broadcast::Receiver<LeaseView>,
    shutdown: CancellationToken,
) {
    let (mut link_open, mut lease_open) = (true, true);
    while link_open || lease_open {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            event = link_events.recv(), if link_open => match event {
                Ok(event) => relay_link_event(&events, &event),
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!("the event relay fell {missed} link events behind; they are lost");
                }
                Err(RecvError::Closed) => link_open = false,
            },
            view = lease_events.recv(), if lease_open => match view {
                Ok(view) => match serde_json::to_string(&view) {
                    Ok(data) => events.broadcast("lease", &data),
                    Err(error) => tracing::warn!("cannot write a lease event: {error}"),
                },
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!("the event relay fell {missed} lease events behind; they are lost");
                }
                Err(RecvError::Closed) => lease_open = false,
            },
        }
    }
    shutdown.cancelled().await;
}

fn relay_link_event(events: &Events, event: &LinkEvent) {
    match event {
        LinkEvent::Connection {
            connected,
            generation,
            last_error,
        } => {
            let data = json!({ "isConnected": connected, "generation": generation, "lastError": last_error });
            events.broadcast("connection", &data.to_string());
        }
        LinkEvent::Configuration { change, generation } => {
            // `StreamStateDto`: every state event says whether the station is connected (a
            // configuration change comes on a live link: a relist, or a new connection).
            let connected = events.station().info().connected;
            let data = json!({
                "isConnected": connected,
                "changeType": change.label(),
                "generation": generation,
            });
            events.broadcast("configuration", &data.to_string());
        }
        LinkEvent::Notify(_) => {}
    }
}

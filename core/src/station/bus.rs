//! Bus transactions through the station service: one bus's transactions go to the link one at
//! a time, in the order they arrived, each under its admission's send guard, never retried and
//! never merged with another; and what the station said about supporting them at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use station_protocol::{BusRequest, ErrorCode};

use crate::lease::Admitted;
use crate::link::{LinkError, LinkHandle};

/// The per-bus queues and the station's answer on support, shared by every clone of the
/// station service.
#[derive(Debug, Default)]
pub(super) struct BusLanes {
    /// One lane per bus channel. tokio's mutex hands its lock over in the order it was asked
    /// for, so a lane is a first-in, first-out queue of that bus's transactions.
    lanes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The link generation in which the station answered BUS with `unsupported`.
    unsupported_in: Mutex<Option<u64>>,
}

impl BusLanes {
    pub(super) fn lane(&self, channel: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        lanes.entry(channel.to_owned()).or_default().clone()
    }

    /// Runs one transaction on `link` once every earlier one on the same bus was answered.
    pub(super) async fn run(
        &self,
        link: &LinkHandle,
        request: BusRequest,
        admitted: &Admitted,
    ) -> Result<Bytes, LinkError> {
        let lane = self.lane(&request.channel);
        let _turn = lane.lock().await;
        let generation = link.info().generation;
        let result = link.bus(request, admitted.guard.clone()).await;
        if let Err(LinkError::Station(error)) = &result
            && error.code == ErrorCode::Unsupported
        {
            self.unsupported_since(generation);
        }
        result
    }

    /// The station answered a bus transaction `unsupported` on the connection of `generation`.
    pub(super) fn unsupported_since(&self, generation: u64) {
        *self
            .unsupported_in
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(generation);
    }

    /// False once the station, on the link's current connection (`generation`), answered a
    /// bus transaction with `unsupported`.
    pub(super) fn supported(&self, generation: u64) -> bool {
        let unsupported_in = *self
            .unsupported_in
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        unsupported_in != Some(generation)
    }
}

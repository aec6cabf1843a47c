//! Bus transactions through the station service: one bus's transactions go to the link one at
//! a time, in the order they arrived, each under its admission's send guard, never retried and
//! never merged with another; and what the station said about supporting them at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use station_protocol::{BusRequest, ErrorCode};

use super::Station;
use crate::lease::Admitted;
use crate::link::LinkError;

/// The per-bus queues and the station's answer on support, shared by every clone of a
/// [`Station`].
#[derive(Debug, Default)]
pub(super) struct BusLanes {
    /// One lane per bus channel. tokio's mutex hands its lock over in the order it was asked
    /// for, so a lane is a first-in, first-out queue of that bus's transactions.
    lanes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The link generation in which the station answered BUS with `unsupported`.
    unsupported_in: Mutex<Option<u64>>,
}

impl BusLanes {
    fn lane(&self, channel: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        lanes.entry(channel.to_owned()).or_default().clone()
    }
}

impl Station {
    /// Runs one bus transaction: after every earlier transaction on the same bus has been
    /// answered, sent once under the admission's send guard. The bytes are what the station
    /// received, as many as it says, never padded.
    pub async fn bus(&self, request: BusRequest, admitted: &Admitted) -> Result<Bytes, LinkError> {
        let lane = self.buses.lane(&request.channel);
        let _turn = lane.lock().await;
        let generation = self.info().generation;
        let result = self.link.bus(request, admitted.guard.clone()).await;
        if let Err(LinkError::Station(error)) = &result
            && error.code == ErrorCode::Unsupported
        {
            *self
                .buses
                .unsupported_in
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(generation);
        }
        result
    }

    /// False once the station, on its current connection, answered a bus transaction with
    /// `unsupported` (firmware without BUS); true until then.
    pub fn bus_supported(&self) -> bool {
        let unsupported_in = *self
            .buses
            .unsupported_in
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        unsupported_in != Some(self.info().generation)
    }
}

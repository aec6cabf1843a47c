//! RESET (SPEC.md §6.10) as the simulated station does it: the reply goes out first, then the
//! station's application restarts: every connection is dropped and the station comes back in
//! its power-on state (outputs off, settings at their defaults), accepting connections again
//! at once. A profile with `reset = false` answers ERROR unsupported and changes nothing.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use station_protocol::{ErrorCode, Opcode, RawFrame, Reset, Response, StationError};

use crate::shared::Shared;
use crate::station::Station;
use tokio::time::Instant;

/// The answer to a RESET: the empty reply, or ERROR unsupported for a station without it.
pub(crate) fn respond(shared: &Shared, reset: &Reset) -> Response {
    if !shared.profile.station.reset {
        return Response::Error(StationError::new(
            ErrorCode::Unsupported,
            "this station cannot restart its application (reset = false in its profile)",
        ));
    }
    tracing::info!(requester = %reset.requester, "RESET: restarting once the reply is sent");
    Response::Reset
}

/// Whether `frame` is the reply after which the station restarts.
pub(crate) fn is_reset_reply(frame: &RawFrame) -> bool {
    frame.opcode == Opcode::ResetReply as u8
}

/// Restarts the application, after the RESET reply was written: connections dropped, state
/// back to power-on.
pub(crate) fn restart(shared: &Arc<Shared>) {
    shared.stats.resets.fetch_add(1, Ordering::SeqCst);
    shared.drop_connections();
    let fresh = Station::power_on(&shared.profile, Instant::now());
    let mut station = shared.lock_station();
    let old = std::mem::replace(&mut *station, fresh);
    station.carry_read_counts_from(old);
}

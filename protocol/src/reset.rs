//! The payload of RESET (`09`, SPEC.md §6.10): restart the station's application. The request
//! names who asks, for the station's log; the reply is empty and is sent before the station
//! drops its connections to restart.

use bytes::BytesMut;

use crate::wire::{PayloadError, Reader, Writer};

/// A RESET request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    /// Who asks, for the station's log (e.g. `station-gateway`).
    pub requester: String,
}

pub(crate) fn put(out: &mut BytesMut, reset: &Reset) {
    out.put_string(&reset.requester);
}

pub(crate) fn get(r: &mut Reader) -> Result<Reset, PayloadError> {
    Ok(Reset {
        requester: r.at("reset requester").string()?,
    })
}

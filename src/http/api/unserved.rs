//! The documented WebApi paths this gateway answers with 501 on purpose: those a station behind
//! the byte protocol cannot offer, and those other work will serve. A client gets a message
//! saying which and why, never a 404 it would read as "no such file" or "no result yet".

use super::call::{Answer, Call};
use crate::error::ApiError;

/// Why an endpoint of the documented WebApi answers 501.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unserved {
    /// A station behind the byte protocol has nothing of the kind (what it lacks).
    ByteProtocol(&'static str),
    /// Not served by this gateway yet (what, and the issue that builds it).
    NotYet(&'static str, u32),
}

// What a byte-protocol station does not have.
pub(crate) const FILES: Unserved = Unserved::ByteProtocol("file store");
pub(crate) const FIRMWARE: Unserved = Unserved::ByteProtocol("firmware updates");
pub(crate) const SYSTEM: Unserved =
    Unserved::ByteProtocol("system services, boot configuration or a clock to set");
pub(crate) const MEDIA: Unserved = Unserved::ByteProtocol("media store");
pub(crate) const CALIBRATION: Unserved = Unserved::ByteProtocol("calibration tables");
pub(crate) const ENCODED: Unserved =
    Unserved::ByteProtocol("channels in the binary TelemetryConfiguration encoding");
pub(crate) const MODULE_LOADING: Unserved =
    Unserved::ByteProtocol("software modules to load, unload or configure");
pub(crate) const SOCKET: Unserved = Unserved::ByteProtocol("socket (TCP/IP) transactions");
pub(crate) const INSTRUMENTS: Unserved =
    Unserved::ByteProtocol("instrument types or function maps in its channel descriptors");

impl Unserved {
    /// The 501 for `label` (`POST api/comm/i2c`).
    pub(crate) fn error(self, label: &str) -> ApiError {
        ApiError::not_implemented(match self {
            Unserved::ByteProtocol(what) => format!(
                "{label} is not offered: the gateway in front of a byte-protocol station does \
                 not offer it (the station has no {what})"
            ),
            Unserved::NotYet(what, issue) => {
                format!("{label} is not yet served by this gateway ({what}: issue {issue})")
            }
        })
    }
}

/// The handler of every unserved endpoint: its 501.
pub(super) async fn answer(call: Call<'_>) -> Answer {
    let unserved = call
        .unserved
        .unwrap_or(Unserved::NotYet("this endpoint", 17));
    Err(unserved.error(call.label))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_why() {
        let error = FILES.error("GET api/files");
        assert_eq!(error.kind, crate::error::ErrorKind::NotOffered);
        assert!(
            error
                .message
                .contains("the gateway in front of a byte-protocol station does not offer it"),
            "{}",
            error.message
        );
        assert!(
            error.message.starts_with("GET api/files"),
            "{}",
            error.message
        );
    }
}

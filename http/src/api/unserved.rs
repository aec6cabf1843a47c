//! The documented WebApi paths this gateway does not serve, on purpose: those a station behind
//! the byte protocol cannot offer answer 404 as a WebApi without the group does (the .NET
//! client's `docs/error-handling.md`: 404 for what does not exist), with the reason in the body,
//! so it never reads as "no such file" or "no result yet"; those other work will serve answer
//! 501. Neither client asks `capabilities` before a call (accordionq2 5.28.1 has no call of it;
//! the .NET client's `CapabilitiesGroup.cs` at 946d679 offers it to the caller, and answers its
//! own 404 as "no features"): a caller learns of a missing group from this 404.

use super::call::{Answer, Call};
use crate::error::ApiError;

/// Why an endpoint of the documented WebApi is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unserved {
    /// A station behind the byte protocol has nothing of the kind (what it lacks).
    ByteProtocol(&'static str),
    /// Not served by this gateway yet (what).
    NotYet(&'static str),
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
    /// The answer for `label` (`GET api/files`): 404 with why for what the station cannot
    /// offer, 501 for what is not served yet.
    pub(crate) fn error(self, label: &str) -> ApiError {
        match self {
            Unserved::ByteProtocol(what) => ApiError::area_not_offered(format!(
                "{label} is not offered by a station reached over the byte protocol (it has no \
                 {what}); GET api/capabilities lists what is"
            )),
            Unserved::NotYet(what) => ApiError::not_implemented(format!(
                "{label} is not yet served by this gateway ({what})"
            )),
        }
    }
}

/// The handler of every unserved endpoint: its 404 (or 501) saying why.
pub(super) async fn answer(call: Call<'_>) -> Answer {
    let unserved = call.unserved.unwrap_or(Unserved::NotYet("this endpoint"));
    Err(unserved.error(call.label))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_why() {
        let error = FILES.error("GET api/files");
        assert_eq!(error.kind, crate::error::ErrorKind::AreaNotOffered);
        assert_eq!(crate::error::http_status(error.kind).as_u16(), 404);
        assert!(
            error
                .message
                .contains("is not offered by a station reached over the byte protocol"),
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

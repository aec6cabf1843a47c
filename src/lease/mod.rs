//! The control lease: who may change the station. What others see of it is a [`LeaseView`].

use serde::Serialize;

/// The lease as anyone may see it (never the lease id): `GET lease` and the `lease` event.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    pub held: bool,
    pub owner: Option<String>,
    pub expires_in_ms: u64,
    /// When the current holder took it (RFC 3339, UTC); `None` while nobody holds it.
    pub since: Option<String>,
}

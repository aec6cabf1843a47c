//! What the control lease tells whoever keeps a record of it (the audit trail): a small
//! callback, called in the moment of each change of hands, that must not block.

use std::net::SocketAddr;
use std::sync::Arc;

/// One change of the control lease, named by owner and fence (never by its id: a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseNotice<'a> {
    Taken {
        owner: &'a str,
        fence: u64,
    },
    Released {
        owner: &'a str,
        fence: u64,
    },
    /// It ran out without being released.
    RanOut {
        owner: &'a str,
        fence: u64,
    },
    /// Broken by an admin from `peer`.
    Broken {
        owner: &'a str,
        fence: u64,
        peer: SocketAddr,
    },
    /// A safe stop pressed by `by` for `reason`, and the lease it ended (owner, fence), if any.
    SafeStopped {
        by: &'a str,
        reason: &'a str,
        lease: Option<(&'a str, u64)>,
    },
    /// The safe state after `owner`'s lease: `Ok` confirmed by the station, `Err` why not.
    SafeState {
        owner: &'a str,
        fence: u64,
        result: Result<(), &'a str>,
    },
}

/// The callback [`super::ControlLease::with_notices`] installs.
pub type LeaseNoticeHook = Arc<dyn Fn(LeaseNotice<'_>) + Send + Sync>;

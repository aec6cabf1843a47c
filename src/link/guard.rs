//! The send guard: the check the link task runs just before a change goes on the wire, with the
//! lease fence the change was admitted under.

use std::sync::Arc;

/// A check run by the link task just before a change is put on the wire; an `Err` refuses it
/// with [`LinkError::Refused`] and it is never sent. This is where lease fencing happens.
///
/// It carries the lease fence the change was admitted under, so the link knows which changes
/// of a given lease are still at the station.
#[derive(Clone)]
pub struct SendGuard {
    fence: Option<u64>,
    check: Arc<GuardCheck>,
}

type GuardCheck = dyn Fn() -> Result<(), String> + Send + Sync;

impl SendGuard {
    /// A guard for a change admitted under the lease with `fence` (`None`: nobody held it).
    pub fn new(
        fence: Option<u64>,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> SendGuard {
        SendGuard {
            fence,
            check: Arc::new(check),
        }
    }

    /// The lease fence the change was admitted under.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Whether the change may still be sent; the reason it may not.
    pub fn check(&self) -> Result<(), String> {
        (self.check)()
    }
}

/// Calling a guard runs its check, as when it was a plain closure.
impl std::ops::Deref for SendGuard {
    type Target = GuardCheck;

    fn deref(&self) -> &GuardCheck {
        &*self.check
    }
}

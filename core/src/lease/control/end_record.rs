//! The end of a control lease as the lease store keeps it, so that a restart or a standby that
//! takes over knows what the gateway before it knew: `<lease name>:end-pending` (a lease was
//! taken and its end is not recorded yet) and `<lease name>:lock-delay` (the lock-delay in
//! force: after whose lease, its fence and why, as JSON in the owner text; it lasts what the
//! delay has left, timed by the store's own clock). Both are named leases, so every backend
//! (memory, SQLite, PostgreSQL, Redis) keeps them alike.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::super::LeaseStoreError;
use super::super::store::{AcquireRequest, Acquisition};
use super::ControlLease;
use super::state::{LockDelayWhy, StoredEnd, StoredLockDelay};

/// How long the store remembers that a lease's end is pending (a lease held longer than this
/// without a renewal of the mark would be forgotten: the same bound as the safe-state mark).
const END_PENDING_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The lock-delay's record in the store's owner text.
#[derive(Debug, Serialize, Deserialize)]
struct LockDelayText {
    after: String,
    fence: u64,
    why: String,
}

/// The record of `delay` as the owner text of `<name>:lock-delay`.
fn lock_delay_text(delay: &StoredLockDelay) -> String {
    let text = LockDelayText {
        after: delay.after.clone(),
        fence: delay.fence,
        why: delay.why.code().to_owned(),
    };
    serde_json::to_string(&text).unwrap_or_else(|_| String::from("{}"))
}

/// The lock-delay an owner text records, with `left` by the store's clock. Text this version
/// cannot read still delays (for an unknown reason, after an unknown holder).
fn lock_delay_from_text(text: &str, left: Duration) -> StoredLockDelay {
    match serde_json::from_str::<LockDelayText>(text) {
        Ok(text) => StoredLockDelay {
            after: text.after,
            fence: text.fence,
            why: LockDelayWhy::from_code(&text.why),
            left,
        },
        Err(_) => StoredLockDelay {
            after: "an unknown holder".into(),
            fence: 0,
            why: LockDelayWhy::LostTrack,
            left,
        },
    }
}

/// `left` in whole milliseconds, rounded up (a store keeps milliseconds; never 0).
fn store_ttl(left: Duration) -> Duration {
    let millis = u64::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
    Duration::from_millis(millis.max(1))
}

impl ControlLease {
    fn end_pending_name(&self) -> String {
        format!("{}:end-pending", self.name)
    }

    fn lock_delay_name(&self) -> String {
        format!("{}:lock-delay", self.name)
    }

    /// What the store keeps of the last lease's end: the lock-delay in force and whether an
    /// end is pending (for a restart or a takeover, while the store holds no live lease).
    pub(super) async fn stored_end(&self) -> Result<StoredEnd, LeaseStoreError> {
        let lock_delay = self
            .store
            .current(&self.lock_delay_name())
            .await?
            .map(|record| lock_delay_from_text(&record.owner, record.expires_in));
        let end_pending = self
            .store
            .current(&self.end_pending_name())
            .await?
            .map(|mark| mark.owner);
        Ok(StoredEnd {
            lock_delay,
            end_pending,
        })
    }

    /// Marks in the store that `owner`'s lease, about to be taken, has an end pending. A mark
    /// left by an earlier end (one whose clearing failed) is replaced.
    pub(super) async fn mark_end_pending(&self, owner: &str) -> Result<(), LeaseStoreError> {
        let name = self.end_pending_name();
        let request = AcquireRequest::new(owner.to_owned(), END_PENDING_TTL);
        if !matches!(
            self.store.try_acquire(&name, request.clone()).await?,
            Acquisition::HeldByOther(_)
        ) {
            return Ok(());
        }
        if let Some(stale) = self.store.current(&name).await? {
            self.store.release(&name, &stale.token).await?;
        }
        match self.store.try_acquire(&name, request).await? {
            Acquisition::HeldByOther(_) => Err(LeaseStoreError::Backend(format!(
                "{name} is held by another writer: the lease's end cannot be marked pending"
            ))),
            Acquisition::Taken(_) | Acquisition::Renewed(_) => Ok(()),
        }
    }

    /// Records a lease's end: the lock-delay it owes (kept until it is over by the store's
    /// clock), then clears the mark that an end is pending. Should the delay not be written,
    /// the mark stays, and a restart waits the whole lock-delay: the safe side.
    pub(super) async fn store_end(&self, lock_delay: Option<StoredLockDelay>) {
        if let Some(delay) = lock_delay
            && let Err(error) = self.write_lock_delay(&delay).await
        {
            warn!(
                "the lease store could not record the lock-delay after {}'s lease ({} ms left): {error}; a restart would wait the whole lock-delay",
                delay.after,
                delay.left.as_millis()
            );
            return;
        }
        let name = self.end_pending_name();
        let cleared = async {
            if let Some(mark) = self.store.current(&name).await? {
                self.store.release(&name, &mark.token).await?;
            }
            Ok::<(), LeaseStoreError>(())
        };
        if let Err(error) = cleared.await {
            warn!(
                "the lease store could not clear its mark that a lease's end is pending: {error}; a restart would wait the lock-delay"
            );
        }
    }

    /// Writes `delay` as `<name>:lock-delay`, unless one that lasts at least as long is there.
    async fn write_lock_delay(&self, delay: &StoredLockDelay) -> Result<(), LeaseStoreError> {
        let name = self.lock_delay_name();
        let ttl = store_ttl(delay.left);
        if let Some(old) = self.store.current(&name).await? {
            if old.expires_in >= ttl {
                return Ok(());
            }
            self.store.release(&name, &old.token).await?;
        }
        let request = AcquireRequest::new(lock_delay_text(delay), ttl);
        match self.store.try_acquire(&name, request).await? {
            Acquisition::HeldByOther(_) => Err(LeaseStoreError::Backend(format!(
                "{name} was written by another writer meanwhile"
            ))),
            Acquisition::Taken(_) | Acquisition::Renewed(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_delay_reads_back_as_written_and_unreadable_text_still_delays() {
        let delay = StoredLockDelay {
            after: "TAT \"station\" 3".into(),
            fence: 17,
            why: LockDelayWhy::ChangesInDoubt,
            left: Duration::from_millis(1234),
        };
        let text = lock_delay_text(&delay);
        assert_eq!(lock_delay_from_text(&text, delay.left), delay);
        let unread = lock_delay_from_text("not json", Duration::from_secs(2));
        assert_eq!(unread.why, LockDelayWhy::LostTrack);
        assert_eq!(unread.left, Duration::from_secs(2));
    }

    #[test]
    fn the_stores_ttl_is_the_time_left_rounded_up_to_a_millisecond() {
        assert_eq!(
            store_ttl(Duration::from_millis(1500)),
            Duration::from_millis(1500)
        );
        assert_eq!(
            store_ttl(Duration::from_micros(1_500_001)),
            Duration::from_millis(1501)
        );
        assert_eq!(store_ttl(Duration::from_nanos(1)), Duration::from_millis(1));
    }
}

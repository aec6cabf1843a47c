//! The one decision every row-based backend (memory, SQLite, Postgres) makes when someone asks
//! for a lease or a semaphore slot: renew the caller's own, take a free slot with a new fence,
//! or name who holds it. Backends read the rows and the clock, call [`plan_acquire`], and write
//! what it says, all inside one critical section (a mutex, `BEGIN IMMEDIATE`, `FOR UPDATE`).
//!
//! Times are whole milliseconds on the backend's own clock (the database's for SQL), so that
//! clock skew between hosts never enters a comparison.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store::terms::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseHolder, LeaseKind, LeaseStoreError, LeaseToken,
};

/// One row of `sm_lease` (or its in-memory twin): one slot of one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRow {
    pub slot: i64,
    /// The token of whoever last held this slot (empty: never held).
    pub holder: String,
    pub owner: String,
    pub fence: i64,
    /// Milliseconds since the Unix epoch on the backend's clock; past means free.
    pub expires_at: i64,
    pub ttl_ms: i64,
    pub since: i64,
    /// For a semaphore: the slots it was taken with (0: unknown, a row from before this was
    /// kept). Every live holder's is the same: the capacity in force.
    pub capacity: i64,
}

impl SlotRow {
    pub(crate) fn is_live(&self, now: i64) -> bool {
        self.slot >= 0 && !self.holder.is_empty() && self.expires_at > now
    }

    /// The row as its holder sees it.
    pub(crate) fn grant(&self, now: i64) -> LeaseGrant {
        LeaseGrant {
            token: LeaseToken::from_text(self.holder.clone()),
            owner: self.owner.clone(),
            fence: u64::try_from(self.fence).unwrap_or(0),
            ttl: millis_to_duration(self.ttl_ms),
            expires_in: millis_to_duration(self.expires_at - now),
            since: UNIX_EPOCH + millis_to_duration(self.since),
            slot: u32::try_from(self.slot).unwrap_or(0),
        }
    }

    pub(crate) fn holder(&self, now: i64) -> LeaseHolder {
        LeaseHolder::from(self.grant(now))
    }
}

/// What a backend writes for one acquisition attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquirePlan {
    /// The caller's token holds `row.slot`: write its new expiry and TTL.
    Renew(SlotRow),
    /// Write `row` (a free slot, now the caller's) and set the name's fence counter to
    /// `row.fence` (the same row for an exclusive lease, slot -1 for a semaphore).
    Take(SlotRow),
    /// Nobody's row changes.
    Refuse(LeaseHolder),
    /// A semaphore asked for with other slots than its live holders took it with: nobody's row
    /// changes.
    CapacityConflict {
        /// The holders' capacity.
        in_force: i64,
    },
}

impl AcquirePlan {
    /// The answer once the plan is written.
    pub(crate) fn outcome(
        &self,
        kind: LeaseKind,
        now: i64,
    ) -> Result<Acquisition, LeaseStoreError> {
        Ok(match self {
            AcquirePlan::Renew(row) => Acquisition::Renewed(row.grant(now)),
            AcquirePlan::Take(row) => Acquisition::Taken(row.grant(now)),
            AcquirePlan::Refuse(holder) => Acquisition::HeldByOther(holder.clone()),
            AcquirePlan::CapacityConflict { in_force } => {
                return Err(LeaseStoreError::CapacityConflict {
                    in_force: u32::try_from(*in_force).unwrap_or(u32::MAX),
                    asked: kind.slots(),
                });
            }
        })
    }
}

/// The slot of row that keeps a semaphore's fence counter.
pub(crate) const SEMAPHORE_COUNTER_SLOT: i64 = -1;

/// Decides one acquisition. `rows` are the name's slot rows (slot 0 and up, any order, possibly
/// expired or never held); `last_fence` is the name's fence counter; `now` and `wall_now` are
/// the backend's clock (they differ only in memory, where expiry runs on a monotonic clock).
pub(crate) fn plan_acquire(
    kind: LeaseKind,
    rows: &[SlotRow],
    last_fence: i64,
    now: i64,
    wall_now: i64,
    request: &AcquireRequest,
) -> AcquirePlan {
    let ttl_ms = duration_to_millis(request.ttl);
    let live: Vec<&SlotRow> = rows.iter().filter(|row| row.is_live(now)).collect();
    let slots = i64::from(kind.slots());
    if kind.is_semaphore() {
        let in_force = live
            .iter()
            .map(|row| row.capacity)
            .find(|capacity| *capacity > 0 && *capacity != slots);
        if let Some(in_force) = in_force {
            return AcquirePlan::CapacityConflict { in_force };
        }
    }
    if let Some(mine) = live.iter().find(|row| request.is_own(&row.holder)) {
        // The holder's own words about itself replace the old ones, in the same write: an
        // acquire with the holder's token is also how a holder rewrites its owner text at once.
        return AcquirePlan::Renew(SlotRow {
            expires_at: now + ttl_ms,
            ttl_ms,
            owner: request.owner.clone(),
            ..(*mine).clone()
        });
    }
    let soonest = || {
        live.iter()
            .min_by_key(|row| row.expires_at)
            .map(|row| row.holder(now))
    };
    let free_slot = (0..slots).find(|slot| !live.iter().any(|row| row.slot == *slot));
    let (true, Some(slot)) = (
        i64::try_from(live.len()).unwrap_or(i64::MAX) < slots,
        free_slot,
    ) else {
        return AcquirePlan::Refuse(soonest().unwrap_or_else(LeaseHolder::unknown));
    };
    AcquirePlan::Take(SlotRow {
        slot,
        holder: request.fresh_token().as_str().to_owned(),
        owner: request.owner.clone(),
        fence: last_fence.max(0) + 1,
        expires_at: now + ttl_ms,
        ttl_ms,
        since: wall_now,
        capacity: slots,
    })
}

pub(crate) fn duration_to_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX / 4)
}

pub(crate) fn millis_to_duration(millis: i64) -> Duration {
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

/// Wall-clock milliseconds since the Unix epoch (memory backend's display time).
pub(crate) fn wall_millis(time: SystemTime) -> i64 {
    duration_to_millis(time.duration_since(UNIX_EPOCH).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(owner: &str) -> AcquireRequest {
        AcquireRequest::new(owner, Duration::from_millis(100))
    }

    fn row(slot: i64, holder: &str, fence: i64, expires_at: i64) -> SlotRow {
        SlotRow {
            slot,
            holder: holder.into(),
            owner: holder.to_uppercase(),
            fence,
            expires_at,
            ttl_ms: 100,
            since: 0,
            capacity: 0,
        }
    }

    #[test]
    fn a_free_or_expired_slot_is_taken_with_the_next_fence() {
        let plan = plan_acquire(
            LeaseKind::Exclusive,
            &[row(0, "a", 7, 1000)],
            7,
            1000,
            5,
            &ask("C"),
        );
        let AcquirePlan::Take(taken) = plan else {
            panic!("{plan:?}")
        };
        assert_eq!((taken.slot, taken.fence, taken.expires_at), (0, 8, 1100));
    }

    #[test]
    fn a_semaphore_takes_the_lowest_free_slot_and_refuses_when_full() {
        let kind = LeaseKind::Semaphore { slots: 3 };
        let rows = [
            row(0, "a", 1, 2000),
            row(1, "b", 2, 1500),
            row(2, "c", 3, 10),
        ];
        let plan = plan_acquire(kind, &rows, 3, 1000, 0, &ask("D"));
        assert!(matches!(plan, AcquirePlan::Take(ref r) if r.slot == 2 && r.fence == 4));
        let rows = [
            row(0, "a", 1, 2000),
            row(1, "b", 2, 1500),
            row(2, "c", 3, 1200),
        ];
        let plan = plan_acquire(kind, &rows, 3, 1000, 0, &ask("D"));
        assert!(matches!(plan, AcquirePlan::Refuse(ref h) if h.owner == "C" && h.slot == 2));
        // A holder in a slot beyond a smaller N still counts.
        let rows = [row(5, "z", 9, 2000)];
        let kind = LeaseKind::Semaphore { slots: 1 };
        let plan = plan_acquire(kind, &rows, 9, 1000, 0, &ask("D"));
        assert!(matches!(plan, AcquirePlan::Refuse(_)));
    }

    #[test]
    fn a_semaphores_capacity_is_its_live_holders_and_free_once_they_are_gone() {
        let holder = SlotRow {
            capacity: 1,
            ..row(0, "a", 1, 2000)
        };
        let many = LeaseKind::Semaphore { slots: 1000 };
        let plan = plan_acquire(many, std::slice::from_ref(&holder), 1, 1000, 0, &ask("D"));
        assert_eq!(plan, AcquirePlan::CapacityConflict { in_force: 1 });
        let error = plan.outcome(many, 1000).unwrap_err().to_string();
        assert!(
            error.contains("has 1 slots") && error.contains("slots=1000"),
            "{error}"
        );
        // Its holder gone (expired), the next one sets the capacity.
        let plan = plan_acquire(many, &[holder], 1, 3000, 0, &ask("D"));
        assert!(matches!(plan, AcquirePlan::Take(ref r) if r.capacity == 1000));
    }

    #[test]
    fn the_callers_own_live_token_renews_its_slot() {
        let rows = [row(0, "a", 1, 2000), row(1, "b", 2, 1500)];
        let kind = LeaseKind::Semaphore { slots: 2 };
        let retry = ask("B").with_retry_token(LeaseToken::from_text("b"));
        let plan = plan_acquire(kind, &rows, 2, 1000, 0, &retry);
        assert!(
            matches!(plan, AcquirePlan::Renew(ref r) if r.slot == 1 && r.fence == 2 && r.expires_at == 1100)
        );
    }

    #[test]
    fn a_retry_token_that_holds_nothing_takes_with_a_fresh_random_token() {
        let kind = LeaseKind::Exclusive;
        let chosen = ask("D").with_retry_token(LeaseToken::from_text("1"));
        let plan = plan_acquire(kind, &[row(0, "a", 1, 10)], 1, 1000, 0, &chosen);
        let AcquirePlan::Take(taken) = plan else {
            panic!("{plan:?}")
        };
        assert_eq!(taken.holder, chosen.fresh_token().as_str());
        assert_ne!(taken.holder, "1");
        // Every attempt of one request is one caller: its own fresh token renews.
        let plan = plan_acquire(kind, &[taken], 2, 1000, 0, &chosen);
        assert!(matches!(plan, AcquirePlan::Renew(_)));
    }
}

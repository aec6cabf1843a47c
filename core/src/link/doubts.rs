//! The station's book of changes in doubt: sent, never answered, and so possibly still carried
//! out by the station until `station.max_processing_ms` after they were sent (SPEC.md §4). It
//! belongs to the link task, not to a connection: a change sent on a connection that ended is
//! still in doubt, for a station on a serial line never sees a close, and a station that
//! ignores one carries the change out anyway. Only its late answer (on the connection it was
//! sent on) or time settles a doubt. Pure: the instants are passed in.
//!
//! A doubt that outlives its bound unanswered *lapses*: by the station's contract it was carried
//! out or never will be, but the gateway cannot tell which, and a station that breaks the
//! contract may still carry it out. The book remembers when the last doubt of each fence lapsed
//! until a settle of that fence takes it: the lease machine starts the lock-delay from it. The
//! lapses are published with the doubts ([`AtStation`]), so that the station's ledger keeps
//! that lock-delay from the lapse on: a clean stop, a restart or a handover before the next
//! grant does not lose it.

use std::collections::HashMap;

use tokio::time::Instant;

/// The fence of a change whose lease is not known: one a gateway before this one left at the
/// station (a crashed run of this gateway, or a gateway that served the station under another
/// control lease, whose fences are not this one's). Every settle waits for it.
pub const ANY_FENCE: u64 = u64::MAX;

/// Whose changes a settle waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleScope {
    /// The changes admitted under one lease fence ([`FREE_FENCE`]: while nobody
    /// held the lease), at a lease's end.
    Fence(u64),
    /// Every change of every fence, before a new lease is granted: whatever is still at the
    /// station, from a lease, from no lease or from a gateway before this one.
    Every,
}

impl SettleScope {
    /// Whether a change admitted under `fence` is among those this scope waits for.
    pub fn covers(self, fence: u64) -> bool {
        match self {
            SettleScope::Fence(waited) => waited == fence || fence == ANY_FENCE,
            SettleScope::Every => true,
        }
    }
}

/// The fence key of a change admitted while nobody held the lease (lease fences start at 1).
pub const FREE_FENCE: u64 = 0;

/// Hole put back (reintroduce-holes only): a grant's settle does not wait for a lease-less
/// change left in doubt.
fn lease_less_doubt_ignored(scope: SettleScope, fence: u64) -> bool {
    scope == SettleScope::Every && fence == FREE_FENCE && crate::holes::active("lease-less-doubt")
}

/// One change in doubt: its fence, and the instant after which the station can no longer
/// carry it out by its contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doubt {
    pub fence: u64,
    pub until: Instant,
}

/// What lapsed at one instant ([`DoubtBook::lapse`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lapsed {
    /// The fences of the doubts sent on the current connection, one per change.
    pub current: Vec<u64>,
    /// The fences of the doubts of connections that ended (or inherited), one per change.
    pub orphaned: Vec<u64>,
}

/// The doubts of one fence last lapsed at `at`, and no settle has taken that yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lapse {
    pub fence: u64,
    pub at: Instant,
}

/// What the book publishes for the station's ledger: the changes in doubt, and the lapses no
/// settle has taken yet (the lock-delay runs from them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AtStation {
    pub doubts: Vec<Doubt>,
    pub lapsed: Vec<Lapse>,
}

/// The changes in doubt of one station, across its connections.
#[derive(Debug, Default)]
pub struct DoubtBook {
    /// Doubts sent on the current connection, by request id: a late answer settles one.
    current: HashMap<u32, Doubt>,
    /// Doubts of connections that ended, and those inherited from a gateway before this one:
    /// nothing can answer them any more, only time settles them.
    orphaned: Vec<Doubt>,
    /// When a doubt of each fence last lapsed unanswered, until a settle of it takes it.
    lapsed: HashMap<u64, Instant>,
    /// Bumped whenever the doubts change, so that whoever records them knows when to.
    version: u64,
}

impl DoubtBook {
    /// Request `id` of the current connection, a change of `fence`, timed out unanswered: in
    /// doubt until `until`.
    pub fn add(&mut self, id: u32, fence: u64, until: Instant) {
        self.current.insert(id, Doubt { fence, until });
        self.version += 1;
    }

    /// The late answer to request `id` came: if it was in doubt, it is settled (true).
    pub fn answered(&mut self, id: u32) -> bool {
        let settled = self.current.remove(&id).is_some();
        self.version += u64::from(settled);
        settled
    }

    /// Whether request `id` of the current connection is in doubt (its id is not reused).
    pub fn holds_id(&self, id: u32) -> bool {
        self.current.contains_key(&id)
    }

    /// A change of `fence` that was at the station when its connection ended, or one a gateway
    /// before this one left in doubt: in doubt until `until`, and only time settles it.
    pub fn orphan(&mut self, fence: u64, until: Instant) {
        self.orphaned.push(Doubt { fence, until });
        self.version += 1;
    }

    /// The current connection ended: its doubts can no longer be answered.
    pub fn connection_ended(&mut self) {
        self.orphaned
            .extend(self.current.drain().map(|(_, doubt)| doubt));
    }

    /// Takes out every doubt whose bound has passed at `now`, remembering when each fence's
    /// doubts lapsed (at their bound, not later).
    pub fn lapse(&mut self, now: Instant) -> Lapsed {
        let mut lapsed = Lapsed::default();
        let due: Vec<u32> = self
            .current
            .iter()
            .filter(|(_, doubt)| doubt.until <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            if let Some(doubt) = self.current.remove(&id) {
                self.note_lapse(doubt);
                lapsed.current.push(doubt.fence);
            }
        }
        let (due, kept): (Vec<Doubt>, Vec<Doubt>) = std::mem::take(&mut self.orphaned)
            .into_iter()
            .partition(|doubt| doubt.until <= now);
        self.orphaned = kept;
        for doubt in due {
            self.note_lapse(doubt);
            lapsed.orphaned.push(doubt.fence);
        }
        if !lapsed.current.is_empty() || !lapsed.orphaned.is_empty() {
            self.version += 1;
        }
        lapsed
    }

    fn note_lapse(&mut self, doubt: Doubt) {
        let at = self.lapsed.entry(doubt.fence).or_insert(doubt.until);
        *at = (*at).max(doubt.until);
    }

    /// When the next doubt reaches its bound.
    pub fn next_lapse(&self) -> Option<Instant> {
        self.current
            .values()
            .chain(&self.orphaned)
            .map(|doubt| doubt.until)
            .min()
    }

    /// Whether a change that `scope` covers is in doubt.
    pub fn holds(&self, scope: SettleScope) -> bool {
        self.current
            .values()
            .chain(&self.orphaned)
            .any(|doubt| scope.covers(doubt.fence) && !lease_less_doubt_ignored(scope, doubt.fence))
    }

    /// When the last doubt that `scope` covers lapsed, if one did since this was last asked of
    /// its fences; what it returns is forgotten.
    pub fn take_lapsed(&mut self, scope: SettleScope) -> Option<Instant> {
        let fences: Vec<u64> = self
            .lapsed
            .keys()
            .copied()
            .filter(|fence| scope.covers(*fence))
            .collect();
        fences
            .into_iter()
            .filter_map(|fence| self.lapsed.remove(&fence))
            .max()
    }

    /// Changes whenever the doubts do.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Every doubt, for the ledger of what the station is owed.
    pub fn doubts(&self) -> Vec<Doubt> {
        self.current
            .values()
            .chain(&self.orphaned)
            .copied()
            .collect()
    }

    /// Every doubt and every lapse not yet taken, for the ledger of what the station is owed.
    pub fn at_station(&self) -> AtStation {
        let mut lapsed: Vec<Lapse> = self
            .lapsed
            .iter()
            .map(|(fence, at)| Lapse {
                fence: *fence,
                at: *at,
            })
            .collect();
        lapsed.sort_by_key(|lapse| (lapse.at, lapse.fence));
        AtStation {
            doubts: self.doubts(),
            lapsed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_scope_of_one_fence_covers_that_fence_only_and_every_covers_all() {
        assert!(SettleScope::Fence(3).covers(3));
        assert!(!SettleScope::Fence(3).covers(4));
        assert!(SettleScope::Every.covers(0) && SettleScope::Every.covers(9));
        assert!(
            SettleScope::Fence(3).covers(ANY_FENCE) && SettleScope::Every.covers(ANY_FENCE),
            "a change of an unknown lease is waited for by every settle"
        );
    }

    #[test]
    fn a_late_answer_settles_a_doubt_of_the_current_connection_and_nothing_lapses() {
        let t0 = Instant::now();
        let mut book = DoubtBook::default();
        book.add(7, 2, t0 + ms(100));
        assert!(book.holds_id(7) && book.holds(SettleScope::Fence(2)));
        assert!(book.answered(7));
        assert!(!book.answered(7), "answered once");
        assert!(!book.holds(SettleScope::Every));
        assert_eq!(book.lapse(t0 + ms(200)), Lapsed::default());
        assert_eq!(book.take_lapsed(SettleScope::Every), None);
    }

    #[test]
    fn a_doubt_outlives_its_connection_and_only_time_settles_it() {
        let t0 = Instant::now();
        let mut book = DoubtBook::default();
        book.add(7, 2, t0 + ms(100));
        book.connection_ended();
        book.orphan(3, t0 + ms(50));
        assert!(
            !book.answered(7),
            "no answer reaches a connection that ended"
        );
        assert!(!book.holds_id(7));
        assert!(book.holds(SettleScope::Fence(2)) && book.holds(SettleScope::Fence(3)));
        assert_eq!(book.next_lapse(), Some(t0 + ms(50)));
        assert_eq!(
            book.lapse(t0 + ms(99)),
            Lapsed {
                current: vec![],
                orphaned: vec![3]
            }
        );
        assert!(book.holds(SettleScope::Fence(2)) && !book.holds(SettleScope::Fence(3)));
        assert_eq!(book.next_lapse(), Some(t0 + ms(100)));
        assert_eq!(book.lapse(t0 + ms(100)).orphaned, vec![2]);
        assert_eq!(book.next_lapse(), None);
        assert!(!book.holds(SettleScope::Every));
    }

    #[test]
    fn a_lapse_is_remembered_at_its_bound_per_fence_until_a_settle_takes_it() {
        let t0 = Instant::now();
        let mut book = DoubtBook::default();
        book.add(1, 4, t0 + ms(10));
        book.add(2, 4, t0 + ms(30));
        book.add(3, 0, t0 + ms(20));
        let lapsed = book.lapse(t0 + ms(500));
        assert_eq!(lapsed.current.len(), 3);
        assert!(lapsed.orphaned.is_empty());
        assert_eq!(
            book.take_lapsed(SettleScope::Fence(4)),
            Some(t0 + ms(30)),
            "the latest of the fence's lapses, at its bound"
        );
        assert_eq!(book.take_lapsed(SettleScope::Fence(4)), None, "taken once");
        assert_eq!(book.take_lapsed(SettleScope::Every), Some(t0 + ms(20)));
        assert_eq!(book.take_lapsed(SettleScope::Every), None);
    }

    #[test]
    fn a_lapse_is_published_for_the_ledger_until_a_settle_takes_it() {
        let t0 = Instant::now();
        let mut book = DoubtBook::default();
        book.add(1, FREE_FENCE, t0 + ms(10));
        book.orphan(5, t0 + ms(40));
        let seen = book.version();
        book.lapse(t0 + ms(10));
        assert_ne!(book.version(), seen, "a lapse is told");
        assert_eq!(
            book.at_station(),
            AtStation {
                doubts: vec![Doubt {
                    fence: 5,
                    until: t0 + ms(40)
                }],
                lapsed: vec![Lapse {
                    fence: FREE_FENCE,
                    at: t0 + ms(10)
                }],
            }
        );
        book.take_lapsed(SettleScope::Every);
        assert_eq!(book.at_station().lapsed, [], "taken by a settle");
    }

    #[test]
    fn every_doubt_is_listed_for_the_ledger_and_every_change_of_them_is_told() {
        let t0 = Instant::now();
        let mut book = DoubtBook::default();
        let mut seen = book.version();
        let mut changed = |book: &DoubtBook| {
            let news = book.version() != seen;
            seen = book.version();
            news
        };
        book.add(1, 4, t0 + ms(10));
        assert!(changed(&book));
        assert!(!book.answered(9));
        assert!(!changed(&book), "no doubt of that id: nothing changed");
        book.orphan(0, t0 + ms(20));
        assert!(changed(&book));
        book.lapse(t0);
        assert!(!changed(&book), "nothing lapsed");
        let mut doubts = book.doubts();
        doubts.sort_by_key(|d| d.until);
        assert_eq!(
            doubts,
            [
                Doubt {
                    fence: 4,
                    until: t0 + ms(10)
                },
                Doubt {
                    fence: 0,
                    until: t0 + ms(20)
                }
            ]
        );
        book.lapse(t0 + ms(10));
        assert!(changed(&book));
        assert_eq!(book.doubts().len(), 1, "the first lapsed");
    }

    /// Whoever publishes the doubts compares the version with the one it last published: a
    /// version that came back to an earlier value would hide a change, so every change of the
    /// doubts (a late answer included) takes it to one never seen before.
    #[test]
    fn every_change_of_the_doubts_takes_the_version_higher() {
        let t0 = Instant::now();
        let mut book = DoubtBook::default();
        let mut versions = vec![book.version()];
        book.add(1, 4, t0 + ms(10));
        versions.push(book.version());
        book.add(2, 4, t0 + ms(30));
        versions.push(book.version());
        assert!(book.answered(2));
        versions.push(book.version());
        book.orphan(0, t0 + ms(20));
        versions.push(book.version());
        book.lapse(t0 + ms(10));
        versions.push(book.version());
        book.lapse(t0 + ms(20));
        versions.push(book.version());
        assert!(
            versions.windows(2).all(|pair| pair[1] > pair[0]),
            "{versions:?}"
        );
    }

    /// A grant's settle waits for every change in doubt, of a lease or of none.
    #[test]
    fn a_settle_of_every_change_waits_for_a_lease_less_doubt_and_a_leases() {
        let t0 = Instant::now();
        let mut book = DoubtBook::default();
        book.orphan(FREE_FENCE, t0 + ms(10));
        assert!(book.holds(SettleScope::Every), "a lease-less change");
        book.lapse(t0 + ms(10));
        book.add(3, 2, t0 + ms(20));
        assert!(book.holds(SettleScope::Every), "a lease's change");
    }
}

//! A bounded history, oldest first, for the simulator's write log and read-batch statistics:
//! past its limit the oldest entry is dropped for each new one, and the drops are counted, so
//! that a demo or a CI soak left running does not grow without end.

use std::collections::VecDeque;

/// How many entries the write log and the read-batch statistics keep unless told otherwise
/// ([`crate::SimulatorHandle::set_history_limit`], the control port's `history N`): more
/// than any test reads back (the audit test's burst of 8 writers is at most 80 000 writes),
/// about 26 MB of write records at most (a record is about 260 bytes).
pub const DEFAULT_HISTORY_LIMIT: usize = 100_000;

/// The newest entries, at most `limit` of them.
#[derive(Debug)]
pub(crate) struct History<T> {
    entries: VecDeque<T>,
    limit: usize,
    dropped: u64,
}

impl<T: Clone> Default for History<T> {
    fn default() -> Self {
        History::new(DEFAULT_HISTORY_LIMIT)
    }
}

impl<T: Clone> History<T> {
    pub(crate) fn new(limit: usize) -> History<T> {
        History {
            entries: VecDeque::new(),
            limit,
            dropped: 0,
        }
    }

    /// Adds `entry`, dropping the oldest when the history is full.
    pub(crate) fn push(&mut self, entry: T) {
        if self.limit == 0 {
            self.dropped += 1;
            return;
        }
        if self.entries.len() >= self.limit {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(entry);
    }

    /// The entries kept, oldest first.
    pub(crate) fn to_vec(&self) -> Vec<T> {
        self.entries.iter().cloned().collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries dropped to stay within the limit since the history was last cleared.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Empties it (and its count of dropped entries).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.dropped = 0;
    }

    /// Keeps at most `limit` entries from now on, dropping the oldest beyond it at once.
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
        while self.entries.len() > limit {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.shrink_to(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_its_limit_it_keeps_the_newest_and_counts_the_dropped() {
        let mut history = History::new(3);
        for n in 0..5 {
            history.push(n);
        }
        assert_eq!(history.to_vec(), vec![2, 3, 4]);
        assert_eq!(history.dropped(), 2);
        history.set_limit(1);
        assert_eq!(history.to_vec(), vec![4]);
        assert_eq!(history.dropped(), 4);
        history.clear();
        assert_eq!((history.len(), history.dropped()), (0, 0));
        history.set_limit(0);
        history.push(9);
        assert_eq!((history.len(), history.dropped()), (0, 1));
    }
}

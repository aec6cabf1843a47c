//! The replay buffer: the last events a stream sent, by their place in it (the sequence part of
//! their ids), so that a reader reconnecting with `Last-Event-ID` gets again what was sent but
//! never reached it; and, when the buffer no longer reaches back that far, the range of ids it
//! lost, for the `gap` event that says so. Bounded by a count of events. Pure: no clock, no I/O.

use std::collections::VecDeque;

/// The events sent after the one a reader saw last.
#[derive(Debug, PartialEq, Eq)]
pub enum Replay<'a, T> {
    /// Sent and kept: send these again, in order (empty when nothing was sent after it).
    Events(Vec<&'a T>),
    /// Sent, and some no longer kept: the sequences `from..=to` are lost (the reader gets a
    /// `gap` and a snapshot instead of any of them).
    Lost { from: u64, to: u64 },
    /// Never sent: an id this stream has not reached (not this stream's, or a client's mistake).
    Unknown,
}

/// The last `capacity` events sent, each with its sequence: consecutive, the oldest first.
#[derive(Debug)]
pub struct ReplayBuffer<T> {
    /// The sequence of `events[0]`; the next one pushed is `first + events.len()`.
    first: u64,
    events: VecDeque<T>,
    capacity: usize,
}

impl<T> ReplayBuffer<T> {
    /// A buffer whose first event will have sequence `first`.
    pub fn new(first: u64, capacity: usize) -> ReplayBuffer<T> {
        ReplayBuffer {
            first,
            events: VecDeque::new(),
            capacity,
        }
    }

    /// The sequence the next event sent will have.
    pub fn next(&self) -> u64 {
        self.first + self.events.len() as u64
    }

    /// Keeps the event sent with the next sequence, forgetting the oldest past the capacity.
    pub fn push(&mut self, event: T) {
        if self.capacity == 0 {
            self.first += 1;
            return;
        }
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.first += 1;
        } else if self.events.capacity() == 0 {
            // Once, the whole of it: a buffer that grew by doubling would keep the smaller
            // blocks it outgrew in the allocator, for every stream.
            self.events.reserve_exact(self.capacity);
        }
        self.events.push_back(event);
    }

    /// Forgets every event kept, as if all were lost; the next sequence stays.
    pub fn forget(&mut self) {
        self.first = self.next();
        self.events.clear();
    }

    /// What a reader that saw `last_seen` last (0: nothing yet) missed.
    pub fn after(&self, last_seen: u64) -> Replay<'_, T> {
        let next = self.next();
        if last_seen >= next {
            return Replay::Unknown;
        }
        let wanted = last_seen + 1;
        if wanted >= self.first {
            let skip = (wanted - self.first) as usize;
            return Replay::Events(self.events.iter().skip(skip).collect());
        }
        Replay::Lost {
            from: wanted,
            to: next - 1,
        }
    }

    /// The events kept now.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(count: u64, capacity: usize) -> ReplayBuffer<u64> {
        let mut buffer = ReplayBuffer::new(1, capacity);
        for sequence in 1..=count {
            assert_eq!(buffer.next(), sequence);
            buffer.push(sequence);
        }
        buffer
    }

    #[test]
    fn a_reader_gets_every_event_after_the_one_it_saw_last() {
        let buffer = sent(5, 8);
        assert_eq!(buffer.after(2), Replay::Events(vec![&3, &4, &5]));
        assert_eq!(buffer.after(0), Replay::Events(vec![&1, &2, &3, &4, &5]));
        assert_eq!(buffer.after(5), Replay::Events(vec![]), "up to date");
    }

    #[test]
    fn past_the_capacity_the_oldest_are_forgotten_and_a_reader_behind_them_loses_a_range() {
        let buffer = sent(10, 4);
        assert_eq!(buffer.len(), 4);
        assert_eq!(buffer.after(6), Replay::Events(vec![&7, &8, &9, &10]));
        // 7 is the oldest kept: a reader who saw 5 misses 6, so it gets nothing of it but the
        // range it lost, up to the last sent (a snapshot replaces the rest).
        assert_eq!(buffer.after(5), Replay::Lost { from: 6, to: 10 });
        assert_eq!(buffer.after(0), Replay::Lost { from: 1, to: 10 });
    }

    #[test]
    fn an_id_the_stream_never_reached_is_unknown() {
        let buffer = sent(3, 4);
        assert_eq!(buffer.after(3), Replay::Events(vec![]));
        assert_eq!(buffer.after(4), Replay::Unknown);
        assert_eq!(buffer.after(1_000), Replay::Unknown);
    }

    #[test]
    fn forgetting_keeps_the_numbering_and_makes_everything_sent_lost() {
        let mut buffer = sent(3, 4);
        buffer.forget();
        assert!(buffer.is_empty());
        assert_eq!(buffer.next(), 4);
        assert_eq!(buffer.after(1), Replay::Lost { from: 2, to: 3 });
        assert_eq!(buffer.after(3), Replay::Events(vec![]));
        buffer.push(4);
        assert_eq!(buffer.after(3), Replay::Events(vec![&4]));
    }

    #[test]
    fn a_buffer_of_nothing_counts_but_keeps_nothing() {
        let buffer = sent(3, 0);
        assert_eq!(buffer.next(), 4);
        assert_eq!(buffer.after(3), Replay::Events(vec![]));
        assert_eq!(buffer.after(2), Replay::Lost { from: 3, to: 3 });
    }
}

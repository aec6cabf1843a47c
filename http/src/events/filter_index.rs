//! The filtered subscriptions of one interval, indexed per channel, so that a tick finds the
//! (subscription, channel) pairs its values let through in time proportional to them rather
//! than to the number of pairs; every pair it offers is still decided by [`filter::passes`].
//!
//! Each pair is filed under what it last sent and when:
//! - by status (no value sent yet, a value, or an error by its text): a tick whose value has
//!   another status offers every pair filed under the others (a change of status always passes);
//! - while no rate limit holds it back, by what a movement needs: a finite number under its
//!   band's two edges ([`filter::band_edges`]) in two ordered sets, so a tick's number finds the
//!   pairs it leaves the band of with two range queries; any other value (a string, a NaN, an
//!   infinity) in a bucket of the pairs that sent the same, offered when the tick's value is
//!   another; a pair without a deadband on every tick; an error under a deadband nowhere (only
//!   a change of status or a heartbeat passes it);
//! - in one queue of times per index: when its rate limit (`MinIntervalMs`) ends, and when its
//!   heartbeat (`MaxIntervalMs`) is due; a heartbeat due and not yet sent is offered every tick.
//!
//! A subscription joins the index's ticks from a grid point on ([`FilterIndex::join`]); before,
//! its pairs are kept but never offered, and its first values are decided one by one
//! ([`FilterIndex::evaluate_member`]). All times are passed in.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use super::filter::{self, ChannelFilter, Observed, Sent, Shown};

/// A subscription's place in the index.
pub type Slot = u32;

/// A (subscription, channel position) pair, the slot in the high half: sorted, a tick's pairs
/// come grouped by subscription, in channel order.
type PairRef = u64;

fn pair_ref(slot: Slot, position: u32) -> PairRef {
    (u64::from(slot) << 32) | u64::from(position)
}

fn split(pair: PairRef) -> (Slot, u32) {
    ((pair >> 32) as Slot, pair as u32)
}

/// Where a pair waits for a movement of its channel's value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Moving {
    /// No value sent yet, or a movement cannot pass it (an error under a deadband).
    Not,
    /// Its rate limit holds it back until its wake-up time.
    Asleep,
    /// Without a deadband, every tick passes.
    EveryTick,
    /// Under the band's edges (order keys); `None` on a side no number leaves the band.
    Edges {
        below: Option<i64>,
        above: Option<i64>,
    },
    /// In the bucket of the pairs that last sent the same (not a finite number).
    Odd,
}

#[derive(Debug)]
struct Pair {
    channel: u32,
    filter: ChannelFilter,
    last: Option<Sent>,
    moving: Moving,
    /// Its heartbeat is due and not yet sent.
    overdue: bool,
    /// A wake-up or heartbeat of it is in the queue of times.
    wake_queued: bool,
    heartbeat_queued: bool,
}

/// Every pair of one channel, filed.
#[derive(Debug, Default)]
struct Lane {
    pairs: usize,
    /// Pairs of subscriptions that joined the ticks.
    joined: usize,
    fresh: HashSet<PairRef>,
    valued: HashSet<PairRef>,
    errors: HashMap<String, HashSet<PairRef>>,
    every_tick: HashSet<PairRef>,
    overdue: HashSet<PairRef>,
    /// (order key of the edge, pair): a number at or above the edge leaves the band.
    above: BTreeSet<(i64, PairRef)>,
    /// (order key of the edge, pair): a number at or below the edge leaves the band.
    below: BTreeSet<(i64, PairRef)>,
    /// Pairs that last sent the same value (not a finite number), with what they sent.
    odd: Vec<(Sent, HashSet<PairRef>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    Wake,
    Heartbeat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    slot: Slot,
    generation: u32,
    position: u32,
    kind: TimerKind,
}

#[derive(Debug)]
struct Member<T> {
    /// Due at the index's ticks from this grid point on; `None` before it joined.
    from: Option<Instant>,
    pairs: Vec<Pair>,
    meta: T,
}

#[derive(Debug)]
struct Entry<T> {
    generation: u32,
    member: Option<Member<T>>,
}

/// The filtered subscriptions of one interval; `T` is what the caller keeps of each.
#[derive(Debug)]
pub struct FilterIndex<T> {
    entries: Vec<Entry<T>>,
    free: Vec<Slot>,
    lanes: HashMap<u32, Lane>,
    timers: BinaryHeap<Reverse<Timer>>,
    /// The latest grid point a subscription joined from: before it, some are not due yet.
    latest_from: Option<Instant>,
    candidates: Vec<PairRef>,
}

impl<T> Default for FilterIndex<T> {
    fn default() -> Self {
        FilterIndex {
            entries: Vec::new(),
            free: Vec::new(),
            lanes: HashMap::new(),
            timers: BinaryHeap::new(),
            latest_from: None,
            candidates: Vec::new(),
        }
    }
}

impl<T> FilterIndex<T> {
    /// Adds a subscription over `channels` (channel numbers) with a filter each; it has sent
    /// nothing and is not due at the index's ticks until it [`join`](Self::join)s them.
    pub fn add(&mut self, meta: T, channels: &[u32], filters: &[ChannelFilter]) -> Slot {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.entries.push(Entry {
                    generation: 0,
                    member: None,
                });
                (self.entries.len() - 1) as Slot
            }
        };
        let pairs = channels
            .iter()
            .zip(filters)
            .enumerate()
            .map(|(position, (&channel, filter))| {
                let lane = self.lanes.entry(channel).or_default();
                lane.pairs += 1;
                lane.fresh.insert(pair_ref(slot, position as u32));
                Pair {
                    channel,
                    filter: *filter,
                    last: None,
                    moving: Moving::Not,
                    overdue: false,
                    wake_queued: false,
                    heartbeat_queued: false,
                }
            })
            .collect();
        self.entries[slot as usize].member = Some(Member {
            from: None,
            pairs,
            meta,
        });
        slot
    }

    /// Removes a subscription; its slot may be given to another.
    pub fn remove(&mut self, slot: Slot) -> Option<T> {
        let entry = self.entries.get_mut(slot as usize)?;
        let member = entry.member.take()?;
        entry.generation = entry.generation.wrapping_add(1);
        self.free.push(slot);
        for (position, pair) in member.pairs.iter().enumerate() {
            let Some(lane) = self.lanes.get_mut(&pair.channel) else {
                continue;
            };
            unfile(lane, pair, pair_ref(slot, position as u32));
            lane.pairs -= 1;
            if member.from.is_some() {
                lane.joined -= 1;
            }
            if lane.pairs == 0 {
                self.lanes.remove(&pair.channel);
            }
        }
        Some(member.meta)
    }

    /// Makes a subscription due at the ticks at or after `from`.
    pub fn join(&mut self, slot: Slot, from: Instant) {
        let Some(member) = self
            .entries
            .get_mut(slot as usize)
            .and_then(|e| e.member.as_mut())
        else {
            return;
        };
        if member.from.replace(from).is_none() {
            for pair in &member.pairs {
                if let Some(lane) = self.lanes.get_mut(&pair.channel) {
                    lane.joined += 1;
                }
            }
        }
        self.latest_from = Some(self.latest_from.map_or(from, |latest| latest.max(from)));
    }

    pub fn meta(&self, slot: Slot) -> Option<&T> {
        self.member(slot).map(|member| &member.meta)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() == self.free.len()
    }

    /// The channels the subscriptions due at `at` name, each once: what a tick reads.
    pub fn channels_due(&self, at: Instant, channels: &mut Vec<u32>) {
        channels.clear();
        if self.latest_from.is_none_or(|latest| latest <= at) {
            channels.extend(
                self.lanes
                    .iter()
                    .filter(|(_, lane)| lane.joined > 0)
                    .map(|(&channel, _)| channel),
            );
            return;
        }
        // Some joined for a later tick (the first interval after their first values).
        let mut named = HashSet::new();
        for member in self.entries.iter().filter_map(|e| e.member.as_ref()) {
            if member.from.is_some_and(|from| from <= at) {
                named.extend(member.pairs.iter().map(|pair| pair.channel));
            }
        }
        channels.extend(named);
    }

    fn member(&self, slot: Slot) -> Option<&Member<T>> {
        self.entries.get(slot as usize)?.member.as_ref()
    }

    /// The positions of one subscription's channels that pass at `at`, each decided by the
    /// rule: for its first values, off the grid.
    pub fn evaluate_member<'a>(
        &self,
        slot: Slot,
        at: Instant,
        observe: impl Fn(u32) -> Observed<'a>,
        passed: &mut Vec<u32>,
    ) {
        passed.clear();
        let Some(member) = self.member(slot) else {
            return;
        };
        for (position, pair) in member.pairs.iter().enumerate() {
            if filter::passes(&pair.filter, pair.last.as_ref(), observe(pair.channel), at) {
                passed.push(position as u32);
            }
        }
    }

    /// A tick at grid point `at`: every (subscription, position) that passes, sorted, of the
    /// subscriptions due (joined at or before `at`). `observe` gives each channel's outcome.
    pub fn evaluate<'a>(
        &mut self,
        at: Instant,
        observe: impl Fn(u32) -> Observed<'a>,
        passed: &mut Vec<(Slot, u32)>,
    ) {
        passed.clear();
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.clear();
        self.run_timers(at);
        for (&channel, lane) in &self.lanes {
            if lane.joined > 0 {
                offer(lane, observe(channel), &mut candidates);
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        for &candidate in &candidates {
            let (slot, position) = split(candidate);
            let Some(member) = self.member(slot) else {
                continue;
            };
            if member.from.is_none_or(|from| from > at) {
                continue;
            }
            let pair = &member.pairs[position as usize];
            if filter::passes(&pair.filter, pair.last.as_ref(), observe(pair.channel), at) {
                passed.push((slot, position));
            }
        }
        self.candidates = candidates;
    }

    /// Wake-ups and heartbeats due at `at`: a pair whose rate limit ended is filed for
    /// movements; a pair whose heartbeat is due is filed as overdue, offered until it is sent.
    fn run_timers(&mut self, at: Instant) {
        while let Some(Reverse(timer)) = self.timers.peek().copied() {
            if timer.at > at {
                break;
            }
            self.timers.pop();
            let Some(entry) = self.entries.get_mut(timer.slot as usize) else {
                continue;
            };
            if entry.generation != timer.generation {
                continue;
            }
            let Some(member) = entry.member.as_mut() else {
                continue;
            };
            let pair = &mut member.pairs[timer.position as usize];
            let pair_id = pair_ref(timer.slot, timer.position);
            let Some(lane) = self.lanes.get_mut(&pair.channel) else {
                continue;
            };
            let Some(last_at) = pair.last.as_ref().map(Sent::at) else {
                continue;
            };
            let requeue = |due: Instant, kind| Timer {
                at: due,
                slot: timer.slot,
                generation: timer.generation,
                position: timer.position,
                kind,
            };
            match timer.kind {
                TimerKind::Wake => {
                    pair.wake_queued = false;
                    if pair.moving != Moving::Asleep {
                        continue;
                    }
                    let due = last_at + pair.filter.min_interval.unwrap_or(Duration::ZERO);
                    if due <= at {
                        // Filed before the lanes are asked: this tick offers it already.
                        file_moving(lane, pair, pair_id);
                    } else {
                        pair.wake_queued = true;
                        self.timers.push(Reverse(requeue(due, TimerKind::Wake)));
                    }
                }
                TimerKind::Heartbeat => {
                    pair.heartbeat_queued = false;
                    let Some(heartbeat) = pair.filter.max_interval else {
                        continue;
                    };
                    let due = last_at + heartbeat;
                    if due <= at {
                        pair.overdue = true;
                        lane.overdue.insert(pair_id);
                    } else {
                        pair.heartbeat_queued = true;
                        self.timers
                            .push(Reverse(requeue(due, TimerKind::Heartbeat)));
                    }
                }
            }
        }
    }

    /// Records that the subscription's `positions` went out at `at` with what `observe` gives.
    pub fn sent<'a>(
        &mut self,
        slot: Slot,
        positions: &[u32],
        observe: impl Fn(u32) -> Observed<'a>,
        at: Instant,
    ) {
        let Some(entry) = self.entries.get_mut(slot as usize) else {
            return;
        };
        let generation = entry.generation;
        let Some(member) = entry.member.as_mut() else {
            return;
        };
        for &position in positions {
            let Some(pair) = member.pairs.get_mut(position as usize) else {
                continue;
            };
            let Some(lane) = self.lanes.get_mut(&pair.channel) else {
                continue;
            };
            let pair_id = pair_ref(slot, position);
            unfile(lane, pair, pair_id);
            let observed = observe(pair.channel);
            pair.last = Some(Sent::new(observed, at));
            pair.overdue = false;
            let timer = |due: Instant, kind| {
                Reverse(Timer {
                    at: due,
                    slot,
                    generation,
                    position,
                    kind,
                })
            };
            match observed {
                Observed::Error(why) => {
                    lane.errors
                        .entry(why.to_owned())
                        .or_default()
                        .insert(pair_id);
                }
                Observed::Value(_) => {
                    lane.valued.insert(pair_id);
                }
            }
            match pair.filter.min_interval.filter(|least| !least.is_zero()) {
                Some(least) => {
                    pair.moving = Moving::Asleep;
                    if !pair.wake_queued {
                        pair.wake_queued = true;
                        self.timers.push(timer(at + least, TimerKind::Wake));
                    }
                }
                None => file_moving(lane, pair, pair_id),
            }
            if let Some(heartbeat) = pair.filter.max_interval
                && !pair.heartbeat_queued
            {
                pair.heartbeat_queued = true;
                self.timers
                    .push(timer(at + heartbeat, TimerKind::Heartbeat));
            }
        }
    }
}

/// Files a pair no rate limit holds back where a movement of its channel finds it.
fn file_moving(lane: &mut Lane, pair: &mut Pair, pair_id: PairRef) {
    let Some(last) = &pair.last else {
        pair.moving = Moving::Not;
        return;
    };
    pair.moving = match pair.filter.deadband {
        // Without a deadband, or with one the edges cannot stand for (never refused by the
        // API's checks: NaN, negative), every tick is offered and the rule decides.
        None => Moving::EveryTick,
        Some(band) if band.is_nan() || band < 0.0 => Moving::EveryTick,
        Some(band) => match last.shown() {
            Shown::Error(_) => Moving::Not,
            Shown::Number(x) => match filter::band_edges(x, band) {
                Some(edges) => {
                    let below = edges.below.map(filter::order_key);
                    let above = edges.above.map(filter::order_key);
                    if let Some(key) = below {
                        lane.below.insert((key, pair_id));
                    }
                    if let Some(key) = above {
                        lane.above.insert((key, pair_id));
                    }
                    Moving::Edges { below, above }
                }
                None => file_odd(lane, last, pair_id),
            },
            Shown::Other(_) => file_odd(lane, last, pair_id),
        },
    };
    if pair.moving == Moving::EveryTick {
        lane.every_tick.insert(pair_id);
    }
}

fn file_odd(lane: &mut Lane, last: &Sent, pair_id: PairRef) -> Moving {
    match lane
        .odd
        .iter_mut()
        .find(|(shown, _)| shown.same_shown(last))
    {
        Some((_, pairs)) => {
            pairs.insert(pair_id);
        }
        None => lane.odd.push((last.clone(), HashSet::from([pair_id]))),
    }
    Moving::Odd
}

/// Takes a pair out of every set of its lane.
fn unfile(lane: &mut Lane, pair: &Pair, pair_id: PairRef) {
    match &pair.last {
        None => {
            lane.fresh.remove(&pair_id);
        }
        Some(last) => match last.shown() {
            Shown::Error(why) => {
                if let Some(pairs) = lane.errors.get_mut(why) {
                    pairs.remove(&pair_id);
                    if pairs.is_empty() {
                        lane.errors.remove(why);
                    }
                }
            }
            _ => {
                lane.valued.remove(&pair_id);
            }
        },
    }
    match pair.moving {
        Moving::Not | Moving::Asleep => {}
        Moving::EveryTick => {
            lane.every_tick.remove(&pair_id);
        }
        Moving::Edges { below, above } => {
            if let Some(key) = below {
                lane.below.remove(&(key, pair_id));
            }
            if let Some(key) = above {
                lane.above.remove(&(key, pair_id));
            }
        }
        Moving::Odd => {
            if let Some(last) = &pair.last
                && let Some(index) = lane
                    .odd
                    .iter()
                    .position(|(shown, _)| shown.same_shown(last))
            {
                lane.odd[index].1.remove(&pair_id);
                if lane.odd[index].1.is_empty() {
                    lane.odd.swap_remove(index);
                }
            }
        }
    }
    if pair.overdue {
        lane.overdue.remove(&pair_id);
    }
}

/// Every pair of a lane that `observed` may pass (more is fine: the rule decides each; fewer
/// is not).
fn offer(lane: &Lane, observed: Observed<'_>, candidates: &mut Vec<PairRef>) {
    candidates.extend(&lane.fresh);
    candidates.extend(&lane.every_tick);
    candidates.extend(&lane.overdue);
    match observed {
        Observed::Error(why) => {
            // A change of status: from a value, or from another error.
            candidates.extend(&lane.valued);
            for (before, pairs) in &lane.errors {
                if before != why {
                    candidates.extend(pairs);
                }
            }
        }
        Observed::Value(_) => {
            // A value coming back after an error.
            for pairs in lane.errors.values() {
                candidates.extend(pairs);
            }
            match observed.number().filter(|x| !x.is_nan()) {
                Some(x) => {
                    let key = filter::order_key(x);
                    candidates.extend(lane.above.range(..=(key, PairRef::MAX)).map(|e| e.1));
                    candidates.extend(lane.below.range((key, 0)..).map(|e| e.1));
                }
                // NaN or not a number: moved infinitely far from every finite number.
                None => {
                    candidates.extend(lane.above.iter().map(|e| e.1));
                    candidates.extend(lane.below.iter().map(|e| e.1));
                }
            }
            for (shown, pairs) in &lane.odd {
                // The same (moved by 0, or by NaN: infinity from infinity) passes no deadband.
                let unmoved =
                    filter::moved(shown, observed).is_some_and(|m| m == 0.0 || m.is_nan());
                if !unmoved {
                    candidates.extend(pairs);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::filter::SubscriptionFilter;
    use station_protocol::Value;

    const MS: Duration = Duration::from_millis(1);

    /// xorshift64*: a fixed sequence per seed, no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn chance(&mut self, percent: u64) -> bool {
            self.next() % 100 < percent
        }

        fn pick<T: Clone>(&mut self, from: &[T]) -> T {
            from[self.below(from.len())].clone()
        }
    }

    /// What a channel shows in a tick: numbers on a grid of a quarter and a bit beside it (so
    /// values land exactly at a deadband's distance and on its edges), signed zeros, NaN, infinities, an integer, other kinds, two errors.
    #[derive(Debug, Clone)]
    enum Shows {
        Value(Value),
        Error(&'static str),
    }

    impl Shows {
        fn observed(&self) -> Observed<'_> {
            match self {
                Shows::Value(value) => Observed::Value(value),
                Shows::Error(why) => Observed::Error(why),
            }
        }
    }

    fn random_shows(rng: &mut Rng) -> Shows {
        match rng.below(20) {
            0 => Shows::Error(rng.pick(&["station not reached", "read error"])),
            1 => Shows::Value(Value::Float(rng.pick(&[
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -0.0,
                1e300,
            ]))),
            2 => Shows::Value(Value::Integer(rng.below(5) as i64 - 2)),
            3 => Shows::Value(rng.pick(&[
                Value::Bool(true),
                Value::Bool(false),
                Value::String("a".into()),
                Value::String("b".into()),
            ])),
            // A bit beside the grid: exactly on an edge where the band is a quarter's multiple.
            4 | 5 => {
                let x = (rng.below(33) as f64 - 16.0) * 0.25;
                Shows::Value(Value::Float(if rng.chance(50) {
                    x.next_up()
                } else {
                    x.next_down()
                }))
            }
            _ => Shows::Value(Value::Float((rng.below(33) as f64 - 16.0) * 0.25)),
        }
    }

    fn random_filter(rng: &mut Rng) -> ChannelFilter {
        let deadband = if rng.chance(75) {
            Some(rng.pick(&[0.0, 0.25, 0.3, 0.5, 1.0, 2.75, 1e9, f64::INFINITY]))
        } else {
            None
        };
        let min_interval = rng
            .chance(35)
            .then(|| rng.pick(&[0, 100, 150, 250, 300]) * MS);
        let max_interval = rng.chance(35).then(|| rng.pick(&[100, 200, 350, 500]) * MS);
        ChannelFilter {
            deadband,
            min_interval,
            max_interval,
        }
    }

    /// One subscription as the plain rule keeps it, beside its slot in the index.
    struct Plain {
        slot: Slot,
        channels: Vec<u32>,
        rule: SubscriptionFilter,
        from: Option<Instant>,
    }

    /// The plain rule's choice for a member at `at`.
    fn plain_passes(plain: &Plain, shows: &[Shows], at: Instant) -> Vec<u32> {
        (0..plain.channels.len())
            .filter(|&position| {
                let channel = plain.channels[position] as usize;
                plain.rule.passes(position, shows[channel].observed(), at)
            })
            .map(|position| position as u32)
            .collect()
    }

    fn run(seed: u64) {
        const CHANNELS: usize = 5;
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let t0 = Instant::now();
        let mut index: FilterIndex<usize> = FilterIndex::default();
        let mut plains: Vec<Plain> = Vec::new();
        let mut shows: Vec<Shows> = (0..CHANNELS).map(|_| random_shows(&mut rng)).collect();
        let mut at = t0;
        let mut passed = Vec::new();
        let mut positions = Vec::new();
        for tick in 0..250 {
            // The grid: mostly one interval on, sometimes a point skipped (a late tick).
            at += if rng.chance(10) { 200 * MS } else { 100 * MS };
            for channel in shows.iter_mut() {
                if rng.chance(45) {
                    *channel = random_shows(&mut rng);
                }
            }
            let observe = |channel: u32| shows[channel as usize].observed();
            // A subscription comes: its first values off the grid, then it joins.
            if plains.len() < 12 && rng.chance(20) {
                let count = 1 + rng.below(CHANNELS);
                let mut channels: Vec<u32> = (0..CHANNELS as u32).collect();
                for k in 0..CHANNELS {
                    channels.swap(k, rng.below(CHANNELS));
                }
                channels.truncate(count);
                let filters: Vec<ChannelFilter> =
                    (0..count).map(|_| random_filter(&mut rng)).collect();
                let slot = index.add(tick, &channels, &filters);
                let mut plain = Plain {
                    slot,
                    channels,
                    rule: SubscriptionFilter::new(filters),
                    from: None,
                };
                let first_at = at - 40 * MS;
                index.evaluate_member(slot, first_at, observe, &mut positions);
                assert_eq!(
                    positions,
                    plain_passes(&plain, &shows, first_at),
                    "seed {seed}"
                );
                if !rng.chance(20) {
                    index.sent(slot, &positions, observe, first_at);
                    for &position in &positions {
                        let channel = plain.channels[position as usize] as usize;
                        plain
                            .rule
                            .sent(position as usize, shows[channel].observed(), first_at);
                    }
                }
                let from = if rng.chance(30) { at + 100 * MS } else { at };
                index.join(slot, from);
                plain.from = Some(from);
                plains.push(plain);
            }
            // A subscription goes.
            if !plains.is_empty() && rng.chance(5) {
                let gone = plains.swap_remove(rng.below(plains.len()));
                assert!(index.remove(gone.slot).is_some());
            }
            index.evaluate(at, observe, &mut passed);
            let mut expected = Vec::new();
            for plain in &plains {
                if plain.from.is_some_and(|from| from <= at) {
                    for position in plain_passes(plain, &shows, at) {
                        expected.push((plain.slot, position));
                    }
                }
            }
            expected.sort_unstable();
            assert_eq!(passed, expected, "seed {seed}, tick {tick}: {shows:?}");
            // Most events go out; some are dropped (a slow reader) and count as not sent.
            for member in passed.chunk_by(|a, b| a.0 == b.0) {
                if rng.chance(15) {
                    continue;
                }
                let slot = member[0].0;
                positions.clear();
                positions.extend(member.iter().map(|&(_, position)| position));
                index.sent(slot, &positions, observe, at);
                let plain = plains.iter_mut().find(|p| p.slot == slot).unwrap();
                for &position in &positions {
                    let channel = plain.channels[position as usize] as usize;
                    plain
                        .rule
                        .sent(position as usize, shows[channel].observed(), at);
                }
            }
        }
    }

    #[test]
    fn the_index_passes_exactly_what_the_rule_passes_over_random_values_and_options() {
        for seed in 0..300 {
            run(seed);
        }
    }

    #[test]
    fn a_tick_offers_only_the_pairs_that_pass_under_a_deadband() {
        let t0 = Instant::now();
        let mut index: FilterIndex<()> = FilterIndex::default();
        let band = ChannelFilter {
            deadband: Some(0.5),
            ..ChannelFilter::default()
        };
        let slots: Vec<Slot> = (0..1000)
            .map(|_| {
                let slot = index.add((), &[0], &[band]);
                index.join(slot, t0);
                slot
            })
            .collect();
        let value = |x: f64| Value::Float(x);
        // Half sent 1.0, half sent 2.0.
        for (k, &slot) in slots.iter().enumerate() {
            let sent = value(if k % 2 == 0 { 1.0 } else { 2.0 });
            index.sent(slot, &[0], |_| Observed::Value(&sent), t0);
        }
        let mut passed = Vec::new();
        let quiet = value(1.5);
        index.evaluate(t0 + 100 * MS, |_| Observed::Value(&quiet), &mut passed);
        assert!(passed.is_empty());
        assert!(index.candidates.is_empty(), "nothing was even offered");
        let up = value(2.1);
        index.evaluate(t0 + 200 * MS, |_| Observed::Value(&up), &mut passed);
        assert_eq!(passed.len(), 500, "those that sent 1.0");
        assert_eq!(index.candidates.len(), 500, "and only they were offered");
    }
}

//! What a subscription lets through: deadbands, rate limits and heartbeats, decided per
//! (subscription, channel) against the value last sent, with times passed in.
//!
//! A subscription without options sends every channel every tick, as the reference clients
//! document a subscription ("values of the named channels about every interval":
//! `accordionq2/subscriptions.py` 5.28.1, `WebApiClient/Groups/SubscriptionsGroup.cs` at 7e52c61). With options, a channel's value passes when:
//! - nothing was sent for it yet, or its status changed (a read error, a different error, a
//!   value coming back): always, whatever the other options say;
//! - its heartbeat is due (`MaxIntervalMs` since the value last sent): always;
//! - else not within `MinIntervalMs` of the value last sent;
//! - else, with a deadband, only when it moved by strictly more than the deadband (numbers),
//!   or changed at all (booleans, enums, strings, bytes); without one, on every tick.

use std::time::Duration;

use station_protocol::Value;
use tokio::time::Instant;

/// A deadband as asked: in the channel's unit, or in percent of its range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Deadband {
    Absolute(f64),
    Percent(f64),
}

/// The options of a subscription, or of one channel of it (`ChannelOptions`), as asked.
/// A channel's own options replace the subscription's field by field.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FilterOptions {
    pub deadband: Option<Deadband>,
    pub min_interval: Option<Duration>,
    pub max_interval: Option<Duration>,
}

impl FilterOptions {
    /// True when nothing is asked: every value on every tick.
    pub fn is_empty(&self) -> bool {
        *self == FilterOptions::default()
    }

    /// These options, each field that `over` gives replaced by it.
    pub fn overlaid_by(&self, over: &FilterOptions) -> FilterOptions {
        FilterOptions {
            deadband: over.deadband.or(self.deadband),
            min_interval: over.min_interval.or(self.min_interval),
            max_interval: over.max_interval.or(self.max_interval),
        }
    }
}

/// One channel's filter, the deadband in the channel's unit.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ChannelFilter {
    pub deadband: Option<f64>,
    pub min_interval: Option<Duration>,
    pub max_interval: Option<Duration>,
}

/// Why options cannot be applied to a channel.
#[derive(Debug, Clone, PartialEq)]
pub enum ResolveError {
    /// A percent deadband for a channel whose range is not known.
    NoRange,
}

impl ChannelFilter {
    /// `options` for a channel whose range is `range` (low, high), if known.
    pub fn resolve(
        options: &FilterOptions,
        range: Option<(f64, f64)>,
    ) -> Result<ChannelFilter, ResolveError> {
        let deadband = match options.deadband {
            None => None,
            Some(Deadband::Absolute(band)) => Some(band),
            Some(Deadband::Percent(percent)) => {
                let (low, high) = range.ok_or(ResolveError::NoRange)?;
                Some((high - low).abs() * percent / 100.0)
            }
        };
        Ok(ChannelFilter {
            deadband,
            min_interval: options.min_interval,
            max_interval: options.max_interval,
        })
    }
}

/// `[events] ranges`: each channel's range (low, high) by exact name or glob pattern, for
/// percent deadbands. An exact name comes first; a name several patterns match takes the
/// longest pattern's range.
#[derive(Debug, Default)]
pub struct Ranges {
    /// Each pattern with its rank (higher first) and range.
    patterns: Vec<(globset::GlobMatcher, usize, (f64, f64))>,
}

impl Ranges {
    /// The ranges of the config; patterns the config's validation refused are left out.
    pub fn new(ranges: &std::collections::BTreeMap<String, [f64; 2]>) -> Ranges {
        let mut patterns: Vec<_> = ranges
            .iter()
            .filter_map(|(pattern, [low, high])| {
                let glob = globset::Glob::new(pattern).ok()?;
                // An exact name before every pattern, then the longest pattern first.
                let exact = !pattern.contains(['*', '?', '[', '{']);
                let rank = if exact { usize::MAX } else { pattern.len() };
                Some((glob.compile_matcher(), rank, (*low, *high)))
            })
            .collect();
        patterns.sort_by_key(|(_, rank, _)| std::cmp::Reverse(*rank));
        Ranges { patterns }
    }

    /// The range of the channel called `name`, if the config gives one.
    pub fn of(&self, name: &str) -> Option<(f64, f64)> {
        self.patterns
            .iter()
            .find(|(matcher, _, _)| matcher.is_match(name))
            .map(|(_, _, range)| *range)
    }
}

/// What one tick observed of one channel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observed<'a> {
    Value(&'a Value),
    Error(&'a str),
}

impl Observed<'_> {
    /// The number the deadband compares, if the observation is one (`NaN` included).
    pub fn number(&self) -> Option<f64> {
        match self {
            Observed::Value(value) => number(value),
            Observed::Error(_) => None,
        }
    }
}

/// What was last sent of one channel, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    seen: Seen,
    at: Instant,
}

#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Number(f64),
    Other(Value),
    Error(String),
}

impl Sent {
    pub fn new(observed: Observed<'_>, at: Instant) -> Sent {
        let seen = match observed {
            Observed::Value(value) => match number(value) {
                Some(x) => Seen::Number(x),
                None => Seen::Other(value.clone()),
            },
            Observed::Error(why) => Seen::Error(why.to_owned()),
        };
        Sent { seen, at }
    }
}

/// What a [`Sent`] showed, for the index that files it (`filter_index`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shown<'a> {
    Error(&'a str),
    Number(f64),
    Other(&'a Value),
}

impl Sent {
    /// When it went out.
    pub fn at(&self) -> Instant {
        self.at
    }

    pub fn shown(&self) -> Shown<'_> {
        match &self.seen {
            Seen::Number(x) => Shown::Number(*x),
            Seen::Other(value) => Shown::Other(value),
            Seen::Error(why) => Shown::Error(why),
        }
    }

    /// Whether `other` showed the same to the rule (any NaN is the same NaN): every
    /// observation moved as far from one as from the other.
    pub fn same_shown(&self, other: &Sent) -> bool {
        match (&self.seen, &other.seen) {
            (Seen::Number(a), Seen::Number(b)) => a == b || (a.is_nan() && b.is_nan()),
            (a, b) => a == b,
        }
    }
}

/// A number's value, for the deadband; `None` for values compared by equality.
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Float(x) => Some(*x),
        Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

/// Whether `observed` at `now` goes out, given what was last sent of this channel.
pub fn passes(
    filter: &ChannelFilter,
    last: Option<&Sent>,
    observed: Observed<'_>,
    now: Instant,
) -> bool {
    let Some(last) = last else {
        return true;
    };
    let Some(moved) = moved(last, observed) else {
        return true;
    };
    let since = now.saturating_duration_since(last.at);
    if filter
        .max_interval
        .is_some_and(|heartbeat| since >= heartbeat)
    {
        return true;
    }
    if filter.min_interval.is_some_and(|least| since < least) {
        return false;
    }
    filter.deadband.is_none_or(|band| moved > band)
}

/// How far `observed` moved from what was last sent; `None` for a change of status (a read
/// error, a different error, a value coming back). Equal values and an unchanged error move
/// by 0, a value of another kind by infinity.
pub fn moved(last: &Sent, observed: Observed<'_>) -> Option<f64> {
    match (&last.seen, observed) {
        (Seen::Error(before), Observed::Error(now)) if before == now => Some(0.0),
        (Seen::Error(_), _) | (_, Observed::Error(_)) => None,
        (Seen::Number(before), Observed::Value(value)) => match number(value) {
            Some(x) => Some(number_moved(*before, x)),
            None => Some(f64::INFINITY),
        },
        (Seen::Other(before), Observed::Value(value)) => {
            Some(if before == value { 0.0 } else { f64::INFINITY })
        }
    }
}

/// How far number `x` is from `before`, the number last sent.
fn number_moved(before: f64, x: f64) -> f64 {
    if x.is_nan() && before.is_nan() {
        0.0
    } else if !(x.is_nan() || before.is_nan()) {
        (x - before).abs()
    } else {
        f64::INFINITY
    }
}

/// Where a deadband around a finite number last sent ends, worked out from the rule itself
/// (`moved > band`), to the last bit: a number (not NaN) leaves the band exactly when it is at
/// or below `below`, or at or above `above`. `None` on a side no number leaves it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BandEdges {
    pub below: Option<f64>,
    pub above: Option<f64>,
}

/// The edges of `band` around `last`; `None` for a `last` that is not finite.
///
/// `x - last` rounds monotonically in `x`, so how far `x` moved only grows away from `last`
/// on either side: each side's edge is found by bisecting the floats in their total order.
pub fn band_edges(last: f64, band: f64) -> Option<BandEdges> {
    if !last.is_finite() {
        return None;
    }
    let leaves = |x: f64| number_moved(last, x) > band;
    let at_last = order_key(last);
    let above = first_leaving(
        at_last,
        order_key(f64::INFINITY),
        order_key(last + band),
        |key| leaves(from_order_key(key)),
    )
    .map(from_order_key);
    // Below, the same search on negated keys, so that the first found is the highest.
    let below = first_leaving(
        -at_last,
        -order_key(f64::NEG_INFINITY),
        -order_key(last - band),
        |key| leaves(from_order_key(-key)),
    )
    .map(|key| from_order_key(-key));
    Some(BandEdges { below, above })
}

/// The first key of `from..=to` where `leaves` holds, given that it holds for every key after
/// one that it holds for; `None` when it does not hold at `to`. Walks a few keys from `guess`
/// (the sum the band suggests) before bisecting.
fn first_leaving(from: i64, to: i64, guess: i64, leaves: impl Fn(i64) -> bool) -> Option<i64> {
    if !leaves(to) {
        return None;
    }
    // The edge is almost always within a few bits of the sum: walk there first.
    if (from..=to).contains(&guess) {
        let mut key = guess;
        if leaves(key) {
            for _ in 0..4 {
                if key == from || !leaves(key - 1) {
                    return Some(key);
                }
                key -= 1;
            }
        } else {
            for _ in 0..4 {
                if key == to {
                    break;
                }
                key += 1;
                if leaves(key) {
                    return Some(key);
                }
            }
        }
    }
    let (mut low, mut high) = (from, to);
    while low < high {
        let middle = (i128::from(low) + i128::from(high)).div_euclid(2) as i64;
        if leaves(middle) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Some(low)
}

/// A float's place in the total order of floats (`f64::total_cmp`) as an integer: -0 just
/// below +0, NaNs outside the infinities.
pub fn order_key(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

fn from_order_key(key: i64) -> f64 {
    f64::from_bits((key ^ (((key >> 63) as u64) >> 1) as i64) as u64)
}

/// A subscription's filters and what it last sent, one slot per channel in the
/// subscription's order.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionFilter {
    filters: Vec<ChannelFilter>,
    last: Vec<Option<Sent>>,
}

impl SubscriptionFilter {
    pub fn new(filters: Vec<ChannelFilter>) -> SubscriptionFilter {
        let last = vec![None; filters.len()];
        SubscriptionFilter { filters, last }
    }

    /// The filters, in channel order.
    pub fn filters(&self) -> &[ChannelFilter] {
        &self.filters
    }

    /// Whether channel `index`'s `observed` goes out at `now`.
    pub fn passes(&self, index: usize, observed: Observed<'_>, now: Instant) -> bool {
        match self.filters.get(index) {
            Some(filter) => passes(filter, self.last[index].as_ref(), observed, now),
            None => true,
        }
    }

    /// Records that channel `index`'s `observed` went out at `now`.
    pub fn sent(&mut self, index: usize, observed: Observed<'_>, now: Instant) {
        if let Some(slot) = self.last.get_mut(index) {
            *slot = Some(Sent::new(observed, now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn absolute(band: f64) -> ChannelFilter {
        ChannelFilter {
            deadband: Some(band),
            ..ChannelFilter::default()
        }
    }

    fn sent_float(x: f64, at: Instant) -> Sent {
        Sent::new(Observed::Value(&Value::Float(x)), at)
    }

    fn float_passes(filter: &ChannelFilter, last: &Sent, x: f64, at: Instant) -> bool {
        passes(filter, Some(last), Observed::Value(&Value::Float(x)), at)
    }

    /// Whether number `x` leaves the band around `last` by the rule itself.
    fn leaves(last: f64, band: f64, x: f64) -> bool {
        let t0 = Instant::now();
        float_passes(&absolute(band), &sent_float(last, t0), x, t0)
    }

    #[test]
    fn band_edges_are_where_the_rule_starts_passing_to_the_last_bit() {
        let cases = [
            (0.1, 0.2),
            (3.3, 0.5),
            (-3.3, 0.02),
            (0.0, 0.0),
            (-0.0, 0.25),
            (1e16, 0.5),
            (5.0, 1e-320),
            (1e308, 1e308),
            (-1e308, 1e300),
            (7.0, f64::INFINITY),
            (2.0, -1.0),
        ];
        for (last, band) in cases {
            let edges = band_edges(last, band).unwrap();
            if let Some(above) = edges.above {
                assert!(leaves(last, band, above), "{last} ± {band}: above {above}");
                let inside = above.next_down();
                assert!(
                    inside < last || !leaves(last, band, inside),
                    "{last} ± {band}: {inside} below the upper edge {above} passes"
                );
            } else {
                assert!(!leaves(last, band, f64::INFINITY), "{last} ± {band}");
            }
            if let Some(below) = edges.below {
                assert!(leaves(last, band, below), "{last} ± {band}: below {below}");
                let inside = below.next_up();
                assert!(
                    inside > last || !leaves(last, band, inside),
                    "{last} ± {band}: {inside} above the lower edge {below} passes"
                );
            } else {
                assert!(!leaves(last, band, f64::NEG_INFINITY), "{last} ± {band}");
            }
            // Around each edge and the band's sums, bit by bit, and far off.
            let mut probes = vec![
                last,
                last + band,
                last - band,
                f64::INFINITY,
                -f64::INFINITY,
            ];
            probes.extend(edges.above);
            probes.extend(edges.below);
            let mut xs = Vec::new();
            for probe in probes {
                let (mut up, mut down) = (probe, probe);
                for _ in 0..4 {
                    xs.extend([up, down]);
                    up = up.next_up();
                    down = down.next_down();
                }
            }
            for x in xs.into_iter().filter(|x| !x.is_nan()) {
                let by_edges = edges.below.is_some_and(|below| x.total_cmp(&below).is_le())
                    || edges.above.is_some_and(|above| x.total_cmp(&above).is_ge());
                assert_eq!(by_edges, leaves(last, band, x), "{last} ± {band} at {x}");
            }
        }
        assert_eq!(band_edges(f64::NAN, 1.0), None);
        assert_eq!(band_edges(f64::INFINITY, 1.0), None);
    }

    #[test]
    fn the_order_key_sorts_floats_as_total_cmp_does() {
        let xs = [
            f64::NEG_INFINITY,
            -1e300,
            -1.0,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            5e-324,
            1.0,
            f64::MAX,
            f64::INFINITY,
        ];
        for pair in xs.windows(2) {
            assert!(order_key(pair[0]) < order_key(pair[1]), "{pair:?}");
        }
        for x in xs {
            assert_eq!(from_order_key(order_key(x)).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn ranges_match_names_and_globs_the_longest_pattern_first() {
        let config = [
            ("0.4.*".to_owned(), [0.0, 10.0]),
            ("0.4.ESH10000662.VMON*".to_owned(), [0.0, 3000.0]),
            ("0.4.ESH10000662.VMON2".to_owned(), [0.0, 1.0]),
        ]
        .into_iter()
        .collect();
        let ranges = Ranges::new(&config);
        assert_eq!(ranges.of("0.4.ESH10000662.VMON1"), Some((0.0, 3000.0)));
        assert_eq!(ranges.of("0.4.ESH10000662.VMON2"), Some((0.0, 1.0)));
        assert_eq!(ranges.of("0.4.ESH10000662.ISET1"), Some((0.0, 10.0)));
        assert_eq!(ranges.of("0.8.ESH10000590.ADC01"), None);
    }

    #[test]
    fn the_first_value_always_passes() {
        let now = Instant::now();
        for filter in [absolute(1e9), ChannelFilter::default()] {
            assert!(passes(
                &filter,
                None,
                Observed::Value(&Value::Float(1.0)),
                now
            ));
            assert!(passes(&filter, None, Observed::Error("gone"), now));
        }
    }

    #[test]
    fn an_absolute_deadband_passes_strictly_more_than_the_band_either_way() {
        let t0 = Instant::now();
        let filter = absolute(1.0);
        let last = sent_float(10.0, t0);
        let t = t0 + 100 * MS;
        assert!(!float_passes(&filter, &last, 10.5, t), "just below");
        assert!(!float_passes(&filter, &last, 11.0, t), "at the band");
        assert!(
            !float_passes(&filter, &last, 9.0, t),
            "at the band, downwards"
        );
        assert!(float_passes(&filter, &last, 11.000_001, t), "just above");
        assert!(
            float_passes(&filter, &last, 8.999_999, t),
            "just above, downwards"
        );
    }

    #[test]
    fn a_zero_deadband_passes_any_change_and_no_repeat() {
        let t0 = Instant::now();
        let filter = absolute(0.0);
        let last = sent_float(5.0, t0);
        assert!(!float_passes(&filter, &last, 5.0, t0 + MS));
        assert!(float_passes(&filter, &last, 5.000_000_1, t0 + MS));
    }

    #[test]
    fn integers_are_numbers_for_the_deadband() {
        let t0 = Instant::now();
        let filter = absolute(2.0);
        let last = Sent::new(Observed::Value(&Value::Integer(10)), t0);
        let passes_int = |i| {
            passes(
                &filter,
                Some(&last),
                Observed::Value(&Value::Integer(i)),
                t0,
            )
        };
        assert!(!passes_int(12));
        assert!(passes_int(13));
        assert!(passes_int(7));
    }

    #[test]
    fn nan_passes_when_it_comes_or_goes_not_when_it_stays() {
        let t0 = Instant::now();
        let filter = absolute(1.0);
        let number = sent_float(1.0, t0);
        let nan = sent_float(f64::NAN, t0);
        assert!(float_passes(&filter, &number, f64::NAN, t0));
        assert!(float_passes(&filter, &nan, 1.0, t0));
        assert!(!float_passes(&filter, &nan, f64::NAN, t0));
    }

    #[test]
    fn booleans_enums_and_strings_pass_on_any_change_whatever_the_band() {
        let t0 = Instant::now();
        let filter = absolute(1e9);
        for (before, after) in [
            (Value::Bool(false), Value::Bool(true)),
            (Value::Enum("Red".into()), Value::Enum("Green".into())),
            (Value::String("a".into()), Value::String("b".into())),
        ] {
            let last = Sent::new(Observed::Value(&before), t0);
            assert!(passes(&filter, Some(&last), Observed::Value(&after), t0));
            assert!(!passes(&filter, Some(&last), Observed::Value(&before), t0));
        }
    }

    #[test]
    fn a_change_of_status_passes_a_deadband_and_a_rate_limit() {
        let t0 = Instant::now();
        let filter = ChannelFilter {
            deadband: Some(1e9),
            min_interval: Some(10_000 * MS),
            max_interval: None,
        };
        let value = sent_float(1.0, t0);
        let error = Sent::new(Observed::Error("station not reached"), t0);
        let soon = t0 + MS;
        assert!(passes(
            &filter,
            Some(&value),
            Observed::Error("read error"),
            soon
        ));
        assert!(
            float_passes(&filter, &error, 1.0, soon),
            "a value comes back"
        );
        assert!(passes(
            &filter,
            Some(&error),
            Observed::Error("another error"),
            soon
        ));
        assert!(!passes(
            &filter,
            Some(&error),
            Observed::Error("station not reached"),
            soon
        ));
    }

    #[test]
    fn without_a_deadband_every_tick_passes_outside_the_rate_limit() {
        let t0 = Instant::now();
        let filter = ChannelFilter {
            min_interval: Some(500 * MS),
            ..ChannelFilter::default()
        };
        let last = sent_float(1.0, t0);
        assert!(!float_passes(&filter, &last, 2.0, t0 + 499 * MS));
        assert!(float_passes(&filter, &last, 1.0, t0 + 500 * MS));
    }

    #[test]
    fn without_a_deadband_an_unchanged_error_is_sent_every_tick_as_a_value_is() {
        let t0 = Instant::now();
        let error = Sent::new(Observed::Error("gone"), t0);
        let filter = ChannelFilter::default();
        assert!(passes(
            &filter,
            Some(&error),
            Observed::Error("gone"),
            t0 + MS
        ));
        assert!(!passes(
            &absolute(0.0),
            Some(&error),
            Observed::Error("gone"),
            t0 + MS
        ));
    }

    #[test]
    fn a_number_that_becomes_another_type_passes_a_deadband() {
        let t0 = Instant::now();
        let last = sent_float(1.0, t0);
        let text = Value::String("1".into());
        assert!(passes(
            &absolute(1e9),
            Some(&last),
            Observed::Value(&text),
            t0
        ));
    }

    #[test]
    fn a_rate_limit_holds_back_a_change_until_it_has_passed() {
        let t0 = Instant::now();
        let filter = ChannelFilter {
            deadband: Some(0.5),
            min_interval: Some(1000 * MS),
            max_interval: None,
        };
        let last = sent_float(1.0, t0);
        assert!(!float_passes(&filter, &last, 5.0, t0 + 999 * MS));
        assert!(float_passes(&filter, &last, 5.0, t0 + 1000 * MS));
        assert!(
            !float_passes(&filter, &last, 1.2, t0 + 5000 * MS),
            "still inside the band"
        );
    }

    #[test]
    fn a_heartbeat_passes_an_unchanged_value_once_due() {
        let t0 = Instant::now();
        let filter = ChannelFilter {
            deadband: Some(10.0),
            min_interval: None,
            max_interval: Some(2000 * MS),
        };
        let last = sent_float(1.0, t0);
        assert!(!float_passes(&filter, &last, 1.0, t0 + 1999 * MS));
        assert!(float_passes(&filter, &last, 1.0, t0 + 2000 * MS));
        let error = Sent::new(Observed::Error("gone"), t0);
        assert!(passes(
            &filter,
            Some(&error),
            Observed::Error("gone"),
            t0 + 2000 * MS
        ));
        assert!(!passes(
            &filter,
            Some(&error),
            Observed::Error("gone"),
            t0 + 1999 * MS
        ));
    }

    #[test]
    fn a_percent_deadband_needs_a_range_and_is_a_share_of_it() {
        let options = FilterOptions {
            deadband: Some(Deadband::Percent(1.0)),
            ..FilterOptions::default()
        };
        assert_eq!(
            ChannelFilter::resolve(&options, None),
            Err(ResolveError::NoRange)
        );
        let filter = ChannelFilter::resolve(&options, Some((0.0, 3000.0))).unwrap();
        assert_eq!(filter.deadband, Some(30.0));
        let reversed = ChannelFilter::resolve(&options, Some((10.0, -10.0))).unwrap();
        assert_eq!(reversed.deadband, Some(0.2));
        let absolute = FilterOptions {
            deadband: Some(Deadband::Absolute(0.5)),
            min_interval: Some(MS),
            max_interval: Some(2 * MS),
        };
        assert_eq!(
            ChannelFilter::resolve(&absolute, None),
            Ok(ChannelFilter {
                deadband: Some(0.5),
                min_interval: Some(MS),
                max_interval: Some(2 * MS),
            })
        );
        assert_eq!(
            ChannelFilter::resolve(&FilterOptions::default(), None),
            Ok(ChannelFilter::default())
        );
    }

    #[test]
    fn channel_options_replace_the_subscriptions_field_by_field() {
        let all = FilterOptions {
            deadband: Some(Deadband::Absolute(1.0)),
            min_interval: Some(MS),
            max_interval: None,
        };
        let own = FilterOptions {
            deadband: Some(Deadband::Percent(5.0)),
            max_interval: Some(3 * MS),
            ..FilterOptions::default()
        };
        assert_eq!(
            all.overlaid_by(&own),
            FilterOptions {
                deadband: Some(Deadband::Percent(5.0)),
                min_interval: Some(MS),
                max_interval: Some(3 * MS),
            }
        );
        assert_eq!(all.overlaid_by(&FilterOptions::default()), all);
        assert!(FilterOptions::default().is_empty());
        assert!(!all.is_empty());
    }

    #[test]
    fn a_subscription_filter_compares_with_what_it_last_sent_per_channel() {
        let t0 = Instant::now();
        let mut filter = SubscriptionFilter::new(vec![absolute(1.0), absolute(100.0)]);
        let one = Value::Float(1.0);
        let three = Value::Float(3.0);
        assert!(filter.passes(0, Observed::Value(&one), t0));
        filter.sent(0, Observed::Value(&one), t0);
        filter.sent(1, Observed::Value(&one), t0);
        assert!(filter.passes(0, Observed::Value(&three), t0));
        assert!(!filter.passes(1, Observed::Value(&three), t0));
        assert!(!filter.passes(0, Observed::Value(&one), t0));
        assert!(
            filter.passes(7, Observed::Value(&one), t0),
            "out of range: unfiltered"
        );
        filter.sent(7, Observed::Value(&one), t0);
        assert_eq!(filter.filters().len(), 2);
    }
}

//! What a subscription lets through: deadbands, rate limits and heartbeats, decided per
//! (subscription, channel) against the value last sent, with times passed in.
//!
//! A subscription without options sends every channel every tick, as the reference clients
//! expect. With options, a channel's value passes when:
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
    // How far the value moved since it was last sent; `None` for a change of status.
    let moved = match (&last.seen, observed) {
        (Seen::Error(before), Observed::Error(now)) if before == now => Some(0.0),
        (Seen::Error(_), _) | (_, Observed::Error(_)) => None,
        (Seen::Number(before), Observed::Value(value)) => match number(value) {
            Some(x) if x.is_nan() && before.is_nan() => Some(0.0),
            Some(x) if !(x.is_nan() || before.is_nan()) => Some((x - before).abs()),
            _ => Some(f64::INFINITY),
        },
        (Seen::Other(before), Observed::Value(value)) => {
            Some(if before == value { 0.0 } else { f64::INFINITY })
        }
    };
    let Some(moved) = moved else {
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

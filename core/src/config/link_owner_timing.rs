//! The link-owner lease's timing from `[lease]`: derived from the TTL unless set, and the
//! rules it must keep, checked at start-up (`lease::link_owner` runs the lease by it).

use std::time::Duration;

use super::Config;

/// The pause before trying again after a renewal failed while the lease is still ours.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(200);

impl Config {
    /// The link-owner lease's timing from `[lease]` (the rules: `LinkOwnerTiming::check`).
    pub fn link_owner_timing(&self) -> LinkOwnerTiming {
        let lease = &self.lease;
        let keys = TimingKeys {
            ttl_ms: lease.link_owner_ttl_ms,
            renew_ms: lease.link_owner_renew_ms,
            store_timeout_ms: lease.link_owner_store_timeout_ms,
            margin_ms: lease.link_owner_margin_ms,
            lock_delay_ms: lease.link_owner_lock_delay_ms,
        };
        LinkOwnerTiming::configured(keys, self.max_processing())
    }
}

/// The link-owner lease's timing, in the manner of Patroni's `loop_wait + 2 × retry_timeout
/// ≤ ttl`. By default all from its TTL: renewals every TTL/3, each given at most TTL/3 by the
/// store, and the link may send only until TTL − TTL/5 after the last confirmed renewal was
/// sent. So a gateway that cannot renew stops sending a fifth of the TTL before the store lets
/// another take the station, and a renewal that failed at its timeout is tried once more
/// before the link stops. A gateway that takes over a lease that lapsed waits the lock-delay
/// before it sends anything. The rules ([`LinkOwnerTiming::check`]), checked at start-up:
///
/// 1. `renew + store timeout + 200 ms < TTL − margin`: a renewal that fails at its timeout is
///    tried again while the link may still send.
/// 2. `margin ≥ 100 ms`: a frame that passed the gate has time to reach the station before
///    the store may let another gateway take it.
/// 3. `margin + lock-delay ≥ station.max_processing_ms`: a change the old owner sent just
///    before it stopped has been carried out or abandoned by the station before the taker's
///    first frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkOwnerTiming {
    pub ttl: Duration,
    pub renew_every: Duration,
    pub store_timeout: Duration,
    /// How long before the lease lapses in the store the link stops sending.
    pub margin: Duration,
    /// How long a gateway that took over a lapsed lease waits before it sends anything.
    pub lock_delay: Duration,
}

/// The configured keys of the link-owner lease's timing (`[lease]`, milliseconds; `None`:
/// derived from the TTL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimingKeys {
    pub ttl_ms: u64,
    pub renew_ms: Option<u64>,
    pub store_timeout_ms: Option<u64>,
    pub margin_ms: Option<u64>,
    pub lock_delay_ms: Option<u64>,
}

/// A timing that breaks a rule: the key to blame first, and the rule with its numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimingRuleBroken {
    pub key: &'static str,
    pub message: String,
}

const MIN_MARGIN: Duration = Duration::from_millis(100);

impl LinkOwnerTiming {
    pub fn for_ttl(ttl: Duration) -> LinkOwnerTiming {
        LinkOwnerTiming {
            ttl,
            renew_every: ttl / 3,
            store_timeout: ttl / 3,
            margin: ttl / 5,
            lock_delay: Duration::ZERO,
        }
    }

    /// The timing the keys give; a lock-delay not configured is the least that keeps rule 3,
    /// and at least the margin plus one store timeout.
    pub fn configured(keys: TimingKeys, max_processing: Duration) -> LinkOwnerTiming {
        let ms = Duration::from_millis;
        let ttl = ms(keys.ttl_ms);
        let derived = LinkOwnerTiming::for_ttl(ttl);
        let renew_every = keys.renew_ms.map_or(derived.renew_every, ms);
        let store_timeout = keys.store_timeout_ms.map_or(derived.store_timeout, ms);
        let margin = keys.margin_ms.map_or(derived.margin, ms);
        let lock_delay = keys.lock_delay_ms.map_or_else(
            || (margin + store_timeout).max(max_processing.saturating_sub(margin)),
            ms,
        );
        LinkOwnerTiming {
            ttl,
            renew_every,
            store_timeout,
            margin,
            lock_delay,
        }
    }

    /// Whether a renewal that fails at its timeout leaves time for another before the link
    /// must stop (rule 1), and a margin.
    pub fn holds(&self) -> bool {
        !self.margin.is_zero()
            && self.renew_every + self.store_timeout + RETRY_AFTER_FAILURE
                < self.ttl.saturating_sub(self.margin)
    }

    /// The rules above, each broken one named by its keys and numbers.
    pub fn check(&self, max_processing: Duration) -> Result<(), TimingRuleBroken> {
        let ms = |d: Duration| d.as_millis();
        let broken = |key, message: String| Err(TimingRuleBroken { key, message });
        if self.margin < MIN_MARGIN {
            return broken(
                "lease.link_owner_margin_ms",
                format!(
                    "must be at least {} ms (a frame that passed the gate must reach the station before another gateway may take it); it is {} ms",
                    ms(MIN_MARGIN),
                    ms(self.margin)
                ),
            );
        }
        if !self.holds() {
            return broken(
                "lease.link_owner_ttl_ms",
                format!(
                    "the rule lease.link_owner_renew_ms + lease.link_owner_store_timeout_ms + {} ms < lease.link_owner_ttl_ms − lease.link_owner_margin_ms is broken: {} + {} + {} ms is not below {} − {} ms (a renewal that fails at its timeout must be tried again while the link may still send: a longer TTL, or a shorter renewal interval, store timeout or margin)",
                    ms(RETRY_AFTER_FAILURE),
                    ms(self.renew_every),
                    ms(self.store_timeout),
                    ms(RETRY_AFTER_FAILURE),
                    ms(self.ttl),
                    ms(self.margin),
                ),
            );
        }
        if self.margin + self.lock_delay < max_processing {
            return broken(
                "lease.link_owner_lock_delay_ms",
                format!(
                    "the rule lease.link_owner_margin_ms + lease.link_owner_lock_delay_ms ≥ station.max_processing_ms is broken: {} + {} ms is below {} ms (a change the old owner sent just before it stopped must be carried out or abandoned by the station before the taker's first frame: a longer lock-delay, or a shorter station.max_processing_ms)",
                    ms(self.margin),
                    ms(self.lock_delay),
                    ms(max_processing),
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ttl_ms: u64) -> TimingKeys {
        TimingKeys {
            ttl_ms,
            renew_ms: None,
            store_timeout_ms: None,
            margin_ms: None,
            lock_delay_ms: None,
        }
    }

    const MAX_PROCESSING: Duration = Duration::from_secs(8);

    #[test]
    fn the_default_timing_is_all_from_the_ttl_and_keeps_every_rule() {
        let timing = LinkOwnerTiming::configured(keys(10_000), MAX_PROCESSING);
        assert_eq!(timing.renew_every, Duration::from_secs(10) / 3);
        assert_eq!(timing.store_timeout, Duration::from_secs(10) / 3);
        assert_eq!(timing.margin, Duration::from_secs(2));
        assert_eq!(
            timing.lock_delay,
            Duration::from_secs(6),
            "what keeps margin + lock-delay ≥ max processing"
        );
        assert_eq!(timing.check(MAX_PROCESSING), Ok(()));
        let short = LinkOwnerTiming::configured(keys(2_000), Duration::from_millis(500));
        assert_eq!(
            short.lock_delay,
            Duration::from_millis(400) + Duration::from_secs(2) / 3,
            "at least the margin and one store timeout"
        );
        assert_eq!(short.check(Duration::from_millis(500)), Ok(()));
    }

    #[test]
    fn a_renewal_that_could_not_be_tried_again_in_time_is_refused_naming_the_keys() {
        let timing = LinkOwnerTiming::configured(
            TimingKeys {
                store_timeout_ms: Some(5_000),
                ..keys(10_000)
            },
            MAX_PROCESSING,
        );
        let broken = timing.check(MAX_PROCESSING).unwrap_err();
        assert_eq!(broken.key, "lease.link_owner_ttl_ms");
        for key in [
            "lease.link_owner_renew_ms",
            "lease.link_owner_store_timeout_ms",
            "lease.link_owner_margin_ms",
            "3333 + 5000 + 200 ms is not below 10000 − 2000 ms",
        ] {
            assert!(broken.message.contains(key), "{key}: {}", broken.message);
        }
    }

    #[test]
    fn a_lock_delay_that_leaves_a_change_of_the_old_owner_at_the_station_is_refused() {
        let timing = LinkOwnerTiming::configured(
            TimingKeys {
                lock_delay_ms: Some(1_000),
                ..keys(10_000)
            },
            MAX_PROCESSING,
        );
        let broken = timing.check(MAX_PROCESSING).unwrap_err();
        assert_eq!(broken.key, "lease.link_owner_lock_delay_ms");
        assert!(
            broken.message.contains("station.max_processing_ms")
                && broken.message.contains("2000 + 1000 ms is below 8000 ms"),
            "{}",
            broken.message
        );
    }

    #[test]
    fn a_margin_too_small_to_cover_a_frame_on_its_way_is_refused() {
        let timing = LinkOwnerTiming::configured(
            TimingKeys {
                margin_ms: Some(10),
                lock_delay_ms: Some(10_000),
                ..keys(10_000)
            },
            MAX_PROCESSING,
        );
        assert_eq!(
            timing.check(MAX_PROCESSING).unwrap_err().key,
            "lease.link_owner_margin_ms"
        );
    }
}

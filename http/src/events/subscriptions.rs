//! Subscriptions of the event stream: a create, update or removal checked against the limits
//! and the channel list, and its filters (deadband, least and most interval) checked one by one.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;

impl Events {
    /// Checks a create or update request against the limits and the channel list.
    fn check(&self, request: &SubscriptionRequest) -> Result<Checked, EventsError> {
        if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&request.interval_ms) {
            return Err(EventsError::IntervalOutOfRange(request.interval_ms));
        }
        let mut channels: Vec<String> = Vec::with_capacity(request.channels.len());
        for name in &request.channels {
            if !channels.contains(name) {
                channels.push(name.clone());
            }
        }
        if channels.is_empty() {
            return Err(EventsError::NoChannels);
        }
        if channels.len() > self.limits.max_channels_per_subscription {
            return Err(EventsError::TooManyChannels {
                count: channels.len(),
                max: self.limits.max_channels_per_subscription,
            });
        }
        let info = self
            .station
            .reached()
            .map_err(|not_reached| EventsError::StationNotReached(not_reached.why))?;
        if let Some(unknown) = channels
            .iter()
            .find(|name| info.channels.get(name).is_none())
        {
            return Err(EventsError::UnknownChannel(unknown.clone()));
        }
        let filters = self.filters(request, &channels)?;
        Ok(Checked {
            channels: channels.into(),
            filters,
        })
    }

    /// Each channel's filter, or `None` when the request asks for none.
    fn filters(
        &self,
        request: &SubscriptionRequest,
        channels: &[String],
    ) -> Result<Option<Vec<ChannelFilter>>, EventsError> {
        check_options(&request.options, request.interval_ms, "")?;
        for (name, options) in &request.channel_options {
            if !channels.contains(name) {
                return Err(EventsError::BadFilter(format!(
                    "ChannelOptions names {name}, which is not among Channels"
                )));
            }
            check_options(
                options,
                request.interval_ms,
                &format!("ChannelOptions.{name}."),
            )?;
        }
        let asked = !request.options.is_empty()
            || request
                .channel_options
                .iter()
                .any(|(_, options)| !options.is_empty());
        if !asked {
            return Ok(None);
        }
        let filters = channels
            .iter()
            .map(|name| {
                let own = request
                    .channel_options
                    .iter()
                    .rev()
                    .find(|(named, _)| named == name)
                    .map(|(_, options)| *options)
                    .unwrap_or_default();
                let options = request.options.overlaid_by(&own);
                check_options(&options, request.interval_ms, &format!("{name}: "))?;
                ChannelFilter::resolve(&options, self.ranges.of(name))
                    .map_err(|ResolveError::NoRange| EventsError::NoRange(name.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(filters))
    }

    /// `POST api/subscriptions`.
    pub fn subscribe(
        &self,
        stream_id: &str,
        request: &SubscriptionRequest,
    ) -> Result<SubscriptionGrant, EventsError> {
        let Checked { channels, filters } = self.check(request)?;
        let now = Instant::now();
        let mut registry = self.registry();
        let entry = registry
            .streams
            .get(stream_id)
            .ok_or_else(|| EventsError::NoSuchStream(stream_id.to_owned()))?;
        if entry.subscriptions.len() >= self.limits.max_subscriptions_per_stream {
            return Err(EventsError::TooManySubscriptions {
                stream: stream_id.to_owned(),
                max: self.limits.max_subscriptions_per_stream,
            });
        }
        let sink = entry.sink.clone();
        let id: Arc<str> = random_id().into();
        let ids = registry.channel_ids.numbers_of(&channels);
        let mut subscription = Subscription {
            id: id.clone(),
            stream: sink,
            channels,
            ids,
            interval: Duration::from_millis(request.interval_ms),
            expires_at: now + self.subscription_ttl,
            // The first values go out at once; later ones on the interval's grid.
            next_due: now,
            filtered: None,
        };
        subscription.filtered = filters.map(|filters| registry.place(&subscription, filters));
        registry.subscriptions.insert(id.clone(), subscription);
        registry.own_ticks.insert(id.clone());
        registry.shortest = None;
        if let Some(entry) = registry.streams.get_mut(stream_id) {
            entry.subscriptions.insert(id.clone());
        }
        drop(registry);
        self.changed.notify_one();
        Ok(SubscriptionGrant {
            id: id.to_string(),
            expires_in: self.subscription_ttl,
        })
    }

    /// `PUT api/subscriptions/{id}`: replaces channels, interval and filter, and renews. A
    /// change of any of them starts the subscription afresh: values at once, all of them.
    pub fn update(
        &self,
        id: &str,
        request: &SubscriptionRequest,
    ) -> Result<SubscriptionGrant, EventsError> {
        let Checked { channels, filters } = self.check(request)?;
        let now = Instant::now();
        let mut registry = self.registry();
        registry.shortest = None;
        let ids = registry.channel_ids.numbers_of(&channels);
        let mut subscription = match registry.subscriptions.remove(id) {
            Some(live) if live.expires_at > now => live,
            expired => {
                // Not renewed in time: the sweep ends it where it is.
                if let Some(expired) = expired {
                    registry.subscriptions.insert(expired.id.clone(), expired);
                }
                return Err(EventsError::NoSuchSubscription(id.to_owned()));
            }
        };
        let interval = Duration::from_millis(request.interval_ms);
        let old_filters = subscription
            .filtered
            .as_ref()
            .map(|filtered| filtered.filters.clone());
        if interval != subscription.interval
            || channels != subscription.channels
            || old_filters != filters
        {
            if let Some(filtered) = subscription.filtered.take() {
                registry.unplace(subscription.interval, &filtered);
            }
            subscription.channels = channels;
            subscription.ids = ids;
            subscription.interval = interval;
            subscription.next_due = now;
            subscription.filtered = filters.map(|filters| registry.place(&subscription, filters));
            registry.own_ticks.insert(subscription.id.clone());
        }
        subscription.expires_at = now + self.subscription_ttl;
        registry
            .subscriptions
            .insert(subscription.id.clone(), subscription);
        drop(registry);
        self.changed.notify_one();
        Ok(SubscriptionGrant {
            id: id.to_owned(),
            expires_in: self.subscription_ttl,
        })
    }

    /// `DELETE api/subscriptions/{id}`.
    pub fn unsubscribe(&self, id: &str) -> Result<(), EventsError> {
        let removed = self.registry().remove_subscription(id);
        match removed {
            Some(_) => {
                self.changed.notify_one();
                Ok(())
            }
            None => Err(EventsError::NoSuchSubscription(id.to_owned())),
        }
    }
}

/// Checks one set of filter options; `field` prefixes the names in the message.
fn check_options(
    options: &FilterOptions,
    interval_ms: u64,
    field: &str,
) -> Result<(), EventsError> {
    let bad = |message: String| Err(EventsError::BadFilter(format!("{field}{message}")));
    match options.deadband {
        Some(Deadband::Absolute(band)) if !(band.is_finite() && band >= 0.0) => {
            return bad(format!(
                "Deadband.Absolute must be a number of 0 or more; got {band}"
            ));
        }
        Some(Deadband::Percent(percent)) if !(0.0..=100.0).contains(&percent) => {
            return bad(format!("Deadband.Percent must be 0 to 100; got {percent}"));
        }
        _ => {}
    }
    let ms = |duration: Duration| duration.as_millis() as u64;
    if let Some(least) = options.min_interval.map(ms)
        && least > MAX_FILTER_INTERVAL_MS
    {
        return bad(format!(
            "MinIntervalMs must be 0 to {MAX_FILTER_INTERVAL_MS}; got {least}"
        ));
    }
    if let Some(heartbeat) = options.max_interval.map(ms) {
        if !(interval_ms..=MAX_FILTER_INTERVAL_MS).contains(&heartbeat) {
            return bad(format!(
                "MaxIntervalMs must be from IntervalMs ({interval_ms}) to {MAX_FILTER_INTERVAL_MS}; got {heartbeat}"
            ));
        }
        if let Some(least) = options.min_interval.map(ms)
            && least > heartbeat
        {
            return bad(format!(
                "MinIntervalMs ({least}) must not be above MaxIntervalMs ({heartbeat})"
            ));
        }
    }
    Ok(())
}

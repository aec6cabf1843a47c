//! `api/numeric-results` bodies: `NumericMeasureRequest {ChannelNetName, TargetNetName,
//! Samples, ReducedSet}` (the .NET client's model) and the acquisition's `{Channel, Target,
//! Samples, Lsl?, Usl?}`. The channel and target are looked up (and checked) after the
//! station's channel list is known, so they are read when the acquisition asks; every field is
//! checked by the handler, in the order declared, so that a body always types and a change's
//! audit line names what was sent (channel, target, samples) even when it is refused.

use serde::Deserialize;

use super::{Finite, Flag, Integer, RequestBody, asked_text};
use crate::body::{Deferred, Sent};
use crate::error::ApiError;
use crate::numeric::Limits;

/// The samples asked for when the body does not say.
const DEFAULT_SAMPLES: i64 = 1000;

/// `POST api/numeric-results/measure`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NumericMeasureRequest {
    pub reduced_set: Deferred<Option<Flag>>,
    pub samples: Sent<Deferred<Option<Integer>>>,
    pub channel_net_name: Sent<Deferred<String>>,
    pub target_net_name: Sent<Deferred<String>>,
}

impl NumericMeasureRequest {
    /// Whether the samples are dropped once summed up (true unless the body says), and how
    /// many are asked for; a 400 naming the first field that is wrong.
    pub fn reduced_and_samples(&self) -> Result<(bool, i64), ApiError> {
        let reduced = self
            .reduced_set
            .check()?
            .is_none_or(|Flag(reduced)| reduced);
        let samples = self.samples.value.check()?;
        Ok((reduced, samples.map_or(DEFAULT_SAMPLES, |Integer(n)| n)))
    }
}

impl RequestBody for NumericMeasureRequest {
    /// `channel=…,target=…,samples=50`, as sent.
    fn asked(&self) -> Option<String> {
        asked_of_numeric(&self.channel_net_name, &self.target_net_name, &self.samples)
    }
}

/// A numeric acquisition's or measurement's `asked=`: the channel, target and samples sent.
fn asked_of_numeric<C, T, S>(
    channel: &Sent<C>,
    target: &Sent<T>,
    samples: &Sent<S>,
) -> Option<String> {
    let parts: Vec<String> = [
        ("channel", &channel.text),
        ("target", &target.text),
        ("samples", &samples.text),
    ]
    .into_iter()
    .filter_map(|(key, text)| Some(format!("{key}={}", text.as_deref()?)))
    .collect();
    asked_text(&parts)
}

/// `POST api/numeric-results/acquire`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NumericAcquireRequest {
    pub lsl: Deferred<Option<Finite>>,
    pub usl: Deferred<Option<Finite>>,
    /// Checked after the limits.
    pub samples: Sent<Deferred<Option<Integer>>>,
    pub channel: Sent<Deferred<String>>,
    pub target: Sent<Deferred<String>>,
}

impl RequestBody for NumericAcquireRequest {
    /// `channel=…,target=…,samples=50`, as sent.
    fn asked(&self) -> Option<String> {
        asked_of_numeric(&self.channel, &self.target, &self.samples)
    }
}

impl NumericAcquireRequest {
    /// `Lsl` and `Usl`: both or neither, `Lsl` below `Usl`; one alone is none (Cp and Cpk
    /// need both), as `NumericResultsGroup.acquire` in `accordionq2/numeric_results.py` 5.28.1
    /// documents ("With both limits, cp and cpk are in the statistics").
    pub fn limits(&self) -> Result<Option<Limits>, ApiError> {
        match (*self.lsl.check()?, *self.usl.check()?) {
            (Some(Finite(lsl)), Some(Finite(usl))) if lsl < usl => Ok(Some(Limits { lsl, usl })),
            (Some(Finite(lsl)), Some(Finite(usl))) => Err(ApiError::bad_request(format!(
                "Lsl ({lsl}) must be below Usl ({usl})"
            ))),
            _ => Ok(None),
        }
    }

    pub fn samples(samples: Deferred<Option<Integer>>) -> Result<i64, ApiError> {
        Ok(samples.checked()?.map_or(DEFAULT_SAMPLES, |Integer(n)| n))
    }
}

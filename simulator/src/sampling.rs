//! SAMPLE (SPEC.md §6.12): a NumericResult channel takes `count` samples of one of its targets
//! at its own rate, from the target's model, and streams them as data frames while it goes,
//! then an end frame. One acquisition per channel at a time; different channels overlap.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use station_protocol::sample::{MAX_SAMPLES, SampleEnd, SamplePart, SampleRequest};
use station_protocol::{ErrorCode, RawFrame, Response, StationError};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;

use crate::profile::ChannelModel;
use crate::shared::Shared;

/// What the station checked before it starts: the rate and the target's unit.
struct Plan {
    rate: f64,
    unit: String,
}

fn plan(shared: &Shared, request: &SampleRequest) -> Result<Plan, StationError> {
    let station = shared.lock_station();
    let spec = station.spec_of(&request.channel)?;
    let ChannelModel::NumericResult { sample_rate, .. } = spec.model else {
        return Err(StationError::new(
            ErrorCode::UnknownChannel,
            format!("{} is not a NumericResult channel", request.channel),
        ));
    };
    if !spec.descriptor.options.contains(&request.target) {
        return Err(StationError::new(
            ErrorCode::BadValue,
            format!(
                "{} cannot sample {}; it samples {}",
                request.channel,
                request.target,
                spec.descriptor.options.join(", ")
            ),
        ));
    }
    if request.count > MAX_SAMPLES {
        return Err(StationError::new(
            ErrorCode::BadValue,
            format!(
                "{} samples asked; an acquisition takes 1 to {MAX_SAMPLES} (0 asks only for the rate)",
                request.count
            ),
        ));
    }
    let unit = station.spec_of(&request.target)?.descriptor.unit.clone();
    Ok(Plan {
        rate: sample_rate,
        unit,
    })
}

fn frame(request_id: u32, response: Response) -> Option<RawFrame> {
    response.to_frame(request_id).ok()
}

/// Runs one acquisition for `request_id`, sending its frames to `stream` (which the writer
/// drains only when no other answer waits). `permit` is the request's window slot, given back
/// with the first frame.
pub(crate) async fn acquire(
    shared: &Shared,
    request_id: u32,
    request: SampleRequest,
    stream: mpsc::Sender<RawFrame>,
    permit: OwnedSemaphorePermit,
) {
    let mut permit = Some(permit);
    let fail = |error: StationError| frame(request_id, Response::Error(error));
    let plan = match plan(shared, &request) {
        Ok(plan) => plan,
        Err(error) => {
            drop(permit);
            if let Some(f) = fail(error) {
                let _ = stream.send(f).await;
            }
            return;
        }
    };
    let started_wall = SystemTime::now();
    if request.count == 0 {
        // Only the rate and unit are asked for: the end frame alone, no acquisition.
        drop(permit);
        let end = end_frame(request_id, &request, &plan, started_wall);
        if let Some(f) = end {
            let _ = stream.send(f).await;
        }
        return;
    }
    let Some(_busy) = shared.acquiring.claim(&request.channel) else {
        drop(permit);
        let busy = StationError::new(
            ErrorCode::Busy,
            format!(
                "{} is already acquiring; one acquisition per channel at a time",
                request.channel
            ),
        );
        if let Some(f) = fail(busy) {
            let _ = stream.send(f).await;
        }
        return;
    };
    let started = Instant::now();
    let count = request.count as usize;
    let per_frame = request.samples_per_frame();
    let period = 1.0 / plan.rate;
    let mut index = 0usize;
    while index < count {
        let end = (index + per_frame).min(count);
        // The last sample of this frame is taken at `end - 1` periods; the frame goes once it is.
        let ready = started + Duration::from_secs_f64((end - 1) as f64 * period);
        tokio::time::sleep_until(ready).await;
        let samples: Result<Vec<f64>, StationError> = {
            let mut station = shared.lock_station();
            (index..end)
                .map(|i| {
                    let at = started + Duration::from_secs_f64(i as f64 * period);
                    station.sample(&request.target, at)
                })
                .collect()
        };
        let part = match samples {
            Ok(samples) => Response::Sample(SamplePart::Data {
                index: index as u32,
                samples,
            }),
            Err(error) => Response::Error(error),
        };
        let failed = matches!(part, Response::Error(_));
        let Some(f) = frame(request_id, part) else {
            return;
        };
        if stream.send(f).await.is_err() {
            return;
        }
        drop(permit.take());
        if failed {
            return;
        }
        index = end;
    }
    if let Some(f) = end_frame(request_id, &request, &plan, started_wall) {
        let _ = stream.send(f).await;
    }
}

fn end_frame(
    request_id: u32,
    request: &SampleRequest,
    plan: &Plan,
    started: SystemTime,
) -> Option<RawFrame> {
    let started_us = started
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    let end = SampleEnd {
        count: request.count,
        rate: plan.rate,
        started_us,
        unit: plan.unit.clone(),
    };
    frame(request_id, Response::Sample(SamplePart::End(end)))
}

/// Keeps the acquisition task's borrow of the shared state alive.
pub(crate) async fn acquire_owned(
    shared: Arc<Shared>,
    request_id: u32,
    request: SampleRequest,
    stream: mpsc::Sender<RawFrame>,
    permit: OwnedSemaphorePermit,
) {
    acquire(&shared, request_id, request, stream, permit).await;
}

//! SAMPLE (SPEC.md §6.12) against the simulator: the stream of data frames and its end, the
//! refusals, one acquisition per channel, and other answers between the data frames.

mod common;

use std::time::{Duration, Instant};

use common::*;
use station_protocol::{ErrorCode, Request, Response, SamplePart, SampleRequest};

const BASE_NR: &str = "0.1.ESH10000158.NumericResult";
const MON_3V3: &str = "0.1.ESH10000158.MON_3V3";

fn sample(channel: &str, target: &str, count: u32, frame_samples: u16) -> Request {
    Request::Sample(SampleRequest {
        channel: channel.into(),
        target: target.into(),
        count,
        frame_samples,
    })
}

fn refused_with(response: Response, code: ErrorCode) -> String {
    match response {
        Response::Error(error) if error.code == code => error.message,
        other => panic!("expected {code:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn an_acquisition_streams_its_samples_in_order_then_ends_with_the_rate() {
    let sim = start_default().await;
    let mut link = raw_link(&sim).await;
    let started = Instant::now();
    send(&mut link, 5, &sample(BASE_NR, MON_3V3, 1000, 100)).await;
    // A READ sent while the samples stream is answered between the data frames.
    send(
        &mut link,
        6,
        &Request::Read {
            names: vec![MON_3V3.into()],
        },
    )
    .await;
    let mut samples = Vec::new();
    let mut read_answered_before_end = false;
    let end = loop {
        match next_reply(&mut link).await {
            (6, Response::Read(_)) => read_answered_before_end = true,
            (
                5,
                Response::Sample(SamplePart::Data {
                    index,
                    samples: part,
                }),
            ) => {
                assert_eq!(index as usize, samples.len(), "in order");
                assert!(part.len() <= 100, "no more than asked per frame");
                samples.extend(part);
            }
            (5, Response::Sample(SamplePart::End(end))) => break end,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(read_answered_before_end);
    assert_eq!(
        (end.count, end.rate, end.unit.as_str()),
        (1000, 10_000.0, "V")
    );
    assert_eq!(samples.len(), 1000);
    let mean = samples.iter().sum::<f64>() / 1000.0;
    assert!((mean - 3.3).abs() < 0.01, "{mean}");
    assert!(samples.iter().any(|&x| x != samples[0]), "noise shows");
    // 1 000 samples at 10 kHz take 0.1 s of station time.
    assert!(started.elapsed() >= Duration::from_millis(95));
}

#[tokio::test]
async fn refusals_and_the_rate_query() {
    let sim = start_default().await;
    let mut link = raw_link(&sim).await;
    send(
        &mut link,
        1,
        &sample(BASE_NR, "0.4.ESH10000662.VMON1", 10, 0),
    )
    .await;
    let message = refused_with(next_reply(&mut link).await.1, ErrorCode::BadValue);
    assert!(message.contains(MON_3V3), "names the targets: {message}");
    send(&mut link, 2, &sample(MON_3V3, MON_3V3, 10, 0)).await;
    refused_with(next_reply(&mut link).await.1, ErrorCode::UnknownChannel);
    send(&mut link, 3, &sample(BASE_NR, MON_3V3, 100_001, 0)).await;
    refused_with(next_reply(&mut link).await.1, ErrorCode::BadValue);
    send(&mut link, 4, &sample(BASE_NR, MON_3V3, 0, 0)).await;
    match next_reply(&mut link).await {
        (4, Response::Sample(SamplePart::End(end))) => {
            assert_eq!((end.count, end.rate), (0, 10_000.0));
        }
        other => panic!("count 0 is answered by the end frame alone: {other:?}"),
    }
}

#[tokio::test]
async fn one_acquisition_per_channel_at_a_time() {
    let sim = start_default().await;
    let mut link = raw_link(&sim).await;
    send(&mut link, 1, &sample(BASE_NR, MON_3V3, 3000, 10)).await;
    // Its first data frame says it is running; then ask again on the same channel.
    match next_reply(&mut link).await {
        (1, Response::Sample(SamplePart::Data { index: 0, .. })) => {}
        other => panic!("expected the first data frame: {other:?}"),
    }
    send(&mut link, 2, &sample(BASE_NR, MON_3V3, 10, 0)).await;
    loop {
        match next_reply(&mut link).await {
            (2, response) => {
                refused_with(response, ErrorCode::Busy);
                break;
            }
            (1, Response::Sample(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

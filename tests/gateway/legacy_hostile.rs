//! Hostile legacy byte-protocol clients: random bytes, half a frame then silence (the idle
//! timeout), and floods of requests (the window answers BUSY; a client that does not read its
//! replies overflows its bounded output buffer and is dropped) — and the well-behaved client
//! beside them keeps being served throughout.

use crate::common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::*;
use futures::StreamExt;
use rand::{Rng, SeedableRng};

use station_protocol::{ErrorCode, Request, Response, StationCodec};
use station_simulator::StationClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Encoder, FramedRead};

async fn good_client(rig: &Rig) -> StationClient<TcpStream> {
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
    client.set_timeout(Duration::from_secs(3));
    client.hello("good").await.unwrap();
    client
}

async fn still_served(client: &mut StationClient<TcpStream>) {
    let volts: f64 = client
        .read_one(MON_3V3)
        .await
        .expect("the good client was not served")
        .render()
        .parse()
        .unwrap();
    assert!((volts - 3.3).abs() < 0.1, "{volts}");
}

fn frame(request: &Request, id: u32) -> Vec<u8> {
    let mut out = BytesMut::new();
    StationCodec::new()
        .encode(request.to_frame(id).unwrap(), &mut out)
        .unwrap();
    out.to_vec()
}

#[tokio::test]
async fn random_bytes_never_hurt_the_gateway_or_other_clients() {
    let rig = legacy_rig(|_| {}).await;
    let mut good = good_client(&rig).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for round in 0..40 {
        let mut bad = TcpStream::connect(rig.legacy()).await.unwrap();
        let len = rng.gen_range(1..4096);
        let mut noise: Vec<u8> = (0..len).map(|_| rng.r#gen()).collect();
        if round % 2 == 0 {
            // Sync patterns in the noise, so the codec's resync path is walked too.
            for at in (0..noise.len()).step_by(97) {
                noise[at] = 0xA5;
                if at + 1 < noise.len() {
                    noise[at + 1] = 0x5A;
                }
            }
        }
        let _ = bad.write_all(&noise).await;
        if round % 5 == 0 {
            still_served(&mut good).await;
        }
    }
    still_served(&mut good).await;
    assert!(rig.sim.write_log().is_empty(), "noise became a write");
}

#[tokio::test]
async fn half_a_frame_then_silence_is_disconnected_by_the_idle_timeout() {
    let rig = legacy_rig(|c| c.legacy.idle_timeout_ms = 300).await;
    let whole = frame(
        &Request::Read {
            names: vec![MON_3V3.into()],
        },
        5,
    );
    let mut half = TcpStream::connect(rig.legacy()).await.unwrap();
    half.write_all(&whole[..whole.len() / 2]).await.unwrap();
    let took = closed_within(&mut half, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(250), "closed after {took:?}");
    // A client that connects and says nothing at all goes the same way.
    let mut silent = TcpStream::connect(rig.legacy()).await.unwrap();
    closed_within(&mut silent, Duration::from_secs(3)).await;
    // A client that keeps talking is never idle.
    let mut good = good_client(&rig).await;
    for _ in 0..4 {
        still_served(&mut good).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    still_served(&mut good).await;
}

#[tokio::test]
async fn a_flood_past_the_window_gets_busy_and_everything_is_answered() {
    let window = 4;
    let rig = legacy_rig(|c| c.legacy.window = window).await;
    rig.sim.set_processing_time(Duration::from_millis(20));
    let mut good = good_client(&rig).await;
    let mut flood = TcpStream::connect(rig.legacy()).await.unwrap();
    let count = 200u32;
    let mut bytes = Vec::new();
    for id in 1..=count {
        bytes.extend(frame(
            &Request::Read {
                names: vec![MON_3V3.into()],
            },
            id,
        ));
    }
    flood.write_all(&bytes).await.unwrap();
    let mut replies = FramedRead::new(flood, StationCodec::new());
    let (mut busy, mut values) = (0, 0);
    let mut seen = std::collections::HashSet::new();
    while seen.len() < count as usize {
        let reply = tokio::time::timeout(Duration::from_secs(5), replies.next())
            .await
            .expect("a request went unanswered")
            .unwrap()
            .unwrap();
        assert!(seen.insert(reply.request_id), "answered twice");
        match Response::from_frame(&reply).unwrap() {
            Response::Error(error) if error.code == ErrorCode::Busy => busy += 1,
            Response::Read(_) => values += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(busy > 0, "the window was never enforced");
    assert!(values >= window as usize, "{values} values");
    still_served(&mut good).await;
}

#[tokio::test]
async fn a_flooder_that_never_reads_is_dropped_and_others_are_unaffected() {
    let rig = legacy_rig(|c| {
        c.legacy.window = 2;
        c.legacy.output_frames = 8;
    })
    .await;
    let mut good = good_client(&rig).await;
    let mut flood = TcpStream::connect(rig.legacy()).await.unwrap();
    // Each request is small and every BUSY reply carries a message, so the replies outgrow
    // the socket buffers and then the bounded output buffer while we never read.
    let one = frame(
        &Request::Read {
            names: vec![MON_3V3.into()],
        },
        1,
    );
    let started = Instant::now();
    let dropped = loop {
        let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 500).collect();
        match tokio::time::timeout(Duration::from_millis(500), flood.write_all(&batch)).await {
            Ok(Ok(())) => {}
            // Our writes stall (the gateway stopped reading) or fail (it closed): both say
            // the gateway gave up on this client rather than buffer without bound.
            Ok(Err(_)) | Err(_) => break true,
        }
        if started.elapsed() > Duration::from_secs(15) {
            break false;
        }
    };
    assert!(
        dropped,
        "the gateway kept reading a client that never reads"
    );
    still_served(&mut good).await;
    // The flooder's connection is closed by the gateway, not just stalled.
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_secs(1), flood.read(&mut buf)).await
        {
            break;
        }
        assert!(Instant::now() < deadline, "the flooder was never dropped");
    }
    still_served(&mut good).await;
}

//! Changes in doubt: a change the station did not answer in time may still be
//! carried out, so the end of its lease waits for it (at most `station.max_processing_ms`,
//! then the link is reset) before the safe state or the next holder's first change. Against
//! a station that takes 3.5 s over one write while it answers other requests and pings.

use crate::common;

use std::time::{Duration, Instant};

use common::{config_for, start_gateway, until};
use station_gateway::GatewayHandle;
use station_gateway::config::SafeWrite;
use station_gateway::lease::{Access, LeaseView};
use station_gateway::link::LinkError;
use station_protocol::Value;
use station_simulator::SimulatorHandle;
use tokio::sync::broadcast;

const ON1: &str = "0.4.ESH10000662.ON1";
const VSET1: &str = "0.4.ESH10000662.VSET1";
/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(20);
/// How long the station takes over a write that touches VSET1.
const SLOW_WRITE: Duration = Duration::from_millis(3500);
const REQUEST_TIMEOUT_MS: u64 = 1000;

/// The default station, with every request touching VSET1 taking 3.5 s more.
async fn station_slow_over_vset1() -> SimulatorHandle {
    common::station_with_slow_channels(|name| name == VSET1, SLOW_WRITE, |_| {}).await
}

/// The order in which the station applied writes to ON1.
fn on1_writes(sim: &SimulatorHandle) -> Vec<Value> {
    sim.write_log()
        .into_iter()
        .filter(|w| w.channel == ON1)
        .map(|w| w.value)
        .collect()
}

/// The slow write: VSET1 (3.5 s at the station) and `ON1=True`, in one WRITE frame.
fn slow_on() -> Vec<(String, Value)> {
    vec![
        (VSET1.into(), Value::Float(100.0)),
        (ON1.into(), Value::Bool(true)),
    ]
}

/// Waits for the first lease event that `wanted` accepts.
async fn lease_event(
    events: &mut broadcast::Receiver<LeaseView>,
    what: &str,
    wanted: impl Fn(&LeaseView) -> bool,
) -> LeaseView {
    common::within(BOUND, what, async {
        loop {
            match events.recv().await {
                Ok(view) if wanted(&view) => return view,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("lease events closed"),
            }
        }
    })
    .await
}

fn free(view: &LeaseView) -> bool {
    !view.held && view.safe_state.is_none()
}

/// The caller of a change in doubt learns that its outcome is unknown and what the gateway
/// does about it.
fn assert_in_doubt(error: &LinkError) {
    assert!(matches!(error, LinkError::WriteTimeout { .. }), "{error}");
    let message = error.to_string();
    for words in [
        "may or may not have been applied",
        "the station may still apply it",
        "holds back what would follow it",
        "the next lease when it was made without one",
    ] {
        assert!(message.contains(words), "{message}");
    }
}

/// Takes the free lease for `owner` for `ttl`; its id.
async fn take(gateway: &GatewayHandle, owner: &str, ttl: Duration) -> String {
    gateway
        .gateway
        .lease
        .acquire(owner.into(), ttl, None, Duration::ZERO)
        .await
        .unwrap()
        .lease_id
}

/// Sends the slow write ([`slow_on`]), admitted under `lease_id` (`None`: nobody holds the
/// lease): it ends in doubt. Its error, and when it was sent.
async fn slow_write_in_doubt(
    gateway: &GatewayHandle,
    lease_id: Option<&str>,
) -> (LinkError, Instant) {
    let guard = gateway
        .gateway
        .lease
        .admit(Access::Change, lease_id)
        .unwrap()
        .guard;
    let sent = Instant::now();
    let error = gateway
        .link()
        .write(slow_on(), guard)
        .await
        .expect_err("the station takes 3.5 s, the request timeout is 1 s");
    assert_in_doubt(&error);
    (error, sent)
}

/// `ON1=False` through the link, admitted under `lease_id`: the station confirms it.
async fn switch_on1_off(gateway: &GatewayHandle, lease_id: &str) {
    let guard = gateway
        .gateway
        .lease
        .admit(Access::Change, Some(lease_id))
        .unwrap()
        .guard;
    gateway
        .link()
        .write(vec![(ON1.into(), Value::Bool(false))], guard)
        .await
        .unwrap()
        .remove(0)
        .unwrap();
}

/// Scenario (a): the holder's `ON1=True` gets 504, the lease runs out, and the safe state
/// `ON1=False` is the last write to ON1: the lease's end waited for the change in doubt.
#[tokio::test]
async fn a_change_in_doubt_when_the_lease_runs_out_lands_before_the_safe_state() {
    let sim = station_slow_over_vset1().await;
    let gateway = start_gateway(config_for(&sim, |config| {
        config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
    }))
    .await;
    let mut events = gateway.gateway.lease_events.subscribe();
    let held = take(&gateway, "TAT station 3", Duration::from_millis(1500)).await;
    let (_, sent) = slow_write_in_doubt(&gateway, Some(&held)).await;
    lease_event(&mut events, "free after the lease ran out", free).await;
    let freed = sent.elapsed();
    until(BOUND, "both writes to ON1 applied", || {
        on1_writes(&sim).len() == 2
    })
    .await;
    assert_eq!(
        on1_writes(&sim),
        [Value::Bool(true), Value::Bool(false)],
        "the ended lease's change in doubt landed after the safe state"
    );
    assert!(
        freed >= SLOW_WRITE,
        "the safe state was done {freed:?} after the write, before the station answered it"
    );
    gateway.stop().await;
}

/// Scenario (b): the holder releases while its `ON1=True` is in doubt; the next holder's
/// `ON1=False` is not overtaken by it.
#[tokio::test]
async fn a_change_in_doubt_when_the_lease_is_released_lands_before_the_next_holders_first_change() {
    let sim = station_slow_over_vset1().await;
    let gateway = start_gateway(config_for(&sim, |config| {
        config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
    }))
    .await;
    let a = take(&gateway, "TAT station 3", Duration::from_secs(30)).await;
    slow_write_in_doubt(&gateway, Some(&a)).await;
    gateway.gateway.lease.release(&a).await.unwrap();
    let b = take(&gateway, "TAT station 4", Duration::from_secs(30)).await;
    switch_on1_off(&gateway, &b).await;
    until(BOUND, "both writes to ON1 applied", || {
        on1_writes(&sim).len() == 2
    })
    .await;
    assert_eq!(
        on1_writes(&sim),
        [Value::Bool(true), Value::Bool(false)],
        "the released lease's change in doubt overrode the next holder's"
    );
    gateway.stop().await;
}

/// Scenario (c): a change made while nobody held the lease is in doubt when someone takes
/// it. The grant waits for it (it is counted under no fence, and the new holder gets its id
/// only once it has left the station), so it never lands under the new holder's lease.
#[tokio::test]
async fn a_lease_less_change_in_doubt_lands_before_the_next_lease_is_granted() {
    let sim = station_slow_over_vset1().await;
    let gateway = start_gateway(config_for(&sim, |config| {
        config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
    }))
    .await;
    let (_, sent) = slow_write_in_doubt(&gateway, None).await;
    let b = take(&gateway, "TAT station 4", Duration::from_secs(30)).await;
    let granted = sent.elapsed();
    let applied = sim
        .write_log()
        .into_iter()
        .find(|w| w.channel == ON1)
        .map(|w| w.at.into_std() - sent)
        .expect("the lease-less change was applied before the grant");
    assert!(
        applied <= granted,
        "granted {granted:?} after the write, before the station applied it ({applied:?})"
    );
    switch_on1_off(&gateway, &b).await;
    assert_eq!(
        on1_writes(&sim),
        [Value::Bool(true), Value::Bool(false)],
        "the lease-less change in doubt overrode the new holder's"
    );
    gateway.stop().await;
}

/// Past `station.max_processing_ms` the lease's end stops waiting: the link is reset, the
/// station abandons the write of the closed connection (SPEC.md §4), and the safe state goes
/// out on the next connection. The ended lease's `ON1=True` never lands.
#[tokio::test]
async fn a_change_still_in_doubt_past_the_longest_processing_is_cut_off_by_a_link_reset() {
    let sim = station_slow_over_vset1().await;
    let max_processing_ms = 2000;
    let gateway = start_gateway(config_for(&sim, |config| {
        config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
        config.station.max_processing_ms = Some(max_processing_ms);
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
    }))
    .await;
    let generation = gateway.link().info().generation;
    let mut events = gateway.gateway.lease_events.subscribe();
    let held = take(&gateway, "TAT station 3", Duration::from_millis(1500)).await;
    let (error, sent) = slow_write_in_doubt(&gateway, Some(&held)).await;
    assert!(
        error.to_string().contains("2000 ms after it was sent"),
        "{error}"
    );
    lease_event(&mut events, "free after the lease ran out", free).await;
    let freed = sent.elapsed();
    until(
        BOUND,
        "the station abandoned the closed connection's write",
        || sim.requests_abandoned() == 1,
    )
    .await;
    assert!(
        gateway.link().info().generation > generation,
        "the link was not reset"
    );
    assert_eq!(
        on1_writes(&sim),
        [Value::Bool(false)],
        "the ended lease's change in doubt landed"
    );
    let safe_state_at = sim
        .write_log()
        .into_iter()
        .find(|w| w.channel == ON1)
        .map(|w| w.at.into_std() - sent)
        .expect("the safe state");
    assert!(
        safe_state_at >= Duration::from_millis(max_processing_ms) && safe_state_at < SLOW_WRITE,
        "the safe state came {safe_state_at:?} after the write: it should wait the longest processing, not the station"
    );
    // Done once read back right twice, the second time the longest processing later.
    assert!(
        freed >= safe_state_at + Duration::from_millis(max_processing_ms),
        "free {freed:?} after the write, the safe state at {safe_state_at:?}: the second read back did not wait"
    );
    gateway.stop().await;
}

//! The safe state read back: once the station has confirmed the safe
//! state's writes, the gateway reads those channels back from the hardware, and again after
//! `station.max_processing_ms`; a late change that overrode the safe state is caught there,
//! applied again, logged, counted in `/metrics` and published on the `lease` event. Against a
//! faulty station that ignores SPEC.md §4 (it carries out a closed connection's requests), so
//! even the link reset cannot keep an ended lease's change from landing after the safe state.

use crate::common;

use std::time::{Duration, Instant};

use common::{ON1, VSET1, config_for, rig_on, until};
use station_gateway::config::SafeWrite;
use station_gateway::lease::{Access, LeaseView};
use station_protocol::Value;
use station_simulator::SimulatorHandle;
use tokio::sync::broadcast;

/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(20);
/// How long the station takes over a write that touches VSET1.
const SLOW_WRITE: Duration = Duration::from_millis(3500);
const REQUEST_TIMEOUT_MS: u64 = 1000;
const MAX_PROCESSING_MS: u64 = 2000;

/// The order in which the station applied writes to ON1.
fn on1_writes(sim: &SimulatorHandle) -> Vec<Value> {
    sim.write_log()
        .into_iter()
        .filter(|w| w.channel == ON1)
        .map(|w| w.value)
        .collect()
}

/// Every lease event until the first that `last` accepts (that one included).
async fn lease_events_until(
    events: &mut broadcast::Receiver<LeaseView>,
    what: &str,
    last: impl Fn(&LeaseView) -> bool,
) -> Vec<LeaseView> {
    common::within(BOUND, what, async {
        let mut seen = Vec::new();
        loop {
            match events.recv().await {
                Ok(view) => {
                    let done = last(&view);
                    seen.push(view);
                    if done {
                        return seen;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("lease events closed"),
            }
        }
    })
    .await
}

fn free(view: &LeaseView) -> bool {
    !view.held && view.safe_state.is_none()
}

/// The counter of safe states a late change overrode, from `/metrics`.
fn overridden_total(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|line| line.starts_with("station_gateway_lease_safe_state_overridden_total "))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
}

/// The holder's `VSET1`+`ON1=True` takes 3.5 s at the station; the lease runs out at 1.5 s, its
/// end waits for the change in doubt until `max_processing_ms` (2 s) and resets the link; the
/// safe state `ON1=False` goes out on the next connection. The faulty station applies the
/// ended lease's `ON1=True` anyway at 3.5 s: the second read back finds it, applies the safe
/// state again, and only then is the lease free.
#[tokio::test]
async fn a_late_change_of_an_ended_lease_that_overrides_the_safe_state_is_read_back_and_corrected()
{
    let sim = common::station_with_slow_channels(|name| name == VSET1, SLOW_WRITE, |_| {}).await;
    sim.set_ignores_close(true);
    let config = config_for(&sim, |config| {
        config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
        config.station.max_processing_ms = Some(MAX_PROCESSING_MS);
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
    });
    let rig = rig_on(sim, config, false).await;
    let (sim, gateway) = (&rig.sim, &rig.gateway);
    let lease = gateway.gateway.lease.clone();
    let mut events = gateway.gateway.lease_events.subscribe();
    let held = lease
        .acquire(
            "TAT station 3".into(),
            Duration::from_millis(1500),
            None,
            Duration::ZERO,
        )
        .await
        .unwrap();
    let guard = lease
        .admit(Access::Change, Some(&held.lease_id))
        .unwrap()
        .guard;
    let sent = Instant::now();
    let slow_on = vec![
        (VSET1.into(), Value::Float(100.0)),
        (ON1.into(), Value::Bool(true)),
    ];
    gateway
        .link()
        .write(slow_on, guard)
        .await
        .expect_err("the station takes 3.5 s, the request timeout is 1 s");
    let seen = lease_events_until(&mut events, "free after the safe state", free).await;
    let freed = sent.elapsed();
    assert_eq!(
        on1_writes(sim),
        [Value::Bool(false), Value::Bool(true), Value::Bool(false)],
        "the safe state, the ended lease's late change over it, the safe state again"
    );
    let late = sim
        .write_log()
        .into_iter()
        .filter(|w| w.channel == ON1)
        .nth(1)
        .expect("the late change");
    assert!(
        late.at.into_std() < sent + freed,
        "the lease was free before the late change landed"
    );
    let overridden = seen
        .iter()
        .filter_map(|view| view.safe_state.as_ref())
        .find(|safe| safe.overridden > 0)
        .unwrap_or_else(|| panic!("no lease event told of the override: {seen:?}"));
    let why = overridden.last_error.as_deref().unwrap_or_default();
    assert!(
        why.contains("a late change overrode the safe state") && why.contains(ON1),
        "{why}"
    );
    let (status, metrics) = rig.get_text("/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(overridden_total(&metrics), Some(1), "{metrics}");
    let read = gateway.link().read(vec![ON1.into()]).await.unwrap();
    assert_eq!(read[0].as_ref().unwrap(), &Value::Bool(false));
    until(BOUND, "nothing more written", || on1_writes(sim).len() == 3).await;
    eprintln!(
        "measured: the lease free (safe state read back right) {} ms after the write, the late change at {} ms",
        freed.as_millis(),
        (late.at.into_std() - sent).as_millis()
    );
    rig.gateway.stop().await;
}

/// With nothing in doubt the safe state is read back right at once (the `lease` event says it
/// waits for its second read back) and again `max_processing_ms` later; only then is the lease
/// free. Measured: from the lease's deadline to each step.
#[tokio::test]
async fn a_safe_state_read_back_right_twice_frees_the_lease_the_longest_processing_after_its_writes()
 {
    let sim = common::default_simulator().await;
    let config = config_for(&sim, |config| {
        config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
        config.station.max_processing_ms = Some(MAX_PROCESSING_MS);
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
    });
    let rig = rig_on(sim, config, false).await;
    let lease = rig.gateway.gateway.lease.clone();
    let mut events = rig.gateway.gateway.lease_events.subscribe();
    let ttl = Duration::from_millis(1000);
    let asked = Instant::now();
    lease
        .acquire("TAT station 3".into(), ttl, None, Duration::ZERO)
        .await
        .unwrap();
    let deadline = asked + ttl;
    let seen = lease_events_until(&mut events, "free after the safe state", free).await;
    let freed = Instant::now();
    let read_back_once = seen
        .iter()
        .filter_map(|view| view.safe_state.as_ref())
        .find(|safe| safe.step == station_gateway::lease::SafeStateStepView::SecondReadBack)
        .unwrap_or_else(|| panic!("no event of the first read back: {seen:?}"));
    assert_eq!(read_back_once.overridden, 0);
    let writes: Vec<_> = rig
        .sim
        .write_log()
        .into_iter()
        .filter(|w| w.channel == ON1)
        .collect();
    assert_eq!(writes.len(), 1, "written once: {writes:?}");
    let written = writes[0].at.into_std();
    assert!(
        freed >= written + Duration::from_millis(MAX_PROCESSING_MS),
        "free {:?} after the safe state's write: the second read back did not wait",
        freed - written
    );
    eprintln!(
        "measured: safe state written {} ms after the lease's deadline; free (read back right twice) {} ms after it ({} ms after the write; max_processing_ms {MAX_PROCESSING_MS})",
        (written.saturating_duration_since(deadline)).as_millis(),
        (freed - deadline).as_millis(),
        (freed - written).as_millis()
    );
    rig.gateway.stop().await;
}

//! A confirmed write feeds the value cache through a read-back: one READ of
//! the channels written, the station's value and the age of that READ; channels whose read
//! consumes data are never read back; a refused item is not read back either.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::json;

const VSET3: &str = "0.4.ESH10000662.VSET3";
const RAMP3: &str = "0.4.ESH10000662.RAMP3";
const UART01: &str = "0.ESH10000023.UART01";
const MON_3V3: &str = "0.1.ESH10000158.MON_3V3";

#[tokio::test]
async fn a_confirmed_write_is_read_back_once_and_serves_cached_reads() {
    let rig = rig(|_| {}).await;
    let (status, body) = rig
        .post(
            "resources/values/set",
            json!({ "Resources": { VSET3: "12", RAMP3: "30" } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Normally in before the answer (it is waited for, briefly); on a loaded machine a moment
    // later.
    let cache = rig.gateway.link().cache().clone();
    until(
        Duration::from_secs(5),
        "both read back into the cache",
        || cache.get(VSET3).is_some() && cache.get(RAMP3).is_some(),
    )
    .await;
    assert_eq!((rig.sim.reads_of(VSET3), rig.sim.reads_of(RAMP3)), (1, 1));
    // Served from the cache, the station's own value, with the read-back's age.
    let (status, body) = rig
        .post(
            "resources/values/get",
            json!({ "Names": [VSET3, RAMP3], "MaxAgeMs": 60000 }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["resources"][VSET3]
            .as_str()
            .map(|v| v.parse::<f64>().unwrap()),
        Some(12.0)
    );
    assert!(body["ageMs"][VSET3].as_f64().unwrap() < 5000.0, "{body}");
    assert_eq!((rig.sim.reads_of(VSET3), rig.sim.reads_of(RAMP3)), (1, 1));
    rig.gateway.stop().await;
}

#[tokio::test]
async fn a_consuming_channel_or_a_refused_item_is_never_read_back() {
    let rig = rig(|_| {}).await;
    let (status, body) = rig.write(UART01, "*IDN?\n").await;
    assert_eq!(status, 200, "{body}");
    // MON_3V3 is read only: the write refuses it before anything is sent.
    let (status, _) = rig.write(MON_3V3, "1").await;
    assert_eq!(status, 400);
    // A refused item of a list is not read back; the applied one is. (A value out of range
    // is refused by the gateway before anything is sent; the station refuses RAMP3 here
    // because it no longer has it, which the gateway cannot know beforehand.)
    assert!(rig.sim.remove_channel(RAMP3));
    let (status, body) = rig
        .post(
            "resources/values/set",
            json!({ "Resources": { VSET3: "5", RAMP3: "30" } }),
        )
        .await;
    assert_ne!(status, 200, "{body}");
    until(
        Duration::from_secs(5),
        "the applied item's read-back",
        || rig.sim.reads_of(VSET3) == 1,
    )
    .await;
    assert_eq!(
        rig.sim.reads_of(UART01),
        0,
        "a consuming channel was read back"
    );
    assert_eq!(rig.sim.reads_of(RAMP3), 0, "a refused item was read back");
    assert_eq!(rig.sim.reads_of(MON_3V3), 0);
    rig.gateway.stop().await;
}

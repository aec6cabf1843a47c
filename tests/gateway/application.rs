//! `api/application/reset` and `api/application/log` against the simulator: the RESET through
//! the link under the lease (423 for a non-holder, nothing sent), the station back with
//! generation + 1 and a `configuration` event, 501 from a station that cannot reset.

use crate::common;

use std::time::Duration;

use anyhow::Result;
use common::sse::Sse;
use common::*;
use reqwest::Method;
use serde_json::json;
use station_simulator::{Profile, Simulator};

#[tokio::test]
async fn reset_restarts_the_station_and_the_link_comes_back_with_a_configuration_event()
-> Result<()> {
    let rig = rig(|_| {}).await;
    let generation = rig.gateway.link().info().generation;
    let (mut sse, _hello) = Sse::open_hello(&rig).await?;
    let (status, answer) = rig.post("application/reset", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rig.sim.resets(), 1);
    rig.reconnected_after(generation).await;
    let change = sse
        .next_named("configuration", Duration::from_secs(10))
        .await?;
    assert_eq!(
        change.data["generation"],
        generation + 1,
        "{:?}",
        change.data
    );
    assert_eq!(change.data["changeType"], "Changed");
    // The station is back in its power-on state and answers.
    let (status, value) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{value}");
    Ok(())
}

#[tokio::test]
async fn reset_needs_the_lease_while_another_holds_it() -> Result<()> {
    let rig = rig(|_| {}).await;
    let lease = rig.take_lease("holder").await;
    let (status, answer) = rig.post("application/reset", json!({})).await;
    assert_eq!(status, 423, "{answer}");
    assert!(
        answer["error"].as_str().unwrap_or("").contains("holder"),
        "{answer}"
    );
    assert_eq!(rig.sim.resets(), 0, "a refused reset reached the station");
    // The holder's reset goes through.
    let response = rig
        .http
        .post(rig.url("application/reset"))
        .header("X-Lease-Id", &lease)
        .json(&json!({}))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    assert_eq!(rig.sim.resets(), 1);
    Ok(())
}

#[tokio::test]
async fn a_station_that_cannot_reset_gets_501_and_keeps_its_link() -> Result<()> {
    let text = station_simulator::profile::DEFAULT_PROFILE_TOML.replacen(
        "[station]\n",
        "[station]\nreset = false\n",
        1,
    );
    let profile = Profile::from_toml_str(&text, "no-reset.toml")?;
    let sim = Simulator::start(profile, "127.0.0.1:0".parse()?).await?;
    let config = config_for(&sim, |_| {});
    let rig = rig_on(sim, config, false).await;
    let generation = rig.gateway.link().info().generation;
    let (status, answer) = rig.send(Method::POST, "application/reset", None).await;
    assert_eq!(status, 501, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap_or("")
            .contains("cannot restart its application"),
        "{answer}"
    );
    let info = rig.gateway.link().info();
    assert!(info.connected && info.generation == generation);
    Ok(())
}

#[tokio::test]
async fn the_log_answers_a_list_and_refuses_a_bad_tail() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (status, lines) = rig.get("application/log?tail=5").await;
    assert_eq!(status, 200, "{lines}");
    assert!(lines.as_array().is_some_and(|l| l.len() <= 5), "{lines}");
    let (status, answer) = rig.get("application/log?tail=many").await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap_or("").contains("tail"));
    Ok(())
}

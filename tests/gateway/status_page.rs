//! The status page in a real headless Chromium, driven over the DevTools protocol
//! (`common/devtools.rs`): trends that fill in real time while HV1 ramps, the set point on its
//! monitor's plot, the last configuration and the recent changes (a screenshot is kept under
//! `target/test-artifacts/status-page.png` for a person to look at); and its `EventSource`
//! cut by the test and by a gateway restart, after which it shows "reconnecting" with its
//! values stale, then "resumed" or "gap: …, values refreshed", never an old value as live.
//!
//! Real time, not `--virtual-time-budget`: virtual time stands still while the event stream
//! is open, which would put every sample of a trend at the same instant.

use crate::common;

use std::time::Duration;

use base64::Engine as _;
use common::cut_proxy::CuttingProxy;
use common::devtools::Browser;
use common::*;
use serde_json::{Value as Json, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_plots_trends_and_recent_changes_in_headless_chromium() {
    let rig = rig(|c| {
        c.status_page.interval_ms = 200;
        // For the safe stop at the end: its second read back waits this long.
        c.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
        c.station.max_processing_ms = Some(30_000);
        // The value history records VMON1 before the page opens: its trend starts filled.
        c.history.channels = vec![VMON1.into()];
        c.history.interval_ms = 50;
    })
    .await;
    let mut browser = Browser::launch("trends").await;

    // HV1 ramps up under a lease (50 V/s) while the page watches; someone else is refused.
    let lease = rig.take_lease("bench 3 ramp test").await;
    for (name, value) in [(VSET1, "400"), (ON1, "True")] {
        let answer = rig
            .http
            .post(rig.url("resources/value/set"))
            .header("X-Lease-Id", &lease)
            .json(&json!({ "Name": name, "Value": value }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
    let (status, _) = rig.write(VSET1, "2000").await;
    assert_eq!(status, 423);

    let session = browser.new_page(1400, 1100).await;
    let devtools = &mut browser.devtools;
    let recorded = format!(
        "{}/v1/history?channel={VMON1}&from=-1m&fn=raw",
        rig.gateway.base_url()
    );
    within(Duration::from_secs(10), "VMON1 in the history", async {
        loop {
            let answer: Json = rig
                .http
                .get(&recorded)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if answer["points"].as_array().is_some_and(|p| p.len() >= 3) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    devtools
        .call(
            Some(&session),
            "Page.navigate",
            json!({ "url": format!("{}/", rig.gateway.base_url()) }),
        )
        .await;
    // The trend of VMON1 fills as values arrive (every 200 ms): wait for 40 of them.
    let samples = format!(
        "Number(document.querySelector('polyline[data-channel=\"{VMON1}\"]')?.dataset.samples || 0)"
    );
    within(
        Duration::from_secs(60),
        "40 samples of VMON1 on its plot",
        async {
            loop {
                let n = devtools.evaluate(&session, &samples).await;
                if n.as_u64().unwrap_or(0) >= 40 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        },
    )
    .await;
    let dom = devtools
        .evaluate(&session, "document.documentElement.outerHTML")
        .await
        .as_str()
        .unwrap()
        .to_owned();
    let shot = devtools
        .call(
            Some(&session),
            "Page.captureScreenshot",
            json!({ "format": "png" }),
        )
        .await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    // A safe stop: the safe state is written and read back right once; the page shows the
    // lease ending with its safe state waiting for the second read back.
    let stopped = rig
        .http
        .post(format!("{}/v1/safe-stop", rig.gateway.base_url()))
        .json(&json!({ "Reason": "status page test" }))
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.status(), 200);
    let shown = "document.getElementById('lease-state').textContent + ' | ' + \
                 document.getElementById('lease-safe-state').textContent";
    within(
        Duration::from_secs(10),
        "the safe state's read back on the status page",
        async {
            loop {
                let text = devtools.evaluate(&session, shown).await;
                let text = text.as_str().unwrap_or_default();
                if text.contains("read back right") {
                    assert!(
                        text.starts_with("safe state | after bench 3 ramp test's lease"),
                        "{text}"
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;
    browser.close().await;
    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let path = artifacts.join("status-page.png");
    std::fs::write(&path, &png).unwrap();
    println!("status page screenshot: {}", path.display());
    assert!(
        png.len() > 10_000,
        "a blank screenshot? {} bytes",
        png.len()
    );

    // The trend was filled from the history when the page opened.
    let from_history = plot_attribute(&dom, VMON1, "data-from-history");
    let state: String = dom
        .split("id=\"trend-state\"")
        .nth(1)
        .unwrap_or("")
        .chars()
        .take(120)
        .collect();
    assert!(
        from_history >= 1,
        "VMON1's trend took {from_history} points from the history: {state}"
    );
    // VMON1's plot carries VSET1 too, both with samples; VMON1 rose on the way to 400 V.
    let plot = dom
        .split("<div class=\"plot\"")
        .skip(1)
        .find(|card| card.contains(&format!("data-channel=\"{VMON1}\"")))
        .unwrap_or_else(|| panic!("no plot of {VMON1}:\n{dom}"));
    for series in [VSET1, VMON1] {
        assert!(
            plot.split("<polyline")
                .skip(1)
                .any(|l| l.contains(&format!("data-channel=\"{series}\""))),
            "no line of {series} on VMON1's plot:\n{plot}"
        );
    }
    assert!(
        dom.contains(&format!("data-channel=\"{MON_3V3}\"")),
        "{dom}"
    );
    assert!(dom.contains("id=\"last-config\">none<"), "{dom}");
    assert!(
        dom.contains("id=\"safe-stop\""),
        "no safe-stop button: {dom}"
    );
    // The recent changes: the holder's writes applied, with owner and fence; the refusal.
    let changes = dom
        .split("id=\"changes\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no changes table:\n{dom}"));
    assert!(changes.contains("bench 3 ramp test #1"), "{changes}");
    assert!(changes.contains("class=\"badge applied\""), "{changes}");
    assert!(changes.contains("class=\"badge refused\""), "{changes}");
    assert!(changes.contains("lease taken"), "{changes}");
    assert!(!dom.contains(&lease), "the lease id is on the page");
    // The safe stop ended the lease: nothing left to release.
}

/// A number attribute of the trend line of `channel` in the page's HTML.
fn plot_attribute(dom: &str, channel: &str, attribute: &str) -> u64 {
    dom.split("<polyline")
        .skip(1)
        .map(|line| line.split('>').next().unwrap_or(""))
        .find(|line| line.contains(&format!("data-channel=\"{channel}\"")))
        .and_then(|line| line.split(&format!("{attribute}=\"")).nth(1))
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The status page's `EventSource`, cut by the test (every connection closed, new ones refused
/// for a while) and then by a gateway restart: while broken the page says "reconnecting" and
/// shows no value as live; the browser reconnects by itself with `Last-Event-ID`, and the page
/// then says "resumed" (the lease taken meanwhile shown, its event replayed) or, after the
/// restart, "gap: gateway restarted, values refreshed" with live values again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_resumes_after_a_cut_and_a_restart_never_showing_old_values_as_live() {
    let rig = rig(|c| c.status_page.interval_ms = 200).await;
    let proxy = CuttingProxy::start(rig.gateway.http_addr).await;
    let mut browser = Browser::launch("resume").await;
    let session = browser.new_page(1280, 900).await;
    browser
        .navigate(&session, &format!("http://{}/", proxy.addr))
        .await;
    let badge = "document.getElementById('values-state').textContent";
    let cells = "[...document.querySelectorAll('#values-table td.value')].map(c => c.dataset.live + ' ' + c.className)";
    let live_value = format!(
        "document.querySelector('tr[data-channel=\"{MON_3V3}\"] td.value')?.dataset.live === 'true'"
    );
    let wait = Duration::from_secs(20);
    browser
        .until(&session, wait, "live values", &live_value, |v| {
            v == &json!(true)
        })
        .await;
    assert_eq!(browser.devtools.evaluate(&session, badge).await, "live");

    // A blip: every connection cut, the network down for a while.
    proxy.set_refusing(true);
    proxy.cut();
    browser
        .until(&session, wait, "reconnecting", badge, |v| {
            v == "reconnecting"
        })
        .await;
    let shown = browser.devtools.evaluate(&session, cells).await;
    let shown: Vec<&str> = shown
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_str)
        .collect();
    assert!(!shown.is_empty());
    assert!(
        shown
            .iter()
            .all(|cell| cell.starts_with("false") && cell.contains("stale")),
        "a value shown as live while the stream is broken: {shown:?}"
    );
    // Meanwhile the lease is taken: the page learns it from the event replayed on resume.
    let lease = rig.take_lease("bench 3 blip").await;
    assert!(!lease.is_empty());
    proxy.set_refusing(false);
    browser
        .until(&session, wait, "resumed", badge, |v| v == "resumed")
        .await;
    browser
        .until(
            &session,
            wait,
            "the lease taken while away",
            "document.getElementById('lease-owner').textContent",
            |v| v == "bench 3 blip",
        )
        .await;
    browser
        .until(&session, wait, "live values again", &live_value, |v| {
            v == &json!(true)
        })
        .await;

    // The gateway restarts, on a port of its own; the proxy keeps the page's address.
    let Rig { sim, gateway, .. } = rig;
    gateway.stop().await;
    browser
        .until(&session, wait, "reconnecting after the stop", badge, |v| {
            v.as_str()
                .is_some_and(|text| text.starts_with("reconnecting"))
        })
        .await;
    let stale = browser.devtools.evaluate(&session, &live_value).await;
    assert_eq!(
        stale,
        json!(false),
        "a value shown as live with the gateway gone"
    );
    let config = config_for(&sim, |c| c.status_page.interval_ms = 200);
    let rig = rig_on(sim, config, false).await;
    proxy.set_target(rig.gateway.http_addr);
    browser
        .until(&session, wait, "the gap after the restart", badge, |v| {
            v == "gap: gateway restarted, values refreshed"
        })
        .await;
    browser
        .until(
            &session,
            wait,
            "live values after the restart",
            &live_value,
            |v| v == &json!(true),
        )
        .await;
    let states = browser
        .devtools
        .evaluate(&session, "window.streamStates.join(' | ')")
        .await;
    let states = states.as_str().unwrap_or_default().to_owned();
    println!("the status page's stream went through: {states}");
    browser.close().await;
    // Every state it went through, in order.
    let expected = [
        "live",
        "reconnecting",
        "resumed",
        "reconnecting",
        "gap: gateway restarted",
        "gap: gateway restarted, values refreshed",
    ];
    let mut rest = states.as_str();
    for state in expected {
        let at = rest
            .find(state)
            .unwrap_or_else(|| panic!("{state:?} not in order in: {states}"));
        rest = &rest[at + state.len()..];
    }
    drop(rig);
}

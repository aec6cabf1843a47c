//! Several stations in one gateway: each at `/stations/{id}/...`, each with its own
//! lease, link and queue, so that two holders work at once, a change never reaches the other
//! station and a station that stops answering delays nobody else; and the lab's own view
//! (`/v1/stations`, `/metrics`, `/readyz`, the audit trail naming stations).

use std::time::Duration;

use serde_json::{Value as Json, json};
use station_gateway::config::lab::{Lab, StationSetup};
use station_gateway::{Config, GatewayHandle, LabListeners};
use station_simulator::SimulatorHandle;
use tokio::net::TcpListener;

use station_gateway::link::LinkStats;

use crate::common::{VSET1, config_for, default_simulator, until, within};

/// Two simulated stations, `st1` and `st2`, in one gateway.
struct Lab2 {
    sims: [SimulatorHandle; 2],
    gateway: GatewayHandle,
    http: reqwest::Client,
}

/// Station `id`'s config pointing at `sim`.
fn station(id: &str, sim: &SimulatorHandle, tweak: &impl Fn(&mut Config)) -> StationSetup {
    let config = config_for(sim, |config| {
        config.station.id = id.into();
        config.config_files.dir = std::env::temp_dir()
            .join(format!("lab-test-{}", std::process::id()))
            .join(id);
        tweak(config);
    });
    StationSetup {
        id: id.into(),
        config,
    }
}

async fn lab2(default_station: Option<&str>, tweak: impl Fn(&mut Config)) -> Lab2 {
    lab2_with(default_station, false, tweak).await
}

/// Two stations; with `legacy`, each with a legacy listener of its own.
async fn lab2_with(
    default_station: Option<&str>,
    legacy: bool,
    tweak: impl Fn(&mut Config),
) -> Lab2 {
    let sims = [default_simulator().await, default_simulator().await];
    let lab = Lab {
        stations: vec![
            station("st1", &sims[0], &tweak),
            station("st2", &sims[1], &tweak),
        ],
        default_station: default_station.map(str::to_owned),
    };
    let listeners = LabListeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        legacy: match legacy {
            true => vec![
                Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
                Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            ],
            false => vec![None, None],
        },
    };
    let gateway = station_gateway::start_lab(listeners, lab).await.unwrap();
    within(
        Duration::from_secs(10),
        "both stations to connect",
        gateway.connected(),
    )
    .await;
    Lab2 {
        sims,
        gateway,
        http: reqwest::Client::new(),
    }
}

impl Lab2 {
    /// A request to `path` (from the gateway's root) with an optional lease id and body.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        lease: Option<&str>,
        body: Option<Json>,
    ) -> (u16, Json) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.gateway.base_url()));
        if let Some(lease) = lease {
            request = request.header("X-Lease-Id", lease);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Json::Null))
    }

    async fn text(&self, path: &str) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.gateway.base_url()))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// Station `id`'s audit log, as its client reads it (`GET api/audit/log`): its own lines
    /// of the lab's one trail.
    async fn audit_lines_of(&self, id: &str) -> Vec<String> {
        let (status, lines) = self
            .call(
                reqwest::Method::GET,
                &format!("/stations/{id}/api/audit/log?tail=0"),
                None,
                None,
            )
            .await;
        assert_eq!(status, 200, "{lines}");
        lines
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Json::as_str)
            .map(str::to_owned)
            .collect()
    }

    /// Takes station `id`'s control lease for `owner`; its lease id.
    async fn take(&self, id: &str, owner: &str) -> String {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                &format!("/stations/{id}/api/lease"),
                None,
                Some(json!({ "Owner": owner, "TtlMs": 30000 })),
            )
            .await;
        assert_eq!(status, 200, "{owner} taking {id}'s lease: {body}");
        body["leaseId"].as_str().unwrap().to_owned()
    }

    async fn set(&self, id: &str, lease: &str, value: &str) -> (u16, Json) {
        self.call(
            reqwest::Method::POST,
            &format!("/stations/{id}/api/resources/value/set"),
            Some(lease),
            Some(json!({ "Name": VSET1, "Value": value })),
        )
        .await
    }
}

#[tokio::test]
async fn two_holders_at_once_and_a_change_never_reaches_the_other_station() {
    let lab = lab2(None, |_| {}).await;
    let first = lab.take("st1", "first bench").await;
    let second = lab.take("st2", "second bench").await;
    assert_eq!(lab.set("st1", &first, "100").await.0, 200);
    assert_eq!(lab.set("st2", &second, "200").await.0, 200);
    // Each lease opens its own station only: st1's lease id at st2 is a stranger's.
    let (status, body) = lab.set("st2", &first, "300").await;
    assert_eq!(status, 423, "st1's holder writing to st2: {body}");
    let writes = |sim: &SimulatorHandle| -> Vec<String> {
        sim.write_log()
            .iter()
            .map(|write| format!("{}={}", write.channel, write.value))
            .collect()
    };
    assert_eq!(writes(&lab.sims[0]), [format!("{VSET1}=100")]);
    assert_eq!(writes(&lab.sims[1]), [format!("{VSET1}=200")]);
    // Each station's lease is its own, named after its id.
    let (_, lease) = lab
        .call(reqwest::Method::GET, "/stations/st1/api/lease", None, None)
        .await;
    assert_eq!(lease["owner"], "first bench", "{lease}");
    assert_eq!(
        lab.gateway.station("st2").unwrap().lease.name(),
        "control:station:st2"
    );
}

#[tokio::test]
async fn a_station_that_stops_answering_delays_no_other_station() {
    // st1's requests wait long for an answer: while one hangs, st2 must be served.
    let lab = lab2(None, |config| config.station.request_timeout_ms = 20_000).await;
    let holder = lab.take("st2", "bench two").await;
    lab.sims[0].set_stall(true);
    let forced = json!({ "Names": [VSET1], "MaxAgeMs": 0 });
    let st1 = lab.gateway.station("st1").unwrap().clone();
    let frames = || LinkStats::get(&st1.link.stats().frames_sent);
    let before = frames();
    let hung = lab.call(
        reqwest::Method::POST,
        "/stations/st1/api/resources/values/get",
        None,
        Some(forced.clone()),
    );
    tokio::pin!(hung);
    // st1's forced read is sent, and waits for the stalled station.
    tokio::select! {
        answer = &mut hung => panic!("st1 answered while stalled: {answer:?}"),
        () = until(Duration::from_secs(10), "st1's read to be sent", || frames() > before) => {}
    }
    // While it hangs, st2's forced reads, a renewal and a change all complete: nothing of st2
    // waits behind st1's queue. (Were they one queue, these would wait out st1's 20 s.)
    let st2 = async {
        for _ in 0..5 {
            let (status, body) = lab
                .call(
                    reqwest::Method::POST,
                    "/stations/st2/api/resources/values/get",
                    Some(&holder),
                    Some(forced.clone()),
                )
                .await;
            assert_eq!(status, 200, "st2's forced read: {body}");
        }
        let (status, body) = lab
            .call(
                reqwest::Method::PUT,
                &format!("/stations/st2/api/lease/{holder}"),
                None,
                Some(json!({})),
            )
            .await;
        assert_eq!(status, 200, "st2's renewal: {body}");
        assert_eq!(lab.set("st2", &holder, "42").await.0, 200);
    };
    tokio::select! {
        answer = &mut hung => panic!("st1's read ended before st2 was served: {answer:?}"),
        () = st2 => {}
    }
    lab.sims[0].set_stall(false);
}

#[tokio::test]
async fn the_lab_answers_for_every_station_and_a_path_without_one_names_them() {
    let audit_dir = std::env::temp_dir().join(format!("lab-unrouted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&audit_dir);
    let lab = lab2(None, |config| {
        config.audit.dir = audit_dir.display().to_string();
    })
    .await;
    // No default station: a station's path without one is refused, naming the stations.
    let (status, body) = lab
        .call(reqwest::Method::GET, "/api/lease", None, None)
        .await;
    assert_eq!(status, 404, "{body}");
    let message = body["message"].as_str().unwrap_or_default().to_owned() + &body.to_string();
    assert!(message.contains("st1, st2"), "{body}");
    let (status, body) = lab
        .call(reqwest::Method::GET, "/stations/st9/api/lease", None, None)
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body.to_string().contains("no station \\\"st9\\\""),
        "{body}"
    );
    // Both are in the lab's audit trail, as every api/ request is, naming no station; no
    // station's log holds them.
    // Once these are answered, what came before is written (and each read has its line).
    lab.audit_lines_of("st1").await;
    lab.audit_lines_of("st2").await;
    let trail = std::fs::read_to_string(audit_dir.join("audit.log")).unwrap();
    for unrouted in [" GET /api/lease 404 ", " GET /stations/st9/api/lease 404 "] {
        let line = trail.lines().find(|line| line.contains(unrouted));
        assert!(
            line.is_some_and(|line| !line.contains("station=")),
            "{unrouted}: {trail}"
        );
        for id in ["st1", "st2"] {
            // Read from the files: the station's own lines (its earlier reads of it) only.
            let lines = lab.audit_lines_of(id).await;
            assert!(
                !lines.is_empty()
                    && lines
                        .iter()
                        .all(|line| line.ends_with(&format!(" station={id}"))),
                "{id}: {lines:?}"
            );
            assert!(
                !lines.iter().any(|line| line.contains(unrouted)),
                "{id}: {lines:?}"
            );
        }
    }

    let holder = lab.take("st2", "bench two").await;
    let (status, stations) = lab
        .call(reqwest::Method::GET, "/v1/stations", None, None)
        .await;
    assert_eq!(status, 200, "{stations}");
    let ids: Vec<_> = stations
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].clone())
        .collect();
    assert_eq!(ids, [json!("st1"), json!("st2")]);
    assert_eq!(stations[0]["connected"], true, "{stations}");
    assert_eq!(stations[0]["holder"], Json::Null, "{stations}");
    assert_eq!(stations[1]["holder"], "bench two", "{stations}");
    assert!(
        stations[1]["expiresInMs"].as_u64().unwrap() > 0,
        "{stations}"
    );
    assert_eq!(stations[1]["path"], "/stations/st2", "{stations}");

    let (status, metrics) = lab.text("/metrics").await;
    assert_eq!(status, 200);
    for id in ["st1", "st2"] {
        assert!(
            metrics.contains(&format!(
                "station_gateway_link_connected{{station=\"{id}\"}} 1"
            )),
            "{id} missing from {metrics}"
        );
    }
    let (status, ready) = lab.call(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["stations"], json!(["st1", "st2"]));
    // One station down: /readyz says which.
    lab.sims[0].shutdown();
    let st1 = lab.gateway.station("st1").unwrap().clone();
    let mut info = st1.link.watch_info();
    within(
        Duration::from_secs(10),
        "st1's link to go down",
        info.wait_for(|i| !i.connected),
    )
    .await
    .unwrap();
    let (status, ready) = lab.call(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(status, 503, "{ready}");
    let text = ready.to_string();
    assert!(
        text.contains("st1:") && text.contains("ready: st2"),
        "{ready}"
    );
    let _ = holder;
    // The API's description is the lab's too (a station's, public).
    let (status, document) = lab.text("/openapi.json").await;
    assert_eq!(status, 200);
    assert!(document.contains("\"openapi\""), "{document}");
    // The lab's page lists the stations from v1/stations.
    let (status, page) = lab.text("/").await;
    assert_eq!(status, 200);
    assert!(page.contains("v1/stations"), "{page}");
}

#[tokio::test]
async fn a_default_station_serves_the_paths_without_a_station() {
    let lab = lab2(Some("st2"), |_| {}).await;
    let holder = lab.take("st2", "bench").await;
    let (status, lease) = lab
        .call(reqwest::Method::GET, "/api/lease", None, None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(lease["owner"], "bench", "{lease}");
    assert_eq!(lab.set("st2", &holder, "7").await.0, 200);
    assert_eq!(lab.sims[1].write_log().len(), 1);
    assert!(lab.sims[0].write_log().is_empty());
}

#[tokio::test]
async fn one_station_also_answers_under_its_station_path() {
    let rig = crate::common::rig(|config| config.station.id = "bench-7".into()).await;
    let base = rig.gateway.base_url();
    let direct = rig
        .http
        .get(format!("{base}/api/lease"))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 200);
    let prefixed = rig
        .http
        .get(format!("{base}/stations/bench-7/api/lease"))
        .send()
        .await
        .unwrap();
    assert_eq!(prefixed.status(), 200);
    // With one station the operations are its own, as before.
    let (status, metrics) = rig.get_text("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("station_gateway_link_connected 1"),
        "{metrics}"
    );
}

/// A station's `api/audit/log` is that station's: its own lines only, each the documented
/// six fields first (`timestamp ip method path status duration`, the .NET client's
/// `docs/api/audit.md`) with the path as its client sent it, `/stations/{id}` included, and
/// the extra fields (a change's, then `station=`) after them.
#[tokio::test]
async fn each_stations_audit_log_holds_its_own_lines_with_the_path_as_sent() {
    let lab = lab2(Some("st1"), |_| {}).await;
    let first = lab.take("st1", "first bench").await;
    let second = lab.take("st2", "second bench").await;
    assert_eq!(lab.set("st1", &first, "11").await.0, 200);
    assert_eq!(lab.set("st2", &second, "22").await.0, 200);
    // The default station also serves the paths without a station: as they were sent.
    let (status, _) = lab
        .call(reqwest::Method::GET, "/api/lease", None, None)
        .await;
    assert_eq!(status, 200);
    for (id, mine, theirs) in [("st1", "11", "22"), ("st2", "22", "11")] {
        let lines = lab.audit_lines_of(id).await;
        let changes = |value: &str| -> Vec<&String> {
            lines
                .iter()
                .filter(|line| line.contains(&format!("asked={VSET1}={value}")))
                .collect()
        };
        let (own, other) = (changes(mine), changes(theirs));
        assert_eq!(own.len(), 1, "{id}: {lines:?}");
        assert!(
            other.is_empty(),
            "{id} holds another station's change: {lines:?}"
        );
        assert!(
            lines
                .iter()
                .all(|line| line.ends_with(&format!(" station={id}"))),
            "{id}: {lines:?}"
        );
        assert!(
            lines.iter().any(|line| line.contains(" LEASE ")),
            "{id}: {lines:?}"
        );
        // timestamp (`2026-05-29 14:23:01.442`, two words) ip method path status duration,
        // then the change's fields.
        let fields: Vec<&str> = own[0].split(' ').skip(1).collect();
        assert_eq!(fields[1], "127.0.0.1", "{}", own[0]);
        assert_eq!(
            (fields[2], fields[3], fields[4]),
            (
                "POST",
                format!("/stations/{id}/api/resources/value/set").as_str(),
                "200"
            ),
            "{}",
            own[0]
        );
        assert!(fields[5].ends_with("ms"), "{}", own[0]);
        assert!(fields[6].starts_with("caller="), "{}", own[0]);
        // Every request line of it is its own path, as sent.
        for line in lines.iter().filter(|line| !line.contains(" LEASE ")) {
            let path = line.split(' ').nth(4).unwrap();
            let as_sent = path.starts_with(&format!("/stations/{id}/api/"))
                || (id == "st1" && path.starts_with("/api/"));
            assert!(as_sent, "{id}: {line}");
        }
    }
    let st1 = lab.audit_lines_of("st1").await;
    assert!(
        st1.iter().any(|line| line.contains(" GET /api/lease 200 ")),
        "{st1:?}"
    );
}

#[tokio::test]
async fn an_access_rule_naming_a_station_binds_that_station_only() {
    let dir = std::env::temp_dir().join(format!("lab-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        format!(
            r#"
default = "allow"
[channels.vset]
names = ["{VSET1}"]
[[rule]]
name = "st1-vset-is-read-only"
stations = ["st1"]
channels = ["vset"]
deny = ["write"]

[[rule]]
name = "st3-vset-is-read-only"
stations = ["st3"]
channels = ["vset"]
deny = ["write"]
"#
        ),
    )
    .unwrap();
    let path = rules.display().to_string();
    let lab = lab2(None, move |config| config.access.rules = path.clone()).await;
    let first = lab.take("st1", "first bench").await;
    let second = lab.take("st2", "second bench").await;
    let (status, body) = lab.set("st1", &first, "5").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.to_string().contains("st1-vset-is-read-only"), "{body}");
    assert_eq!(lab.set("st2", &second, "5").await.0, 200);
    assert!(lab.sims[0].write_log().is_empty());
    assert_eq!(lab.sims[1].write_log().len(), 1);
    // The rule for st3, a station this gateway does not serve, is in force nowhere: each
    // station's view says so.
    let (status, views) = lab
        .call(reqwest::Method::GET, "/v1/stations", None, None)
        .await;
    assert_eq!(status, 200, "{views}");
    for view in views.as_array().unwrap() {
        let rules = &view["accessRules"];
        assert_eq!(rules["version"], 1, "{view}");
        let reported = rules["rulesForOtherStations"].to_string();
        assert!(
            reported.contains("st3-vset-is-read-only") && !reported.contains("st1-vset"),
            "{view}"
        );
    }
}

#[tokio::test]
async fn each_station_has_its_own_legacy_listener_bound_by_its_own_lease() {
    use station_protocol::{ErrorCode, Value};
    use station_simulator::{ClientError, StationClient};
    let lab = lab2_with(None, true, |_| {}).await;
    let addrs: Vec<_> = lab
        .gateway
        .legacy_addrs
        .iter()
        .map(|a| a.unwrap())
        .collect();
    let _held = lab.take("st1", "sequence A").await;
    let mut one = StationClient::connect(addrs[0]).await.unwrap();
    one.hello("test").await.unwrap();
    match one.write_one(VSET1, Value::Float(7.0)).await {
        Err(ClientError::Station(error)) => {
            assert_eq!(error.code, ErrorCode::Locked);
            assert!(error.message.contains("sequence A"), "{}", error.message);
        }
        other => panic!("expected LOCKED at st1's legacy port, got {other:?}"),
    }
    // st2's lease is free: its legacy client changes st2, and only st2.
    let mut two = StationClient::connect(addrs[1]).await.unwrap();
    two.hello("test").await.unwrap();
    two.write_one(VSET1, Value::Float(8.0)).await.unwrap();
    assert!(lab.sims[0].write_log().is_empty());
    assert_eq!(lab.sims[1].write_log().len(), 1);
}

/// A standby of two stations whose owners are two gateways: when one owner dies, the standby
/// takes over its station alone, after the lock-delay, and the other station stays with its
/// living owner.
#[tokio::test]
async fn a_standby_of_several_stations_takes_over_only_the_station_its_owner_lost() {
    use crate::common::backends::Backend;
    use station_gateway::config::HaMode;
    let backend = Backend::named("sqlite").await;
    let token = station_gateway::lease::LeaseToken::random();
    let suffix = &token.as_str()[..10];
    let sims = [default_simulator().await, default_simulator().await];
    let ids = [format!("a-{suffix}"), format!("b-{suffix}")];
    let timing = |config: &mut Config| {
        config.lease.backend = backend.url.clone();
        config.lease.link_owner_ttl_ms = 2_000;
        config.lease.link_owner_lock_delay_ms = Some(2_500);
        config.station.request_timeout_ms = 1_000;
        config.station.max_processing_ms = Some(1_000);
    };
    let setups: Vec<StationSetup> = ids
        .iter()
        .zip(&sims)
        .map(|(id, sim)| station(id, sim, &timing))
        .collect();
    // Each station's owner: a gateway of its own.
    let owner_a = crate::common::start_gateway(setups[0].config.clone()).await;
    let owner_b = crate::common::start_gateway(setups[1].config.clone()).await;
    let mut standing = setups.clone();
    for setup in &mut standing {
        setup.config.ha.mode = HaMode::Standby;
    }
    let standby = station_gateway::start_lab(
        LabListeners {
            http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: vec![None, None],
        },
        Lab {
            stations: standing,
            default_station: None,
        },
    )
    .await
    .expect("a standby of both stations starts while others own them");
    let http = reqwest::Client::new();
    let lease_at = |gateway: &GatewayHandle, path: String| {
        let url = format!("{}{path}", gateway.base_url());
        let http = http.clone();
        async move { http.get(url).send().await.unwrap().status().as_u16() }
    };
    let path = |id: &str| format!("/stations/{id}/api/lease");
    assert_eq!(lease_at(&standby, path(&ids[0])).await, 503);
    assert_eq!(lease_at(&standby, path(&ids[1])).await, 503);

    // Station a's owner dies (nothing released, as after kill -9).
    drop(owner_a);
    within(
        Duration::from_secs(15),
        "the standby to take station a over",
        async {
            while lease_at(&standby, path(&ids[0])).await != 200 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
    // Station b is still its living owner's: the standby keeps standing by for it.
    assert_eq!(lease_at(&standby, path(&ids[1])).await, 503);
    assert_eq!(lease_at(&owner_b, "/api/lease".into()).await, 200);
    let views = http
        .get(format!("{}/v1/stations", standby.base_url()))
        .send()
        .await
        .unwrap()
        .json::<Json>()
        .await
        .unwrap();
    assert_eq!(views[0]["standby"], Json::Null, "{views}");
    assert!(views[1]["standby"].is_string(), "{views}");
    drop(backend);
}

#[tokio::test]
async fn the_lab_stream_tells_every_stations_lease_and_link_naming_the_station() {
    use crate::common::Sse;
    let lab = lab2(None, |_| {}).await;
    let url = format!("{}/v1/stations/events", lab.gateway.base_url());
    let mut stream = Sse::open_url(&lab.http, &url, None).await.unwrap();
    let wait = Duration::from_secs(10);
    let first = stream.next(wait).await.unwrap().expect("a first event");
    assert_eq!(first.name, "stations");
    assert_eq!(first.data[1]["id"], "st2", "{}", first.data);
    lab.take("st2", "bench two").await;
    let lease = stream.next_named("lease", wait).await.unwrap();
    assert_eq!(lease.data["station"], "st2", "{}", lease.data);
    assert_eq!(lease.data["owner"], "bench two", "{}", lease.data);
    lab.sims[0].shutdown();
    let down = stream.next_named("connection", wait).await.unwrap();
    assert_eq!(down.data["station"], "st1", "{}", down.data);
    assert_eq!(down.data["isConnected"], false, "{}", down.data);
    // A station's own stream is still its own.
    let own = Sse::open_at(
        &lab.http,
        &format!("{}/stations/st2", lab.gateway.base_url()),
    )
    .await
    .unwrap();
    drop(own);
}

/// The lab stream's events are numbered once for the lab: a reader that reconnects with the
/// id of the last it saw gets `resumed` and what it missed; an id of the gateway before a
/// restart gets a `gap` saying so and a fresh `stations`.
#[tokio::test]
async fn the_lab_stream_resumes_with_last_event_id_and_says_gap_after_a_restart() {
    use crate::common::Sse;
    let lab = lab2(None, |_| {}).await;
    let url = format!("{}/v1/stations/events", lab.gateway.base_url());
    let wait = Duration::from_secs(10);
    let mut stream = Sse::open_url(&lab.http, &url, None).await.unwrap();
    let first = stream.next(wait).await.unwrap().expect("stations");
    assert_eq!(first.name, "stations");
    lab.take("st2", "bench two").await;
    let taken = stream.next_named("lease", wait).await.unwrap();
    assert!(taken.id > first.id, "{} after {}", taken.id, first.id);
    drop(stream);
    // Missed while away: st1 taken.
    lab.take("st1", "bench one").await;
    let seen = taken.id.to_string();
    let mut resumed = Sse::open_with_headers(&lab.http, &url, &[("Last-Event-ID", &seen)])
        .await
        .unwrap();
    let marker = resumed.next(wait).await.unwrap().expect("resumed");
    assert_eq!(marker.name, "resumed", "{marker:?}");
    assert_eq!(marker.data["lastEventId"], seen.as_str());
    let missed = resumed.next_named("lease", wait).await.unwrap();
    assert_eq!(missed.id, taken.id + 1);
    assert_eq!(missed.data["station"], "st1", "{}", missed.data);
    assert_eq!(missed.data["owner"], "bench one", "{}", missed.data);
    // An id of another epoch (the gateway before a restart).
    let epoch = taken.id / 1_000_000_000_000_000;
    let other: u64 = if epoch == 1000 { 1001 } else { 1000 };
    let old = (other * 1_000_000_000_000_000 + 42).to_string();
    let mut after = Sse::open_with_headers(&lab.http, &url, &[("Last-Event-ID", &old)])
        .await
        .unwrap();
    let gap = after.next(wait).await.unwrap().expect("gap");
    assert_eq!(gap.name, "gap", "{gap:?}");
    assert_eq!(gap.data["reason"], "restart", "{}", gap.data);
    let stations = after.next(wait).await.unwrap().expect("stations");
    assert_eq!(stations.name, "stations");
    assert_eq!(stations.data[0]["holder"], "bench one", "{}", stations.data);
    assert_eq!(
        stations.id, missed.id,
        "it reflects every event up to the last"
    );
}

#[tokio::test]
async fn the_labs_paths_need_a_reader_as_a_stations_do_health_and_readiness_open() {
    use station_gateway::config::{ApiKey, Role};
    const KEY: &str = "lab-reader-key-0123456789";
    let lab = lab2(None, |config| {
        config.access.keys = vec![ApiKey {
            key: KEY.into(),
            role: Role::Read,
            name: "reader".into(),
        }];
    })
    .await;
    for path in ["/v1/stations", "/metrics", "/", "/v1/stations/events"] {
        let url = format!("{}{path}", lab.gateway.base_url());
        let refused = lab.http.get(&url).send().await.unwrap();
        assert_eq!(refused.status(), 401, "{path} without a key");
        let answered = lab
            .http
            .get(&url)
            .header("X-Api-Key", KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(answered.status(), 200, "{path} with a reader's key");
    }
    for path in ["/healthz", "/readyz"] {
        let url = format!("{}{path}", lab.gateway.base_url());
        assert_eq!(
            lab.http.get(&url).send().await.unwrap().status(),
            200,
            "{path}"
        );
    }
    // The lab's own refusals are the gateway's, not its first station's: counted once,
    // unlabelled, and in no station's `access_refused_total`.
    let metrics = lab
        .http
        .get(format!("{}/metrics", lab.gateway.base_url()))
        .header("X-Api-Key", KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for station in ["st1", "st2"] {
        let line = format!(
            "station_gateway_access_refused_total{{station=\"{station}\",status=\"401\"}} 0"
        );
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    let lab_line = "station_gateway_lab_access_refused_total{status=\"401\"} 4";
    assert!(
        metrics.lines().any(|l| l == lab_line),
        "{lab_line} in\n{metrics}"
    );
}

/// Two stations of one gateway whose addresses reach one physical station (here one simulator
/// by 127.0.0.1 and by localhost): only one of them may serve it, the other refuses, naming
/// why, on every lease backend (the promise: one owner of a station's link).
async fn two_stations_at_one_physical_station(backend: &str) {
    let sim = default_simulator().await;
    let port = sim.local_addr().port();
    let at = |id: &str, host: &str| {
        let mut setup = station(id, &sim, &|config: &mut Config| {
            config.lease.backend = backend.to_owned();
        });
        setup.config.station.url = format!("tcp://{host}:{port}");
        setup
    };
    let token = station_gateway::lease::LeaseToken::random();
    let suffix = &token.as_str()[..8];
    let lab = Lab {
        stations: vec![
            at(&format!("one-{suffix}"), "127.0.0.1"),
            at(&format!("two-{suffix}"), "localhost"),
        ],
        default_station: None,
    };
    let gateway = station_gateway::start_lab(
        LabListeners {
            http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: vec![None, None],
        },
        lab,
    )
    .await
    .unwrap();
    let gateways = gateway.stations.gateways().to_vec();
    // One serves; the other's link is refused after its HELLO, naming the station.
    let refused = |index: usize| {
        gateways[index]
            .link
            .info()
            .last_error
            .as_deref()
            .is_some_and(|why| why.contains("ESH"))
    };
    crate::common::until(
        Duration::from_secs(15),
        "one station to serve and the other to be refused",
        || {
            let connected: Vec<bool> = gateways.iter().map(|g| g.link.info().connected).collect();
            (connected[0] && refused(1)) || (connected[1] && refused(0))
        },
    )
    .await;
    let connected: Vec<bool> = gateways.iter().map(|g| g.link.info().connected).collect();
    assert_eq!(
        connected.iter().filter(|c| **c).count(),
        1,
        "both stations serve one physical station: {connected:?}; {:?}",
        gateways
            .iter()
            .map(|g| g.link.info().last_error.clone())
            .collect::<Vec<_>>()
    );
    gateway.stop().await;
}

#[tokio::test]
async fn two_stations_at_one_physical_station_are_refused_in_memory() {
    two_stations_at_one_physical_station("memory").await;
}

#[tokio::test]
async fn two_stations_at_one_physical_station_are_refused_on_sqlite() {
    let backend = crate::common::backends::Backend::named("sqlite").await;
    two_stations_at_one_physical_station(&backend.url).await;
}

/// Each station of several keeps its own link-owner state file beside the configured one
/// (one file, locked by its owner, cannot serve two stations' leases).
#[tokio::test]
async fn each_station_keeps_its_own_link_owner_state_file() {
    let backend = crate::common::backends::Backend::named("sqlite").await;
    let dir = std::env::temp_dir().join(format!(
        "lab-state-{}",
        &station_gateway::lease::LeaseToken::random().as_str()[..10]
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("link-owner.state");
    let url = backend.url.clone();
    let path = state.display().to_string();
    let lab = lab2(None, move |config| {
        config.lease.backend = url.clone();
        config.lease.link_owner_state = path.clone();
    })
    .await;
    for id in ["st1", "st2"] {
        let own = dir.join(format!("link-owner-{id}.state"));
        assert!(own.exists(), "{} missing", own.display());
    }
    assert!(!state.exists(), "the gateway-wide file is no station's");
    lab.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A station of several publishes its own base URL with its link-owner lease: a standby of
/// that station points its clients at `…/stations/{id}`, where the station answers.
#[tokio::test]
async fn a_standby_points_clients_at_the_stations_own_base_url() {
    use station_gateway::config::HaMode;
    let backend = crate::common::backends::Backend::named("sqlite").await;
    let url = backend.url.clone();
    let token = station_gateway::lease::LeaseToken::random();
    let suffix = token.as_str()[..8].to_owned();
    let sims = [default_simulator().await, default_simulator().await];
    let ids = [format!("p-{suffix}"), format!("q-{suffix}")];
    let shared = move |config: &mut Config| config.lease.backend = url.clone();
    let setups: Vec<StationSetup> = ids
        .iter()
        .zip(&sims)
        .map(|(id, sim)| station(id, sim, &shared))
        .collect();
    let owner = station_gateway::start_lab(
        LabListeners {
            http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: vec![None, None],
        },
        Lab {
            stations: setups.clone(),
            default_station: None,
        },
    )
    .await
    .unwrap();
    within(
        Duration::from_secs(10),
        "the owner to connect",
        owner.connected(),
    )
    .await;
    let mut standby_config = setups[1].config.clone();
    standby_config.ha.mode = HaMode::Standby;
    let standby = station_gateway::start(
        station_gateway::Listeners {
            http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: None,
        },
        standby_config,
    )
    .await
    .unwrap();
    let expected = format!("{}/stations/{}", owner.base_url(), ids[1]);
    let http = reqwest::Client::new();
    let mut body = String::new();
    within(
        Duration::from_secs(10),
        "the standby to name the owner",
        async {
            loop {
                let answer = http
                    .get(format!("{}/api/lease", standby.base_url()))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(answer.status(), 503);
                body = answer.text().await.unwrap();
                if body.contains(&expected) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert!(body.contains(&expected), "{body}");
}

/// `POST /v1/safe-stop` of a gateway of several stations safe-stops every one: each holder's
/// lease ends, each station gets its safe state, and each audit line names its station.
#[tokio::test]
async fn the_labs_safe_stop_stops_every_station() {
    use station_gateway::config::SafeWrite;
    use station_protocol::Value;
    const ON1: &str = "0.4.ESH10000662.ON1";
    let lab = lab2(None, |config| {
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
    })
    .await;
    for (id, owner) in [("st1", "bench one"), ("st2", "bench two")] {
        let lease = lab.take(id, owner).await;
        let (status, body) = lab
            .call(
                reqwest::Method::POST,
                &format!("/stations/{id}/api/resources/value/set"),
                Some(&lease),
                Some(json!({ "Name": ON1, "Value": "True" })),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = lab
        .call(
            reqwest::Method::POST,
            "/v1/safe-stop",
            None,
            Some(json!({ "Reason": "fire drill" })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stopped"], true, "{body}");
    for (index, id) in ["st1", "st2"].iter().enumerate() {
        let stop = &body["stations"][index];
        assert_eq!(stop["station"], *id, "{body}");
        assert_eq!(stop["safeState"]["confirmed"], true, "{body}");
        assert!(stop["leaseEnded"]["owner"].is_string(), "{body}");
        let (_, lease) = lab
            .call(
                reqwest::Method::GET,
                &format!("/stations/{id}/api/lease"),
                None,
                None,
            )
            .await;
        assert_eq!(lease["held"], false, "{id}: {lease}");
        let last = lab.sims[index].write_log().last().cloned().unwrap();
        assert_eq!(
            (last.channel.as_str(), last.value),
            (ON1, Value::Bool(false)),
            "{id}"
        );
    }
    for id in ["st1", "st2"] {
        let lines = lab.audit_lines_of(id).await;
        assert!(
            lines.iter().any(|line| {
                line.contains("POST /v1/safe-stop 200 ")
                    && line.ends_with(&format!(" station={id}"))
            }),
            "no safe-stop line of {id}: {lines:?}"
        );
    }
    // Blank reasons are refused, naming the field, and stop nothing.
    let (status, body) = lab
        .call(
            reqwest::Method::POST,
            "/v1/safe-stop",
            None,
            Some(json!({ "Reason": " " })),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("Reason"), "{body}");
}

/// The lab's status page, as a browser shows it: a row for each station with its link and its
/// lease holder, linking to the station's own page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lab_page_lists_every_station_in_headless_chromium() {
    let lab = lab2(None, |_| {}).await;
    lab.take("st2", "bench two").await;
    // `?snapshot`: the page closes its event stream once the stations are shown; with the
    // stream open, Chromium's virtual time would never run out.
    let dom = crate::operations::dump_dom(
        &format!("{}/?snapshot", lab.gateway.base_url()),
        &["--virtual-time-budget=3000"],
    )
    .await;
    let row = |id: &str| -> String {
        dom.split("<tr")
            .find(|row| row.contains(&format!("data-station=\"{id}\"")))
            .unwrap_or_else(|| panic!("no row for {id}:\n{dom}"))
            .to_owned()
    };
    let (one, two) = (row("st1"), row("st2"));
    assert!(one.contains("href=\"/stations/st1/\""), "{one}");
    assert!(
        one.contains(">connected<") && one.contains(">free<"),
        "{one}"
    );
    assert!(two.contains("bench two"), "{two}");
}

/// The lab's event streams count against `events.max_streams`: one past it is refused with
/// 503, and a stream whose reader went makes room again.
#[tokio::test]
async fn the_lab_streams_are_limited_and_a_closed_one_makes_room() {
    use crate::common::Sse;
    let lab = lab2(None, |config| config.events.max_streams = 1).await;
    let url = format!("{}/v1/stations/events", lab.gateway.base_url());
    let first = Sse::open_url(&lab.http, &url, None).await.unwrap();
    let refused = lab.http.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.text().await.unwrap().contains("events.max_streams"));
    drop(first);
    // The reader went: its stream ends when the gateway next writes to it (a ping, every 5 s:
    // the first write after the client's close is taken by the kernel, the second fails), and
    // its task gives its place back.
    let mut again = None;
    within(
        Duration::from_secs(25),
        "room for a new lab stream",
        async {
            loop {
                let response = lab.http.get(&url).send().await.unwrap();
                if response.status() == 200 {
                    again = Some(response);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert!(again.is_some());
}

/// The lab's safe stop with one station hung: every station's outcome in the answer, and a 503
/// naming the station whose safe state is not confirmed, never 200 "safe-stopped every
/// station".
#[tokio::test]
async fn the_labs_safe_stop_with_a_station_hung_is_503_naming_it_with_every_outcome() {
    use station_gateway::config::SafeWrite;
    const ON1: &str = "0.4.ESH10000662.ON1";
    let lab = lab2(None, |config| {
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
        config.station.request_timeout_ms = 300;
        config.station.max_processing_ms = Some(300);
    })
    .await;
    lab.take("st1", "bench one").await;
    lab.take("st2", "bench two").await;
    lab.sims[1].set_stall(true);
    let (status, body) = within(
        Duration::from_secs(20),
        "the lab's safe stop to answer",
        lab.call(
            reqwest::Method::POST,
            "/v1/safe-stop",
            None,
            Some(json!({ "Reason": "rack 2 smoking" })),
        ),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["stopped"], false, "{body}");
    assert_eq!(body["status"], 503, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("NOT safe-stopped: st2") && !message.contains("st1,"),
        "{body}"
    );
    let (one, two) = (&body["stations"][0], &body["stations"][1]);
    assert_eq!(one["station"], "st1", "{body}");
    assert_eq!(one["stopped"], true, "{body}");
    assert_eq!(one["safeState"]["confirmed"], true, "{body}");
    assert!(one.get("status").is_none(), "{body}");
    assert_eq!(two["station"], "st2", "{body}");
    assert_eq!(two["stopped"], false, "{body}");
    assert_eq!(two["status"], 503, "{body}");
    assert_eq!(two["safeState"]["confirmed"], false, "{body}");
    assert_eq!(two["leaseEnded"]["owner"], "bench two", "{body}");
    lab.sims[1].set_stall(false);
}

/// A `--standby` lab gateway owns neither station's link: its `POST /v1/safe-stop` is 503
/// naming the owner for each station, and reaches neither station, instead of 200
/// "safe-stopped every station".
#[tokio::test]
async fn a_standby_labs_safe_stop_is_503_naming_the_owner_and_reaches_no_station() {
    use station_gateway::config::{HaMode, SafeWrite};
    const ON1: &str = "0.4.ESH10000662.ON1";
    let backend = crate::common::backends::Backend::named("sqlite").await;
    let url = backend.url.clone();
    let token = station_gateway::lease::LeaseToken::random();
    let suffix = token.as_str()[..8].to_owned();
    let sims = [default_simulator().await, default_simulator().await];
    let ids = [format!("a-{suffix}"), format!("b-{suffix}")];
    let shared = move |config: &mut Config| {
        config.lease.backend = url.clone();
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
    };
    let setups: Vec<StationSetup> = ids
        .iter()
        .zip(&sims)
        .map(|(id, sim)| station(id, sim, &shared))
        .collect();
    let start = |setups: Vec<StationSetup>| async move {
        station_gateway::start_lab(
            LabListeners {
                http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
                legacy: vec![None, None],
            },
            Lab {
                stations: setups,
                default_station: None,
            },
        )
        .await
        .unwrap()
    };
    let owner = start(setups.clone()).await;
    within(
        Duration::from_secs(10),
        "the owner to connect",
        owner.connected(),
    )
    .await;
    let standby = start(
        setups
            .into_iter()
            .map(|mut setup| {
                setup.config.ha.mode = HaMode::Standby;
                setup
            })
            .collect(),
    )
    .await;
    for sim in &sims {
        sim.clear_write_log();
    }
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{}/v1/safe-stop", standby.base_url()))
        .json(&json!({ "Reason": "pressed on the wrong gateway" }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body: Json = response.json().await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["stopped"], false, "{body}");
    for (index, id) in ids.iter().enumerate() {
        let stop = &body["stations"][index];
        assert_eq!(stop["station"], *id, "{body}");
        assert_eq!(stop["status"], 503, "{body}");
        let error = stop["error"].as_str().unwrap();
        assert!(
            error.contains("standby") && error.contains("another gateway owns the station"),
            "{body}"
        );
    }
    for sim in &sims {
        assert!(sim.write_log().is_empty(), "{:?}", sim.write_log());
    }
    // The owner's stations are as they were: nobody's lease ended, nothing owed.
    for gateway in owner.stations.gateways() {
        assert!(gateway.lease.safe_state_pending().is_none());
    }
    standby.stop().await;
    owner.stop().await;
}

/// Two stations of one gateway reach one physical station; the one standing by on its identity
/// (no `--standby`) owns no link: its safe stop, a change, a lease's release and a legacy write
/// are each refused with 503 (ERROR on the legacy port) naming the station that serves it,
/// and the lab's press answers 503 with that station's refusal beside the other's outcome.
#[tokio::test]
async fn a_station_standing_by_on_its_identity_refuses_every_door_naming_the_one_that_serves() {
    use station_gateway::config::SafeWrite;
    use station_protocol::Value;
    use station_simulator::{ClientError, StationClient};
    const ON1: &str = "0.4.ESH10000662.ON1";
    let sim = default_simulator().await;
    let port = sim.local_addr().port();
    let at = |id: &str, host: &str| {
        let mut setup = station(id, &sim, &|config: &mut Config| {
            config.lease.safe_state = vec![SafeWrite {
                channel: ON1.into(),
                value: "False".into(),
            }];
        });
        setup.config.station.url = format!("tcp://{host}:{port}");
        setup
    };
    let gateway = station_gateway::start_lab(
        LabListeners {
            http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: vec![
                Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
                Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            ],
        },
        Lab {
            stations: vec![at("one", "127.0.0.1"), at("two", "localhost")],
            default_station: None,
        },
    )
    .await
    .unwrap();
    let gateways = gateway.stations.gateways().to_vec();
    crate::common::until(
        Duration::from_secs(15),
        "one station to serve and the other to stand by",
        || {
            gateways.iter().any(|g| g.link.info().connected)
                && gateways.iter().any(|g| {
                    g.link
                        .info()
                        .last_error
                        .as_deref()
                        .is_some_and(|why| why.contains("already serves"))
                })
        },
    )
    .await;
    let serving = usize::from(!gateways[0].link.info().connected);
    let (serves, stands) = (["one", "two"][serving], ["one", "two"][1 - serving]);
    let names_the_server =
        |text: &str| text.contains(&format!("station {serves} of this gateway already serves"));
    let http = reqwest::Client::new();
    let base = gateway.base_url();
    sim.clear_write_log();
    let answer = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        (status, response.json::<Json>().await.unwrap())
    };
    // A lease, which is for changing a station this process does not serve.
    let (status, body) = answer(
        http.post(format!("{base}/stations/{stands}/api/lease"))
            .json(&json!({ "Owner": "bench", "TtlMs": 30000 }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(names_the_server(body["error"].as_str().unwrap()), "{body}");
    // Whatever lease id a client presents (one it took before the station stood by).
    let lease = "0123456789abcdef0123456789abcdef".to_owned();
    // A change under its lease.
    let (status, body) = answer(
        http.post(format!("{base}/stations/{stands}/api/resources/value/set"))
            .header("X-Lease-Id", &lease)
            .json(&json!({ "Name": ON1, "Value": "True" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(names_the_server(body["error"].as_str().unwrap()), "{body}");
    // Its lease's release.
    let (status, body) = answer(
        http.delete(format!("{base}/stations/{stands}/api/lease/{lease}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(names_the_server(body["error"].as_str().unwrap()), "{body}");
    // Its own safe stop.
    let (status, body) = answer(
        http.post(format!("{base}/stations/{stands}/v1/safe-stop"))
            .json(&json!({ "Reason": "drill" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(names_the_server(body["error"].as_str().unwrap()), "{body}");
    // A legacy client's write.
    let legacy = gateway.legacy_addrs[1 - serving].unwrap();
    let mut client = StationClient::connect(legacy).await.unwrap();
    match client.write_one(ON1, Value::Bool(true)).await {
        Err(ClientError::Station(error)) => {
            assert!(names_the_server(&error.message), "{}", error.message)
        }
        other => panic!("a legacy write through a station standing by: {other:?}"),
    }
    // The lab's press: the serving station stopped and confirmed, the other refused.
    let (status, body) = answer(
        http.post(format!("{base}/v1/safe-stop"))
            .json(&json!({ "Reason": "drill" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    let stop = |id: &str| {
        body["stations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|stop| stop["station"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(stop(serves)["safeState"]["confirmed"], true, "{body}");
    assert_eq!(stop(stands)["status"], 503, "{body}");
    assert!(
        names_the_server(stop(stands)["error"].as_str().unwrap()),
        "{body}"
    );
    // Nothing but the serving station's safe state reached the station.
    let log = sim.write_log();
    assert!(
        log.iter()
            .all(|w| w.channel == ON1 && w.value == Value::Bool(false)),
        "{log:?}"
    );
    gateway.stop().await;
}

/// The lab's own paths are doors too: a name the gateway is not known by is 421 on every one
/// (and on each station's), a page of another site cannot press the lab's safe stop (403, in
/// the trail, no station touched), its body must be JSON, and the lab page's own safe-stop
/// button, in headless Chromium, still stops every station.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_labs_paths_refuse_unknown_names_and_other_sites_and_its_page_still_stops_every_station()
 {
    use station_gateway::config::SafeWrite;
    const ON1: &str = "0.4.ESH10000662.ON1";
    let audit_dir = std::env::temp_dir().join(format!(
        "lab-other-sites-{}-{}",
        std::process::id(),
        &station_gateway::lease::LeaseToken::random().as_str()[..8]
    ));
    let lab = lab2(None, |config| {
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
        config.audit.dir = audit_dir.display().to_string();
    })
    .await;
    for sim in &lab.sims {
        sim.clear_write_log();
    }
    let base = lab.gateway.base_url();
    let port = lab.gateway.http_addr.port();
    for path in [
        "/",
        "/v1/stations",
        "/metrics",
        "/readyz",
        "/stations/st1/api/capabilities",
        "/stations/st2/",
    ] {
        let answer = lab
            .http
            .get(format!("{base}{path}"))
            .header("Host", format!("rebind.evil.example:{port}"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 421, "{path}");
    }
    let press = |origin: Option<&str>, content_type: &str, body: &str| {
        let mut request = lab
            .http
            .post(format!("{base}/v1/safe-stop"))
            .header("Content-Type", content_type)
            .body(body.to_owned());
        if let Some(origin) = origin {
            request = request.header("Origin", origin);
        }
        request.send()
    };
    let refused = press(
        Some("http://evil.example"),
        "text/plain",
        r#"{"Reason": "a page of another site"}"#,
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), 403);
    let why: Json = refused.json().await.unwrap();
    assert!(
        why["error"]
            .as_str()
            .unwrap()
            .contains("http.allowed_origins"),
        "{why}"
    );
    let not_json = press(None, "text/plain", r#"{"Reason": "no type"}"#)
        .await
        .unwrap();
    assert_eq!(not_json.status(), 415);
    for sim in &lab.sims {
        assert!(sim.write_log().is_empty(), "a station was stopped");
    }
    // The lab's own refusal is in the lab's trail (no station's log holds it); once a
    // station's read is answered, what came before is written.
    lab.audit_lines_of("st1").await;
    let trail = std::fs::read_to_string(audit_dir.join("audit.log")).unwrap();
    assert!(
        trail
            .lines()
            .any(|l| l.contains("POST /v1/safe-stop 403 ") && l.contains("outcome=refused")),
        "{trail}"
    );

    // The lab page's own button, from the gateway's own origin.
    let holders = [
        lab.take("st1", "bench one").await,
        lab.take("st2", "bench two").await,
    ];
    let mut headless = crate::common::devtools::Browser::launch("lab-other-sites").await;
    let page = headless.new_page(1200, 900).await;
    headless
        .devtools
        .call(
            Some(&page),
            "Page.navigate",
            json!({ "url": format!("{base}/") }),
        )
        .await;
    let pressed = within(Duration::from_secs(20), "the lab page's safe stop", async {
        loop {
            let state = headless
                .devtools
                .evaluate(
                    &page,
                    "document.readyState === 'complete' && document.getElementById('safe-stop') \
                     ? (window.pressed || (window.prompt = () => 'lab page test', \
                        window.confirm = () => true, \
                        document.getElementById('safe-stop').click(), window.pressed = 'yes'), \
                        document.getElementById('safe-stop-result').textContent) : ''",
                )
                .await;
            let text = state.as_str().unwrap_or_default().to_owned();
            if text.starts_with("safe-stopped") {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(pressed.contains("every station"), "{pressed}");
    for (index, id) in ["st1", "st2"].iter().enumerate() {
        let (_, lease) = lab
            .call(
                reqwest::Method::GET,
                &format!("/stations/{id}/api/lease"),
                None,
                None,
            )
            .await;
        assert_eq!(lease["held"], false, "{}: {lease}", holders[index]);
        let writes = lab.sims[index].write_log();
        assert!(writes.iter().any(|w| w.channel == ON1), "{id}: {writes:?}");
    }
    headless.close().await;
}

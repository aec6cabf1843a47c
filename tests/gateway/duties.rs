//! What a station is owed belongs to the station, not to a connection, a lease or a gateway's
//! name: a change at the station whose outcome is unknown stays in doubt until it is answered
//! or `station.max_processing_ms` after it was sent, whatever happens to the link, and the next
//! holder waits for it; a change made without a lease and left in doubt delays the next grant
//! as a holder's does; and a gateway that takes a station over under another name honours the
//! safe state and the lock-delay the station is owed. Each against a station that carries a
//! request out after its connection closed: a serial line (a pty here: a station on a serial
//! line never sees a close, SPEC.md §4) and a TCP station that ignores the close.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::backends::Backend;
use common::{config_for, start_gateway, station_with_slow_channels, until, within};
use station_gateway::config::{HaMode, SafeWrite};
use station_gateway::lease::{Access, LeaseToken};
use station_gateway::link::LinkError;
use station_gateway::{Config, GatewayHandle};
use station_protocol::Value;
use station_simulator::SimulatorHandle;

pub(super) const ON1: &str = "0.4.ESH10000662.ON1";
pub(super) const VSET1: &str = "0.4.ESH10000662.VSET1";
/// Every wait in this file ends within this, or the test fails saying what it waited for.
pub(super) const BOUND: Duration = Duration::from_secs(20);
const REQUEST_TIMEOUT_MS: u64 = 1000;
const MAX_PROCESSING_MS: u64 = 1500;

/// How the station is reached: TCP (the station ignores a closed connection) or a serial line.
#[derive(Clone, Copy, Debug)]
pub(super) enum Line {
    Tcp,
    Serial,
}

/// A station whose writes touching VSET1 take `slow`, which carries a request out after its
/// connection closed, and the device path a serial gateway opens (a symlink to the pty, so
/// that the test can unplug and replug it).
pub(super) struct Station {
    pub(super) sim: SimulatorHandle,
    line: Line,
    device: Option<(PathBuf, PathBuf)>,
}

impl Station {
    pub(super) async fn start(line: Line, slow: Duration) -> Station {
        let sim = station_with_slow_channels(|name| name == VSET1, slow, |_| {}).await;
        sim.set_ignores_close(true);
        let device = match line {
            Line::Tcp => None,
            Line::Serial => {
                let pty = sim.attach_pty(None).expect("a pseudo-terminal");
                let dir = std::env::temp_dir().join(format!(
                    "gateway-duties-{}",
                    &LeaseToken::random().as_str()[..12]
                ));
                std::fs::create_dir_all(&dir).unwrap();
                let link = dir.join("ttyStation");
                point(&link, &pty);
                Some((link, pty))
            }
        };
        Station { sim, line, device }
    }

    /// The gateway's config for this station, after `tweak`.
    pub(super) fn config(&self, tweak: impl FnOnce(&mut Config)) -> Config {
        config_for(&self.sim, |config| {
            if let Some((link, _)) = &self.device {
                config.station.url = format!("serial://{}?baud=115200", link.display());
            }
            config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
            config.station.max_processing_ms = Some(MAX_PROCESSING_MS);
            config.station.reconnect_max_ms = 200;
            tweak(config);
        })
    }

    /// The link breaks while a request is at the station: on TCP the station drops the
    /// connection, on a serial line the adapter is pulled and plugged in again.
    fn break_link(&mut self) {
        match self.line {
            Line::Tcp => self.sim.drop_connections(),
            Line::Serial => {
                let (link, pty) = self.device.as_mut().expect("a serial station");
                assert!(self.sim.detach_pty(pty));
                let replugged = self.sim.attach_pty(None).expect("a pseudo-terminal");
                point(link, &replugged);
                *pty = replugged;
            }
        }
    }

    /// The values written to ON1, in the order the station applied them.
    pub(super) fn on1_writes(&self) -> Vec<Value> {
        self.sim
            .write_log()
            .into_iter()
            .filter(|w| w.channel == ON1)
            .map(|w| w.value)
            .collect()
    }
}

/// A symlink that names "the serial device", so the test can swap the pty behind it.
fn point(link: &Path, target: &Path) {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).unwrap();
}

/// Takes the lease for `owner`, waiting in line up to `BOUND` when it is not free; its id.
async fn take(gateway: &GatewayHandle, owner: &str) -> String {
    gateway
        .gateway
        .lease
        .acquire(owner.into(), Duration::from_secs(60), None, BOUND)
        .await
        .unwrap_or_else(|why| panic!("{owner} did not get the lease: {why}"))
        .lease_id
}

/// `VSET1=100` and `ON1=True` in one WRITE frame, admitted under `lease_id` (`None`: without a
/// lease): the station takes its time over it.
async fn slow_on(gateway: &GatewayHandle, lease_id: Option<&str>) -> Result<(), LinkError> {
    let guard = gateway
        .gateway
        .lease
        .admit(Access::Change, lease_id)
        .unwrap()
        .guard;
    let items = vec![
        (VSET1.into(), Value::Float(100.0)),
        (ON1.into(), Value::Bool(true)),
    ];
    gateway.link().write(items, guard).await.map(drop)
}

/// `ON1=False` under `lease_id`, once the link is up: the station confirms it.
async fn switch_on1_off(gateway: &GatewayHandle, lease_id: &str) {
    common::link_state(gateway, "the link to be up", |info| info.connected).await;
    let guard = gateway
        .gateway
        .lease
        .admit(Access::Change, Some(lease_id))
        .unwrap()
        .guard;
    let results = gateway
        .link()
        .write(vec![(ON1.into(), Value::Bool(false))], guard)
        .await
        .expect("the next holder's write");
    assert!(results[0].is_ok(), "{results:?}");
}

/// How a lease whose change is at the station when the link breaks ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// Its holder releases it; the next holder switches ON1 off.
    Released,
    /// It runs out, and the safe state switches ON1 off.
    RanOut,
}

/// The link breaks while A's `ON1=True` is at the station (A is told the write's outcome is
/// unknown). Whether A then releases (and B takes the lease and switches ON1 off) or A's lease
/// runs out (and the safe state switches it off), A's late `True` lands before that `False`,
/// never after it: the doubt outlived the connection it was sent on.
async fn a_change_at_the_station_when_the_link_breaks_lands_before_the_next_change(
    line: Line,
    end: End,
) {
    // Released: A's `True` lands before the next holder could write; run out: after the lease's
    // deadline (1 s from the acquire), within the longest processing.
    let slow = match end {
        End::Released => Duration::from_millis(800),
        End::RanOut => Duration::from_millis(1100),
    };
    let mut station = Station::start(line, slow).await;
    let gateway = start_gateway(station.config(|config| {
        if let End::RanOut = end {
            config.lease.safe_state = vec![SafeWrite {
                channel: ON1.into(),
                value: "False".into(),
            }];
        }
    }))
    .await;
    let ttl = match end {
        End::Released => Duration::from_secs(60),
        End::RanOut => Duration::from_millis(1000),
    };
    let a = gateway
        .gateway
        .lease
        .acquire("TAT station 3".into(), ttl, None, Duration::ZERO)
        .await
        .unwrap()
        .lease_id;
    let writing = {
        let (gateway, a) = (gateway.gateway.clone(), a.clone());
        let link = gateway.link.clone();
        tokio::spawn(async move {
            let guard = gateway.lease.admit(Access::Change, Some(&a)).unwrap().guard;
            let items = vec![
                (VSET1.into(), Value::Float(100.0)),
                (ON1.into(), Value::Bool(true)),
            ];
            link.write(items, guard).await.map(drop)
        })
    };
    until(BOUND, "A's write to be at the station", || {
        station.sim.requests_in_progress() > 0
    })
    .await;
    station.break_link();
    let outcome = within(BOUND, "A's write to be answered", writing)
        .await
        .unwrap();
    assert!(
        outcome
            .as_ref()
            .is_err_and(|e| e.to_string().contains("may or may not have been applied")),
        "A is told its write's outcome is unknown: {outcome:?}"
    );
    match end {
        End::Released => {
            gateway.gateway.lease.release(&a).await.unwrap();
            let b = take(&gateway, "TAT station 4").await;
            switch_on1_off(&gateway, &b).await;
        }
        End::RanOut => {
            let mut lease = gateway.gateway.lease_events.subscribe();
            within(BOUND, "A's lease to end and be free again", async {
                while !lease
                    .recv()
                    .await
                    .is_ok_and(|v| !v.held && v.safe_state.is_none())
                {}
            })
            .await;
        }
    }
    until(BOUND, "both writes to ON1 to land", || {
        station.on1_writes().len() >= 2
    })
    .await;
    until(BOUND, "the station to finish every request", || {
        station.sim.requests_in_progress() == 0
    })
    .await;
    assert_eq!(
        station.on1_writes(),
        [Value::Bool(true), Value::Bool(false)],
        "A's change, at the station when the link broke, landed after the change that ended it ({line:?}, {end:?})"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_released_holders_change_at_the_station_when_a_tcp_link_breaks_lands_before_the_next_holders()
 {
    a_change_at_the_station_when_the_link_breaks_lands_before_the_next_change(
        Line::Tcp,
        End::Released,
    )
    .await;
}

#[tokio::test]
async fn a_released_holders_change_at_the_station_when_a_serial_link_breaks_lands_before_the_next_holders()
 {
    a_change_at_the_station_when_the_link_breaks_lands_before_the_next_change(
        Line::Serial,
        End::Released,
    )
    .await;
}

#[tokio::test]
async fn a_change_at_the_station_when_a_tcp_link_breaks_lands_before_the_safe_state_of_its_lease_run_out()
 {
    a_change_at_the_station_when_the_link_breaks_lands_before_the_next_change(
        Line::Tcp,
        End::RanOut,
    )
    .await;
}

#[tokio::test]
async fn a_change_at_the_station_when_a_serial_link_breaks_lands_before_the_safe_state_of_its_lease_run_out()
 {
    a_change_at_the_station_when_the_link_breaks_lands_before_the_next_change(
        Line::Serial,
        End::RanOut,
    )
    .await;
}

/// A change made without a lease outlives `station.max_processing_ms` unanswered (this station
/// breaks its contract and takes longer still). B asks for the lease right after: it is granted
/// only after the lock-delay that follows the doubt, as after a holder's change in doubt, so
/// the late `ON1=True` lands before B's `ON1=False`.
async fn a_lease_less_change_left_in_doubt_delays_the_next_grant(line: Line) {
    const LOCK_DELAY_MS: u64 = 1500;
    // Past the longest processing, within it and the lock-delay.
    let slow = Duration::from_millis(MAX_PROCESSING_MS + 600);
    let station = Station::start(line, slow).await;
    let gateway = start_gateway(station.config(|config| {
        config.lease.lock_delay_ms = Some(LOCK_DELAY_MS);
    }))
    .await;
    let sent = Instant::now();
    let outcome = slow_on(&gateway, None).await;
    assert!(
        matches!(outcome, Err(LinkError::WriteTimeout { .. })),
        "{outcome:?}"
    );
    let b = take(&gateway, "TAT station 4").await;
    let granted = sent.elapsed();
    switch_on1_off(&gateway, &b).await;
    until(BOUND, "both writes to ON1 to land", || {
        station.on1_writes().len() >= 2
    })
    .await;
    assert_eq!(
        station.on1_writes(),
        [Value::Bool(true), Value::Bool(false)],
        "the lease-less change left in doubt landed inside B's lease, granted {granted:?} after it was sent ({line:?})"
    );
    let earliest = Duration::from_millis(MAX_PROCESSING_MS + LOCK_DELAY_MS);
    assert!(
        granted >= earliest,
        "B was granted {granted:?} after the change, before its doubt lapsed and the lock-delay ran ({earliest:?})"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_lease_less_change_left_in_doubt_delays_the_next_grant_on_tcp() {
    a_lease_less_change_left_in_doubt_delays_the_next_grant(Line::Tcp).await;
}

#[tokio::test]
async fn a_lease_less_change_left_in_doubt_delays_the_next_grant_on_a_serial_line() {
    a_lease_less_change_left_in_doubt_delays_the_next_grant(Line::Serial).await;
}

/// The link-owner lease's timing in the takeover tests (short; the lock-delay rule, margin +
/// lock-delay ≥ the longest processing, holds).
fn short_takeover(config: &mut Config) {
    config.lease.link_owner_ttl_ms = 2000;
    config.lease.link_owner_lock_delay_ms = Some(1500);
}

/// The owner of a station is killed while A holds the lease and ON1 is on. A standby whose
/// `station.id` differs only in letter case (so its control lease has another name) takes the
/// station over: before anyone else may take the lease, the safe state the station is owed is
/// written (ON1 off), and the next holder waits the lock-delay, as with identical ids.
async fn a_takeover_under_another_name_applies_the_safe_state_owed(backend: &str) {
    let station = Station::start(Line::Tcp, Duration::ZERO).await;
    let id = format!("Bench {}", &LeaseToken::random().as_str()[..8]);
    let owner_config = station.config(|config| {
        config.station.id = id.clone();
        config.lease.backend = backend.to_owned();
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
        config.lease.lock_delay_ms = Some(1000);
        short_takeover(config);
    });
    let mut standby_config = owner_config.clone();
    standby_config.station.id = id.to_uppercase();
    standby_config.ha.mode = HaMode::Standby;
    assert_ne!(
        owner_config.control_lease_name(),
        standby_config.control_lease_name()
    );
    let owner = start_gateway(owner_config).await;
    let standby = station_gateway::start(
        station_gateway::Listeners {
            http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: None,
        },
        standby_config,
    )
    .await
    .expect("a standby starts while its owner serves the station");
    let a = take(&owner, "TAT station 3").await;
    let guard = owner
        .gateway
        .lease
        .admit(Access::Change, Some(&a))
        .unwrap()
        .guard;
    owner
        .link()
        .write(vec![(ON1.into(), Value::Bool(true))], guard)
        .await
        .unwrap();
    drop(owner);
    station.sim.clear_write_log();
    let killed = Instant::now();
    // B keeps asking the standby for the lease; it may have it once the station is safe.
    let http = reqwest::Client::new();
    let b = within(BOUND, "the standby to grant B the lease", async {
        loop {
            let asked = http
                .post(format!("{}/api/lease", standby.base_url()))
                .json(&serde_json::json!({ "Owner": "TAT station 4", "TtlMs": 60000 }))
                .send()
                .await
                .unwrap();
            if asked.status() == 200 {
                let answer: serde_json::Value = asked.json().await.unwrap();
                return answer["leaseId"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    let granted = killed.elapsed();
    assert_eq!(
        station.on1_writes(),
        [Value::Bool(false)],
        "the standby granted B the lease {granted:?} after the owner died without writing the safe state A's lease left owed"
    );
    let _ = b;
    standby.stop().await;
}

#[tokio::test]
async fn a_takeover_under_another_name_applies_the_safe_state_owed_on_sqlite() {
    let backend = Backend::named("sqlite").await;
    a_takeover_under_another_name_applies_the_safe_state_owed(&backend.url).await;
}

#[tokio::test]
async fn a_takeover_under_another_name_applies_the_safe_state_owed_on_redis() {
    let backend = Backend::named("redis").await;
    a_takeover_under_another_name_applies_the_safe_state_owed(&backend.url).await;
}

/// The same physical station served first by a gateway of its own (`station.id` "bench-…")
/// and standing by in a gateway of several stations that names it `st1` (another control
/// lease, another link-owner lease: only the station's own lease, named after its HELLO,
/// makes it wait). The first is killed while A holds the lease and ON1 is on; once the lab's
/// station takes the station over, the safe state A's lease left owed is written before anyone
/// may take the lease there.
#[tokio::test]
async fn a_lab_that_names_the_station_otherwise_applies_the_safe_state_owed_when_it_takes_over() {
    let backend = Backend::named("sqlite").await;
    let station = Station::start(Line::Tcp, Duration::ZERO).await;
    let other = common::default_simulator().await;
    let tweak = |config: &mut Config| {
        config.lease.backend = backend.url.clone();
        config.lease.safe_state = vec![SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
        config.lease.lock_delay_ms = Some(1000);
        config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
        config.station.max_processing_ms = Some(MAX_PROCESSING_MS);
        short_takeover(config);
    };
    let alone = start_gateway(station.config(|config| {
        config.station.id = format!("bench-{}", &LeaseToken::random().as_str()[..8]);
        tweak(config);
    }))
    .await;
    let token = LeaseToken::random();
    let suffix = &token.as_str()[..8];
    let files = std::env::temp_dir().join(format!("gateway-duties-lab-{suffix}"));
    let setup = |id: String, mut config: Config| {
        config.config_files.dir = files.join(&id);
        station_gateway::config::lab::StationSetup { id, config }
    };
    let lab = station_gateway::config::lab::Lab {
        stations: vec![
            setup(
                format!("st1-{suffix}"),
                station.config(|config| {
                    config.station.id = format!("st1-{suffix}");
                    tweak(config);
                }),
            ),
            setup(
                format!("st2-{suffix}"),
                config_for(&other, |config| {
                    config.station.id = format!("st2-{suffix}");
                    tweak(config);
                }),
            ),
        ],
        default_station: None,
    };
    let lab = station_gateway::start_lab(
        station_gateway::LabListeners {
            http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: vec![None, None],
        },
        lab,
    )
    .await
    .expect("the lab starts while another gateway serves one of its stations");
    let a = take(&alone, "TAT station 3").await;
    let guard = alone
        .gateway
        .lease
        .admit(Access::Change, Some(&a))
        .unwrap()
        .guard;
    alone
        .link()
        .write(vec![(ON1.into(), Value::Bool(true))], guard)
        .await
        .unwrap();
    drop(alone);
    station.sim.clear_write_log();
    let http = reqwest::Client::new();
    let url = format!("{}/stations/st1-{suffix}/api/lease", lab.base_url());
    let granted = within(BOUND, "the lab's st1 to grant B the lease", async {
        loop {
            let asked = http
                .post(&url)
                .json(&serde_json::json!({ "Owner": "TAT station 4", "TtlMs": 60000 }))
                .send()
                .await
                .unwrap();
            if asked.status() == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    let () = granted;
    assert_eq!(
        station.on1_writes(),
        [Value::Bool(false)],
        "the lab's station granted B the lease without writing the safe state A's lease left owed at the station"
    );
    lab.stop().await;
}

/// A gateway process is killed (-9) while a change made without a lease is at a station that
/// carries it out anyway, and is started again at once with its link-owner state file (it takes
/// its own leases back, no lock-delay). The crashed run left no record of that change: the
/// restarted gateway counts whatever the crashed run may have had at the station as in doubt,
/// so B, who asks for the lease right after the restart, is granted only after it can no
/// longer land.
#[tokio::test]
async fn a_change_at_the_station_when_its_gateway_crashed_lands_before_the_next_holders() {
    let backend = Backend::named("sqlite").await;
    let station = Station::start(Line::Tcp, Duration::from_millis(1200)).await;
    let state = std::env::temp_dir().join(format!(
        "gateway-duties-crash-{}.state",
        &LeaseToken::random().as_str()[..12]
    ));
    let config = station.config(|config| {
        config.station.id = format!("crash-{}", &LeaseToken::random().as_str()[..8]);
        config.lease.backend = backend.url.clone();
        config.lease.link_owner_state = state.display().to_string();
    });
    let http = reqwest::Client::new();
    let ready = |base: String| {
        let http = http.clone();
        within(BOUND, "the gateway process to be ready", async move {
            while !http
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let first = common::process::GatewayProcess::start(&config).unwrap();
    ready(first.base_url.clone()).await;
    let set = |base: &str, lease: Option<&str>, value: &str| {
        let mut request = http
            .post(format!("{base}/api/resources/value/set"))
            .json(&serde_json::json!({ "Name": ON1, "Value": value }));
        if let Some(lease) = lease {
            request = request.header("X-Lease-Id", lease);
        }
        request.send()
    };
    // VSET1 (the slow one) and ON1 in one write, sent without a lease.
    let batch = http
        .post(format!("{}/api/resources/values/set", first.base_url))
        .json(&serde_json::json!({ "Resources": { VSET1: "100", ON1: "True" } }))
        .send();
    let writing = tokio::spawn(batch);
    until(BOUND, "the lease-less change to be at the station", || {
        station.sim.requests_in_progress() > 0
    })
    .await;
    first.signal("-KILL").unwrap();
    drop(first);
    let _ = writing.await;
    let second = common::process::GatewayProcess::start(&config).unwrap();
    let base = second.base_url.clone();
    let lease = within(BOUND, "B to get the lease after the restart", async {
        loop {
            let asked = http
                .post(format!("{base}/api/lease"))
                .json(&serde_json::json!({ "Owner": "TAT station 4", "TtlMs": 60000 }))
                .send()
                .await;
            if let Ok(asked) = asked
                && asked.status() == 200
            {
                let answer: serde_json::Value = asked.json().await.unwrap();
                return answer["leaseId"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    let answer = within(BOUND, "B's write", async {
        loop {
            let response = set(&base, Some(&lease), "False").await.unwrap();
            if response.status() != 503 {
                return response.status();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    assert_eq!(answer, 200);
    until(BOUND, "the station to finish every request", || {
        station.sim.requests_in_progress() == 0 && station.on1_writes().len() >= 2
    })
    .await;
    let _ = std::fs::remove_file(&state);
    assert_eq!(
        station.on1_writes(),
        [Value::Bool(true), Value::Bool(false)],
        "the crashed run's change landed inside B's lease"
    );
}

/// The owner stops cleanly (SIGTERM, or `stop`) while a change made without a lease is at a
/// station that carries it out anyway; its standby takes over at once (a clean stop owes no
/// lock-delay). The change is in the station's ledger, so the standby grants B the lease only
/// once it can no longer land.
#[tokio::test]
async fn a_change_at_the_station_when_its_owner_stopped_cleanly_is_waited_for_by_the_standby() {
    let backend = Backend::named("sqlite").await;
    let station = Station::start(Line::Tcp, Duration::from_millis(1200)).await;
    let id = format!("clean-{}", &LeaseToken::random().as_str()[..8]);
    let owner_config = station.config(|config| {
        config.station.id = id.clone();
        config.lease.backend = backend.url.clone();
        short_takeover(config);
    });
    let mut standby_config = owner_config.clone();
    standby_config.ha.mode = HaMode::Standby;
    let owner = start_gateway(owner_config).await;
    let standby = station_gateway::start(
        station_gateway::Listeners {
            http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: None,
        },
        standby_config,
    )
    .await
    .expect("a standby starts");
    let writing = {
        let gateway = owner.gateway.clone();
        tokio::spawn(async move {
            let guard = gateway.lease.admit(Access::Change, None).unwrap().guard;
            let items = vec![
                (VSET1.into(), Value::Float(100.0)),
                (ON1.into(), Value::Bool(true)),
            ];
            gateway.link.write(items, guard).await.map(drop)
        })
    };
    until(BOUND, "the lease-less change to be at the station", || {
        station.sim.requests_in_progress() > 0
    })
    .await;
    owner.stop().await;
    let _ = writing.await;
    let http = reqwest::Client::new();
    let lease = within(BOUND, "the standby to grant B the lease", async {
        loop {
            let asked = http
                .post(format!("{}/api/lease", standby.base_url()))
                .json(&serde_json::json!({ "Owner": "TAT station 4", "TtlMs": 60000 }))
                .send()
                .await
                .unwrap();
            if asked.status() == 200 {
                let answer: serde_json::Value = asked.json().await.unwrap();
                return answer["leaseId"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    switch_on1_off(&standby, &lease).await;
    until(BOUND, "the station to finish every request", || {
        station.sim.requests_in_progress() == 0 && station.on1_writes().len() >= 2
    })
    .await;
    assert_eq!(
        station.on1_writes(),
        [Value::Bool(true), Value::Bool(false)],
        "the change at the station when its owner stopped landed inside B's lease"
    );
    standby.stop().await;
}

/// A change made without a lease outlives `station.max_processing_ms` unanswered (this
/// station breaks its contract: it carries it out later still, within the lock-delay), and
/// before anyone asks for the lease the gateway stops cleanly; a new gateway on the same SQLite
/// store serves the station and B asks for the lease at once. The lock-delay that began when
/// the doubt lapsed is the station's, not the process's: B is granted only once it is over, so
/// the late `ON1=True` lands before B's lease, never inside it.
#[tokio::test]
async fn a_lapsed_doubts_lock_delay_outlives_a_clean_stop() {
    const LOCK_DELAY_MS: u64 = 1500;
    let backend = Backend::named("sqlite").await;
    // Past the longest processing by less than the lock-delay.
    let late = Duration::from_millis(MAX_PROCESSING_MS + 1000);
    let station = Station::start(Line::Tcp, late).await;
    let config = station.config(|config| {
        config.station.id = format!("lapse-{}", &LeaseToken::random().as_str()[..8]);
        config.lease.backend = backend.url.clone();
        config.lease.lock_delay_ms = Some(LOCK_DELAY_MS);
    });
    let first = start_gateway(config.clone()).await;
    let mut doubts = first.link().watch_doubts();
    let sent = Instant::now();
    let outcome = slow_on(&first, None).await;
    assert!(
        matches!(outcome, Err(LinkError::WriteTimeout { .. })),
        "{outcome:?}"
    );
    within(BOUND, "the change's doubt to lapse", async {
        let _ = doubts.wait_for(|d| !d.doubts.is_empty()).await;
        let _ = doubts.wait_for(|d| d.doubts.is_empty()).await;
    })
    .await;
    let lapsed = sent.elapsed();
    assert!(
        station.on1_writes().is_empty(),
        "the late change landed before its doubt lapsed"
    );
    first.stop().await;
    let second = start_gateway(config).await;
    let b = take(&second, "TAT station 4").await;
    let granted = sent.elapsed();
    switch_on1_off(&second, &b).await;
    until(BOUND, "both writes to ON1 to land", || {
        station.on1_writes().len() >= 2
    })
    .await;
    assert_eq!(
        station.on1_writes(),
        [Value::Bool(true), Value::Bool(false)],
        "the late lease-less change landed inside B's lease, granted {granted:?} after it was sent (its doubt lapsed at {lapsed:?}, then its gateway stopped)"
    );
    let earliest = Duration::from_millis(MAX_PROCESSING_MS + LOCK_DELAY_MS);
    assert!(
        granted >= earliest,
        "B was granted {granted:?} after the change, before the lock-delay that followed its lapse ran ({earliest:?})"
    );
    second.stop().await;
}

//! The control lease against the simulator, over HTTP as the reference client uses it: 423 and
//! 409 for others, renew, release, expiry, "lease ended", fencing of a stale holder at the link,
//! safe state, the admin break and waiting in line; and an in-process acquisition race.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::*;
use reqwest::Method;
use serde_json::{Value as Json, json};
use station_gateway::lease::{ControlLease, LeaseError, LeaseView, MemoryLeaseStore};
use station_protocol::Value;
use tokio::time::Instant;

const VMON2: &str = "0.4.ESH10000662.VMON2";
const UART01: &str = "0.ESH10000023.UART01";
const HOLDER: &str = "TAT station 3";

/// One HTTP answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    json: Json,
    fence: Option<u64>,
}

impl Reply {
    /// The message the reference client would show.
    fn error(&self) -> String {
        self.json["error"].as_str().unwrap_or_default().to_owned()
    }

    fn expect(self, status: u16) -> Result<Reply> {
        ensure!(self.status == status, "expected {status}, got {self:?}");
        Ok(self)
    }
}

/// A client that behaves like the reference client: once it holds the lease it sends
/// `X-Lease-Id` with every request; `release` stops sending it before the DELETE.
struct Client {
    http: reqwest::Client,
    base: String,
    lease_id: Option<String>,
}

impl Client {
    fn new(rig: &Rig) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: rig.url(""),
            lease_id: None,
        }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Json>) -> Result<Reply> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(id) = &self.lease_id {
            request = request.header("X-Lease-Id", id);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let fence = response
            .headers()
            .get("x-lease-fence")
            .map(|value| value.to_str().unwrap_or_default().parse())
            .transpose()?;
        let json = response.json().await.unwrap_or(Json::Null);
        Ok(Reply {
            status,
            json,
            fence,
        })
    }

    async fn acquire(&mut self, owner: &str, ttl_ms: u64) -> Result<Reply> {
        self.acquire_at("lease", owner, ttl_ms).await
    }

    /// `POST lease` with a query such as `lease?waitMs=500`.
    async fn acquire_at(&mut self, path: &str, owner: &str, ttl_ms: u64) -> Result<Reply> {
        let reply = self
            .call(
                Method::POST,
                path,
                Some(json!({ "Owner": owner, "TtlMs": ttl_ms })),
            )
            .await?;
        if reply.status == 200 {
            self.lease_id = Some(
                reply.json["leaseId"]
                    .as_str()
                    .context("no leaseId")?
                    .to_owned(),
            );
        }
        Ok(reply)
    }

    async fn renew(&self) -> Result<Reply> {
        let id = self.lease_id.clone().context("holds no lease")?;
        self.call(Method::PUT, &format!("lease/{id}"), Some(json!({})))
            .await
    }

    async fn release(&mut self) -> Result<Reply> {
        let id = self.lease_id.take().context("holds no lease")?;
        self.call(Method::DELETE, &format!("lease/{id}"), None)
            .await
    }

    async fn lease(&self) -> Result<Json> {
        Ok(self
            .call(Method::GET, "lease", None)
            .await?
            .expect(200)?
            .json)
    }

    async fn set_value(&self, name: &str, value: &str) -> Result<Reply> {
        self.call(
            Method::POST,
            "resources/value/set",
            Some(json!({ "Name": name, "Value": value })),
        )
        .await
    }

    async fn set_values(&self, items: Json) -> Result<Reply> {
        self.call(
            Method::POST,
            "resources/values/set",
            Some(json!({ "Resources": items })),
        )
        .await
    }

    async fn get_value(&self, name: &str) -> Result<Reply> {
        self.call(
            Method::POST,
            "resources/value/get",
            Some(json!({ "Name": name })),
        )
        .await
    }

    async fn get_values(&self, names: &[&str], max_age_ms: Option<u64>) -> Result<Reply> {
        let body = match max_age_ms {
            Some(max_age_ms) => json!({ "Names": names, "MaxAgeMs": max_age_ms }),
            None => json!({ "Names": names }),
        };
        self.call(Method::POST, "resources/values/get", Some(body))
            .await
    }
}

/// Asserts a 423 whose message names the holder and the time left.
fn assert_locked_by_holder(reply: &Reply, what: &str) {
    assert_eq!(reply.status, 423, "{what}: {reply:?}");
    let message = reply.error();
    assert!(
        message.contains(&format!("held by {HOLDER} for another")),
        "{what}: {message}"
    );
}

#[tokio::test]
async fn a_holder_shuts_everyone_else_out_of_changes_and_forced_reads() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut a, mut b) = (Client::new(&rig), Client::new(&rig));
    let taken = a.acquire(HOLDER, 30_000).await?.expect(200)?;
    let fence = taken.json["fence"].as_u64().context("no fence")?;
    assert_eq!(taken.json["held"], true);
    assert_eq!(taken.json["owner"], HOLDER);
    assert!(
        taken.json["since"]
            .as_str()
            .is_some_and(|since| since.ends_with('Z'))
    );
    assert_eq!(taken.fence, Some(fence));

    let seen = b.lease().await?;
    assert_eq!(
        (seen["held"].clone(), seen["owner"].clone()),
        (json!(true), json!(HOLDER))
    );
    assert!(
        seen.get("leaseId").is_none(),
        "GET lease shows the id: {seen}"
    );
    assert!(
        seen["expiresInMs"]
            .as_u64()
            .is_some_and(|ms| ms > 29_000 && ms <= 30_000)
    );

    assert_locked_by_holder(&b.set_value(VSET1, "5").await?, "set_value");
    assert_locked_by_holder(&b.set_values(json!({ VSET1: "5" })).await?, "set_values");
    assert_locked_by_holder(&b.get_value(VMON1).await?, "get_value");
    assert_locked_by_holder(&b.get_values(&[VMON1], None).await?, "get_values");
    assert_locked_by_holder(
        &b.get_values(&[VMON1], Some(0)).await?,
        "get_values MaxAgeMs=0",
    );
    let transact = b
        .call(
            Method::POST,
            "resources/transact",
            Some(json!({ "Name": VSET1, "Value": "5" })),
        )
        .await?;
    assert_locked_by_holder(&transact, "transact");

    // Cached reads and lookups stay open; ages are shown. During a lease a non-holder's cached
    // read comes from the cache only: the holder has read these.
    a.get_values(&[VMON1, VMON2], None).await?.expect(200)?;
    let cached = b
        .get_values(&[VMON1, VMON2], Some(5000))
        .await?
        .expect(200)?;
    assert!(cached.json["resources"][VMON1].is_string(), "{cached:?}");
    assert!(cached.json["ageMs"][VMON2].is_number(), "{cached:?}");
    assert_eq!(cached.fence, None, "a non-holder gets no fence");
    b.call(
        Method::POST,
        "channels/channel",
        Some(json!({ "NetName": VSET1 })),
    )
    .await?
    .expect(200)?;
    let capabilities = b
        .call(Method::GET, "capabilities", None)
        .await?
        .expect(200)?;
    assert!(
        capabilities.json["features"]
            .as_array()
            .unwrap()
            .contains(&json!("lease"))
    );

    let refused = b.acquire("TAT station 4", 30_000).await?.expect(409)?;
    assert!(
        refused
            .error()
            .contains(&format!("held by {HOLDER} for another")),
        "{}",
        refused.error()
    );

    // The holder goes through as if there were no lease, and its answers carry the fence.
    let written = a.set_value(VSET1, "5").await?.expect(200)?;
    assert_eq!(written.fence, Some(fence));
    assert_eq!(a.get_value(VSET1).await?.expect(200)?.json["value"], "5");
    assert_eq!(
        a.set_values(json!({ VSET1: "6" }))
            .await?
            .expect(200)?
            .fence,
        Some(fence)
    );

    // An acquire retried with the live id gets the same lease back, renewed.
    let again = a.acquire(HOLDER, 30_000).await?.expect(200)?;
    assert_eq!(
        (&again.json["leaseId"], again.json["fence"].as_u64()),
        (&taken.json["leaseId"], Some(fence))
    );
    Ok(())
}

#[tokio::test]
async fn non_holders_read_consuming_channels_only_from_the_cache() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut a, b) = (Client::new(&rig), Client::new(&rig));
    a.acquire(HOLDER, 30_000).await?.expect(200)?;
    let nothing_cached = b.get_values(&[UART01], Some(5000)).await?.expect(423)?;
    assert!(
        nothing_cached.error().contains(UART01),
        "{}",
        nothing_cached.error()
    );
    assert!(
        nothing_cached.error().contains(HOLDER),
        "{}",
        nothing_cached.error()
    );
    assert_eq!(rig.sim.reads_of(UART01), 0);

    a.get_values(&[UART01, VMON1], None).await?.expect(200)?;
    let reads = rig.sim.reads_of(UART01);
    tokio::time::sleep(Duration::from_millis(60)).await;
    // MaxAgeMs 1 would make anyone else read it again: for B it comes from the cache, aged.
    let cached = b.get_values(&[UART01, VMON1], Some(1)).await?.expect(200)?;
    let age = cached.json["ageMs"][UART01].as_f64().context("no age")?;
    assert!(age >= 60.0, "true age expected, got {age}");
    assert_eq!(
        rig.sim.reads_of(UART01),
        reads,
        "B's read consumed the channel"
    );
    // The holder reads it from the hardware.
    a.get_values(&[UART01], Some(1)).await?.expect(200)?;
    assert_eq!(rig.sim.reads_of(UART01), reads + 1);
    Ok(())
}

#[tokio::test]
async fn renewing_keeps_the_lease_past_its_ttl_and_after_release_the_next_one_takes_it()
-> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut a, mut b) = (Client::new(&rig), Client::new(&rig));
    let first = a.acquire(HOLDER, 1000).await?.expect(200)?;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(333)).await;
        let renewed = a.renew().await?.expect(200)?;
        assert_eq!(renewed.json["leaseId"], first.json["leaseId"]);
        assert_eq!(renewed.json["fence"], first.json["fence"]);
    }
    // Well past the first TTL: still A's.
    assert_eq!(b.lease().await?["owner"], HOLDER);
    b.acquire("TAT station 4", 1000).await?.expect(409)?;
    a.set_value(VSET1, "7").await?.expect(200)?;
    let old_id = a.lease_id.clone();
    a.release().await?.expect(200)?;
    a.lease_id = old_id;
    a.release().await?.expect(404)?;
    let second = b.acquire("TAT station 4", 1000).await?.expect(200)?;
    assert!(second.json["fence"].as_u64() > first.json["fence"].as_u64());
    b.set_value(VSET1, "8").await?.expect(200)?;
    Ok(())
}

#[tokio::test]
async fn a_lease_not_renewed_ends_within_its_ttl_and_its_id_then_says_lease_ended() -> Result<()> {
    let rig = rig(|_| {}).await;
    let mut events = rig.gateway.gateway.lease_events.subscribe();
    let (mut a, b) = (Client::new(&rig), Client::new(&rig));
    // The gateway starts the TTL after this instant (when the request arrives)...
    let asked = Instant::now();
    a.acquire(HOLDER, 1000).await?.expect(200)?;
    // ...and before this one (the answer says how long is left).
    let answered = Instant::now();
    assert!(events.recv().await?.held);
    let ran_out = within(
        Duration::from_secs(5),
        "the lease to run out",
        events.recv(),
    )
    .await?;
    // Free at once: no change of it was left in doubt, so no lock-delay.
    assert_eq!(ran_out, LeaseView::nobody());
    let ended = Instant::now();
    assert!(
        ended.duration_since(asked) >= Duration::from_millis(1000),
        "ended {:?} after it was asked for: before its TTL",
        ended.duration_since(asked)
    );
    assert!(
        ended.duration_since(answered) <= Duration::from_millis(1100),
        "ended {:?} after it was granted: not within its TTL",
        ended.duration_since(answered)
    );
    assert_eq!(b.lease().await?["held"], false);

    a.renew().await?.expect(404)?;
    let ended = a.set_value(VSET1, "9").await?.expect(423)?;
    assert!(
        ended.error().starts_with("lease ended"),
        "{}",
        ended.error()
    );
    a.get_value(VMON1).await?.expect(423)?;
    // Cached reads do not need the lease, whatever id they carry.
    a.get_values(&[VMON1], Some(1000)).await?.expect(200)?;
    // Nobody holds it: a client without an id may change the station.
    b.set_value(VSET1, "9").await?.expect(200)?;
    Ok(())
}

#[tokio::test]
async fn ttl_and_wait_out_of_range_are_refused_with_400() -> Result<()> {
    let rig = rig(|_| {}).await;
    let mut a = Client::new(&rig);
    for ttl_ms in [999, 600_001] {
        let refused = a.acquire(HOLDER, ttl_ms).await?.expect(400)?;
        assert!(refused.error().contains("TtlMs"), "{}", refused.error());
    }
    let refused = a
        .acquire_at("lease?waitMs=60001", HOLDER, 1000)
        .await?
        .expect(400)?;
    assert!(refused.error().contains("waitMs"), "{}", refused.error());
    let no_owner = a
        .call(Method::POST, "lease", Some(json!({ "TtlMs": 1000 })))
        .await?
        .expect(400)?;
    assert!(no_owner.error().contains("Owner"), "{}", no_owner.error());
    let default_ttl = a
        .call(Method::POST, "lease", Some(json!({ "owner": HOLDER })))
        .await?
        .expect(200)?;
    assert!(
        default_ttl.json["expiresInMs"]
            .as_u64()
            .is_some_and(|ms| ms > 29_000)
    );
    // Re-acquiring with the live id takes the new TTL, at both ends of the range.
    a.lease_id = default_ttl.json["leaseId"].as_str().map(str::to_owned);
    let shortest = a.acquire(HOLDER, 1000).await?.expect(200)?;
    assert!(
        shortest.json["expiresInMs"]
            .as_u64()
            .is_some_and(|ms| ms <= 1000)
    );
    let longest = a.acquire(HOLDER, 600_000).await?.expect(200)?;
    assert!(
        longest.json["expiresInMs"]
            .as_u64()
            .is_some_and(|ms| ms > 599_000)
    );
    assert_eq!(longest.json["leaseId"], default_ttl.json["leaseId"]);
    Ok(())
}

#[tokio::test]
async fn a_stale_holders_write_never_reaches_the_station_after_the_next_one_took_over() -> Result<()>
{
    let rig = rig(|config| {
        config.station.max_names_per_read = 1;
        config.station.request_timeout_ms = 5000;
        // The send guard alone keeps the stale write out (the lock-delay, which would too,
        // has its own test: tests/gateway/lock_delay.rs).
        config.lease.lock_delay_ms = Some(0);
    })
    .await;
    let (mut a, mut b) = (Client::new(&rig), Client::new(&rig));
    a.acquire(HOLDER, 1000).await?.expect(200)?;
    a.set_value(VSET1, "11").await?.expect(200)?;

    // A stalls: its last write is admitted under its lease, then waits at the link behind a
    // full window of slow reads until after the lease ran out and B took it.
    rig.sim.set_reply_delay(Duration::from_millis(1600));
    let slow_reads: Vec<String> = ["VMON", "ISET", "IMON", "VSET"]
        .iter()
        .flat_map(|kind| (1..=4).map(move |n| format!("0.4.ESH10000662.{kind}{n}")))
        .collect();
    let a = Arc::new(a);
    let window = u64::from(
        rig.gateway
            .link()
            .info()
            .hello
            .as_ref()
            .context("no HELLO")?
            .window,
    );
    let stats = rig.gateway.link().stats().clone();
    let frames = || station_gateway::link::LinkStats::get(&stats.frames_sent);
    let before = frames();
    let mut lease_events = rig.gateway.gateway.lease_events.subscribe();
    let mut reads = Vec::new();
    for name in slow_reads {
        let a = a.clone();
        reads.push(tokio::spawn(async move { a.get_value(&name).await }));
    }
    // The station's window is full of slow reads: the write will wait at the link.
    until(
        Duration::from_secs(5),
        "a window of slow reads on the wire",
        || frames() >= before + window.min(16),
    )
    .await;
    let late_write = tokio::spawn({
        let a = a.clone();
        async move { a.set_value(VSET1, "33").await }
    });
    // A's lease runs out (the replies take 1.6 s), then B takes it.
    let ran_out = within(
        Duration::from_secs(5),
        "A's lease to run out",
        lease_events.recv(),
    )
    .await?;
    assert!(!ran_out.held, "{ran_out:?}");
    b.acquire("TAT station 4", 30_000).await?.expect(200)?;
    let taken_over_at = Instant::now();

    let refused = late_write.await??.expect(423)?;
    assert!(
        refused.error().contains("lease ended"),
        "{}",
        refused.error()
    );
    assert!(refused.error().contains("not sent"), "{}", refused.error());
    for read in reads {
        read.await??;
    }
    rig.sim.set_reply_delay(Duration::ZERO);
    b.set_value(VSET1, "22").await?.expect(200)?;
    // A's next write with its old id is refused at admission.
    a.set_value(VSET1, "44").await?.expect(423)?;

    let log = rig.sim.write_log();
    assert!(
        log.iter()
            .any(|w| w.channel == VSET1 && w.value == Value::Float(22.0)),
        "{log:?}"
    );
    let stale = [Value::Float(33.0), Value::Float(44.0)];
    assert!(
        !log.iter().any(|w| stale.contains(&w.value)),
        "a stale write reached the station: {log:?}"
    );
    let after_takeover: Vec<_> = log.iter().filter(|w| w.at >= taken_over_at).collect();
    assert!(
        after_takeover.iter().all(|w| w.value == Value::Float(22.0)),
        "{after_takeover:?}"
    );
    assert!(
        station_gateway::link::LinkStats::get(&rig.gateway.link().stats().refused_by_guard) >= 1
    );
    Ok(())
}

#[tokio::test]
async fn safe_state_is_applied_when_a_lease_runs_out_and_never_on_release() -> Result<()> {
    let rig = rig(|config| {
        config.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
        // Read back again, and the lock-delay, after 2 s.
        config.station.max_processing_ms = Some(2000);
    })
    .await;
    let safe_writes = |rig: &Rig| {
        rig.sim
            .write_log()
            .into_iter()
            .filter(|w| w.channel == ON1 && w.value == Value::Bool(false))
            .count()
    };
    let (mut a, mut b) = (Client::new(&rig), Client::new(&rig));
    a.acquire(HOLDER, 30_000).await?.expect(200)?;
    a.set_value(ON1, "True").await?.expect(200)?;
    a.release().await?.expect(200)?;
    b.acquire("TAT station 4", 30_000).await?.expect(200)?;
    b.release().await?.expect(200)?;
    assert_eq!(safe_writes(&rig), 0, "a release applied the safe state");

    a.acquire(HOLDER, 1000).await?.expect(200)?;
    a.set_value(ON1, "True").await?.expect(200)?;
    // B waits in line; it gets the lease only once the safe state is on the station and read
    // back right twice.
    let taken = b
        .acquire_at("lease?waitMs=10000", "TAT station 4", 30_000)
        .await?
        .expect(200)?;
    assert_eq!(taken.json["owner"], "TAT station 4");
    assert_eq!(safe_writes(&rig), 1);
    assert_eq!(b.get_value(ON1).await?.expect(200)?.json["value"], "False");
    Ok(())
}

#[tokio::test]
async fn the_admin_break_works_only_with_the_token() -> Result<()> {
    let rig = rig(|config| config.lease.admin_token = "let-me-in".into()).await;
    let mut events = rig.gateway.gateway.lease_events.subscribe();
    let (mut a, admin) = (Client::new(&rig), Client::new(&rig));
    a.acquire(HOLDER, 30_000).await?.expect(200)?;
    let break_with = |token: Option<&str>| {
        let mut request = admin.http.delete(format!("{}lease", admin.base));
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        request.send()
    };
    for token in [None, Some("let-me-out"), Some("")] {
        let response = break_with(token).await?;
        assert_eq!(response.status(), 403, "token {token:?}");
        let message = response.json::<Json>().await?["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(message.contains("Authorization: Bearer"), "{message}");
    }
    // The lease holder's own id is not the admin token either.
    a.call(Method::DELETE, "lease", None).await?.expect(403)?;
    assert_eq!(admin.lease().await?["owner"], HOLDER);

    let broken = break_with(Some("let-me-in")).await?;
    assert_eq!(broken.status(), 200);
    assert_eq!(broken.json::<Json>().await?["broken"]["owner"], HOLDER);
    assert_eq!(admin.lease().await?["held"], false);
    assert!(
        a.set_value(VSET1, "1")
            .await?
            .expect(423)?
            .error()
            .starts_with("lease ended")
    );
    let seen: Vec<bool> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|view| view.held)
        .collect();
    assert_eq!(seen, [true, false], "taken, then broken");
    assert_eq!(
        break_with(Some("let-me-in")).await?.status(),
        404,
        "nobody holds it any more"
    );

    let off = common::rig(|_| {}).await;
    let response = Client::new(&off)
        .call(Method::DELETE, "lease", None)
        .await?
        .expect(404)?;
    assert!(
        response.error().contains("lease.admin_token"),
        "{}",
        response.error()
    );
    Ok(())
}

#[tokio::test]
async fn a_waiting_acquire_gives_up_with_409_or_gets_the_lease_when_it_is_let_go() -> Result<()> {
    let rig = rig(|_| {}).await;
    let mut a = Client::new(&rig);
    a.acquire(HOLDER, 30_000).await?.expect(200)?;
    // The order of the line itself is proven with paused time by the unit test
    // `lease::control::tests::waiters_are_served_first_come_first_served`; over HTTP this checks
    // that `waitMs` reaches it: a waiter gives up with a 409 naming the holder, not before its
    // wait, and a waiter gets the lease once the holder lets go, without asking again.
    let started = Instant::now();
    let gave_up = Client::new(&rig)
        .acquire_at("lease?waitMs=300", "impatient", 30_000)
        .await?
        .expect(409)?;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(gave_up.error().contains(HOLDER), "{}", gave_up.error());

    let mut lease_events = rig.gateway.gateway.lease_events.subscribe();
    let mut second = Client::new(&rig);
    let waiter = tokio::spawn(async move {
        let reply = second
            .acquire_at("lease?waitMs=30000", "second", 30_000)
            .await;
        (second, reply)
    });
    a.release().await?.expect(200)?;
    let (mut second, reply) =
        within(Duration::from_secs(10), "the waiter's answer", waiter).await?;
    assert_eq!(reply?.expect(200)?.json["owner"], "second");
    // Whether it was waiting when A let go or came just after, it was never refused, and the
    // lease went from A to nobody to the second, in that order.
    let seen: Vec<Option<String>> = std::iter::from_fn(|| lease_events.try_recv().ok())
        .map(|view| view.owner)
        .collect();
    assert_eq!(seen, [None, Some("second".to_owned())], "{seen:?}");
    second.release().await?.expect(200)?;
    Ok(())
}

/// 64 acquirers at once, 200 rounds, in process: exactly one winner each round, and fences
/// that only go up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_acquires_have_exactly_one_winner_each_round() -> Result<()> {
    let (events, _) = tokio::sync::broadcast::channel(16);
    let lease = Arc::new(ControlLease::new(
        Arc::new(MemoryLeaseStore::new()),
        "control:race",
        events,
    ));
    let mut last_fence = 0;
    for round in 0..200 {
        let start = Arc::new(tokio::sync::Barrier::new(64));
        let contenders: Vec<_> = (0..64)
            .map(|n| {
                let (lease, start) = (lease.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    lease
                        .acquire(
                            format!("contender {n}"),
                            Duration::from_secs(30),
                            None,
                            Duration::ZERO,
                        )
                        .await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for contender in contenders {
            match contender.await? {
                Ok(answer) => winners.push(answer),
                Err(LeaseError::HeldByOther { .. }) => {}
                Err(other) => anyhow::bail!("round {round}: {other}"),
            }
        }
        ensure!(
            winners.len() == 1,
            "round {round}: {} winners",
            winners.len()
        );
        let winner = &winners[0];
        ensure!(
            winner.fence > last_fence,
            "round {round}: fence {} after {last_fence}",
            winner.fence
        );
        last_fence = winner.fence;
        lease.release(&winner.lease_id).await?;
    }
    Ok(())
}

/// README: "A backend that cannot answer gives 503, never 'held'". A SQLite backend whose file
/// another process holds locked past `busy_timeout_ms`: taking the control lease, and taking,
/// reading, renewing and releasing a named lease, are all 503 naming the store, never a state;
/// once the lock goes, everything answers again.
#[tokio::test]
async fn a_lease_backend_that_cannot_answer_gives_503_never_held() -> Result<()> {
    let path = std::env::temp_dir().join(format!(
        "station-gateway-locked-{}-{}.db",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
    ));
    let backend = format!("sqlite:{}?busy_timeout_ms=100", path.display());
    let rig = rig(|config| config.lease.backend = backend).await;
    let mut a = Client::new(&rig);
    let (status, named) = rig
        .post(
            "../v1/leases/bench-a",
            json!({ "ttlMs": 30_000, "owner": "importer" }),
        )
        .await;
    assert_eq!(status, 200, "{named}");
    let token = named["token"].as_str().context("no token")?.to_owned();

    let blocker = rusqlite::Connection::open(&path)?;
    blocker.execute_batch("BEGIN EXCLUSIVE")?;
    let unavailable = |status: u16, body: &Json, what: &str| {
        assert_eq!(status, 503, "{what}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("lease store is unavailable")),
            "{what}: {body}"
        );
        assert!(
            body.get("held").is_none(),
            "{what} answered a state: {body}"
        );
    };
    let taken = a.acquire(HOLDER, 30_000).await?;
    unavailable(taken.status, &taken.json, "POST api/lease");
    assert!(a.lease_id.is_none());
    let (status, body) = rig.get("../v1/leases/bench-a").await;
    unavailable(status, &body, "GET v1/leases");
    let (status, body) = rig
        .post("../v1/leases/bench-b", json!({ "ttlMs": 30_000 }))
        .await;
    unavailable(status, &body, "POST v1/leases");
    for method in [Method::PUT, Method::DELETE] {
        let response = rig
            .http
            .request(method.clone(), rig.url("../v1/leases/bench-a"))
            .header("X-Lease-Token", &token)
            .json(&json!({}))
            .send()
            .await?;
        let status = response.status().as_u16();
        unavailable(status, &response.json().await?, method.as_str());
    }
    blocker.execute_batch("COMMIT")?;
    drop(blocker);

    let (status, body) = rig.get("../v1/leases/bench-a").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["held"], true, "{body}");
    a.acquire(HOLDER, 30_000).await?.expect(200)?;
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// An owner is shown back to everyone (`GET api/lease`, every 409 and 423, the status page,
/// the audit trail): one made of control characters is refused, naming the field, and takes
/// nothing; a named lease's owner the same.
#[tokio::test]
async fn an_owner_with_control_characters_is_refused_naming_the_field() {
    let rig = rig(|_| {}).await;
    let base = rig.gateway.base_url();
    for owner in ["\u{0}\u{0}\u{0}", "\u{1b}[31mroot\u{1b}[0m", "bench\u{7}"] {
        let response = rig
            .http
            .post(format!("{base}/api/lease"))
            .json(&json!({ "Owner": owner, "TtlMs": 10000 }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Json = response.json().await.unwrap();
        assert_eq!(status, 400, "{owner:?}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("the field Owner holds the control character"),
            "{body}"
        );
        let response = rig
            .http
            .post(format!("{base}/v1/leases/bench-job"))
            .json(&json!({ "ttlMs": 10000, "owner": owner }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Json = response.json().await.unwrap();
        assert_eq!(status, 400, "{owner:?}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("the field owner holds the control character"),
            "{body}"
        );
    }
    assert_eq!(rig.gateway.gateway.lease.view().owner, None);
    let (status, body) = rig.get("../v1/leases/bench-job").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["held"], false, "{body}");
}

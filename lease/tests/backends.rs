//! The lease engine's one behavioural suite, run on every backend (memory, an SQLite file,
//! Postgres, Redis): mutual exclusion, semaphore bounds, fences, expiry, wrong tokens, blocking
//! waits and owner-token re-acquire; then faults (Redis unreachable or paused, SQLite locked)
//! (the gateway's own lease tests are in the gateway's `tests/gateway/lease_backends.rs`).
//!
//! Postgres and Redis are the machine's own — the tests' own database on each, never the
//! user's: `station_gateway_test` on PostgreSQL (`bash tests/run-all.sh` creates it when absent),
//! database 15 on Redis — or those named by `LEASE_TEST_POSTGRES_URL` and `LEASE_TEST_REDIS_URL`. A service that cannot be reached fails its tests, naming the service,
//! the URL tried, the error and the fix: set the variable, or run `bash tests/run-all.sh`,
//! which starts private ones when they are missing. Nothing is skipped. The Redis fault tests
//! start their own `redis-server` on a unix socket in a private directory (so no other process
//! can take its address between a stop and a restart). Every test uses names with a random
//! suffix, so parallel tests and reruns never meet in the shared table or keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use station_lease::engine::MAX_BACKOFF;
use station_lease::{
    AcquireRequest, Acquisition, BackendUrl, Lease, LeaseGuardError, LeaseKind, LeaseStore,
    LeaseToken, MemoryLeaseStore, RedisLeaseStore,
};
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(20);

fn unique(what: &str) -> String {
    format!("test:{what}:{}", &LeaseToken::random().as_str()[..12])
}

fn postgres_url() -> String {
    std::env::var("LEASE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/station_gateway_test".into())
}

fn redis_url() -> String {
    std::env::var("LEASE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/15".into())
}

/// A fresh SQLite file in the temp directory.
fn sqlite_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "station-gateway-lease-{}.db",
        &LeaseToken::random().as_str()[..16]
    ))
}

/// Opens `url` and asks it once; a service that cannot be reached fails the test, saying how to
/// get one.
async fn open_shared(service: &str, variable: &str, url: &str) -> Arc<dyn LeaseStore> {
    let opened = async {
        let store = BackendUrl::parse(url)?.open().await?;
        store.holders(LeaseKind::Exclusive, "test:probe").await?;
        Ok::<_, station_lease::LeaseStoreError>(store)
    }
    .await;
    match opened {
        Ok(store) => store,
        Err(error) => panic!(
            "{service} cannot be reached at {url}: {error}. The {service} lease tests need a \
             {service} server: set {variable} to the URL of a reachable one, or run \
             `bash tests/run-all.sh`, which starts a private {service} when none is reachable."
        ),
    }
}

async fn open_memory() -> Arc<dyn LeaseStore> {
    Arc::new(MemoryLeaseStore::new())
}

async fn open_sqlite() -> Arc<dyn LeaseStore> {
    let url = format!("sqlite:{}", sqlite_path().display());
    BackendUrl::parse(&url)
        .expect("an SQLite URL parses")
        .open()
        .await
        .expect("SQLite opens a temp file")
}

async fn open_postgres() -> Arc<dyn LeaseStore> {
    open_shared("PostgreSQL", "LEASE_TEST_POSTGRES_URL", &postgres_url()).await
}

async fn open_redis() -> Arc<dyn LeaseStore> {
    open_shared("Redis", "LEASE_TEST_REDIS_URL", &redis_url()).await
}

// ---------------------------------------------------------------------------------------------
// The behaviours: each takes a store and says what went wrong.

async fn mutual_exclusion_under_32_acquirers(store: Arc<dyn LeaseStore>) -> Result<()> {
    let name = unique("exclusive");
    let inside = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for worker in 0..32 {
        let (store, name, inside, fences) =
            (store.clone(), name.clone(), inside.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let lease = Lease::exclusive(store, name, LONG).with_owner(format!("worker {worker}"));
            ensure!(
                lease.acquire(true, Some(Duration::from_secs(60))).await?,
                "worker {worker} never got the lease"
            );
            let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
            fences
                .lock()
                .unwrap()
                .push(lease.fence().context("held without a fence")?);
            tokio::time::sleep(Duration::from_millis(3)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            ensure!(now_inside == 1, "{now_inside} holders at once");
            ensure!(lease.release().await?, "worker {worker}: release refused");
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let fences = fences.lock().unwrap().clone();
    ensure!(fences.len() == 32);
    ensure!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fences not strictly increasing in the order the lease was held: {fences:?}"
    );
    Ok(())
}

async fn a_semaphore_never_has_more_than_n_holders(store: Arc<dyn LeaseStore>) -> Result<()> {
    const SLOTS: u32 = 3;
    let name = unique("semaphore");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..12 {
        let (store, name, inside, most) =
            (store.clone(), name.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let slot = Lease::semaphore(store.clone(), name.clone(), SLOTS, LONG)
                .with_owner(format!("w{worker}"));
            ensure!(slot.acquire(true, Some(Duration::from_secs(60))).await?);
            let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now_inside, Ordering::SeqCst);
            let listed = store
                .holders(LeaseKind::Semaphore { slots: SLOTS }, &name)
                .await?;
            ensure!(
                listed.len() <= SLOTS as usize,
                "store lists {} holders",
                listed.len()
            );
            let grant = slot.grant().context("no grant")?;
            ensure!(grant.slot < SLOTS, "slot {} of {SLOTS}", grant.slot);
            tokio::time::sleep(Duration::from_millis(20)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            ensure!(
                now_inside <= SLOTS as usize,
                "{now_inside} holders of {SLOTS} slots"
            );
            ensure!(slot.release().await?);
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    ensure!(most.load(Ordering::SeqCst) <= SLOTS as usize);
    // Full: the next one is refused, naming a holder.
    let holders: Vec<Lease> = (0..SLOTS)
        .map(|i| {
            Lease::semaphore(store.clone(), name.clone(), SLOTS, LONG).with_owner(format!("h{i}"))
        })
        .collect();
    for holder in &holders {
        ensure!(holder.acquire(false, None).await?);
    }
    let extra = Lease::semaphore(store.clone(), name.clone(), SLOTS, LONG);
    ensure!(
        !extra.acquire(false, None).await?,
        "a fourth holder of 3 slots"
    );
    let mut slots: Vec<u32> = holders.iter().map(|h| h.grant().unwrap().slot).collect();
    slots.sort();
    ensure!(slots == [0, 1, 2], "slots {slots:?}");
    Ok(())
}

async fn fences_strictly_increase(store: Arc<dyn LeaseStore>) -> Result<()> {
    let name = unique("fence");
    let mut last = 0;
    for round in 0..6 {
        let lease = Lease::exclusive(store.clone(), name.clone(), Duration::from_millis(150));
        ensure!(
            lease.acquire(false, None).await?,
            "round {round}: not acquired"
        );
        let fence = lease.fence().context("no fence")?;
        ensure!(fence > last, "round {round}: fence {fence} after {last}");
        last = fence;
        if round % 2 == 0 {
            ensure!(lease.release().await?);
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await; // let it run out
        }
    }
    // A semaphore's fences go up across its slots too.
    let name = unique("fence-semaphore");
    let mut last = 0;
    for round in 0..4 {
        let slot = Lease::semaphore(store.clone(), name.clone(), 2, LONG);
        ensure!(slot.acquire(false, None).await?);
        let fence = slot.fence().context("no fence")?;
        ensure!(
            fence > last,
            "semaphore round {round}: fence {fence} after {last}"
        );
        last = fence;
        // The first keeps its slot: later ones take the other slot in turn.
        if round > 0 {
            ensure!(slot.release().await?);
        }
    }
    Ok(())
}

async fn refresh_and_release_after_expiry_are_refused(store: Arc<dyn LeaseStore>) -> Result<()> {
    for kind in [LeaseKind::Exclusive, LeaseKind::Semaphore { slots: 2 }] {
        let name = unique("expiry");
        let ttl = Duration::from_millis(200);
        let lease = match kind {
            LeaseKind::Exclusive => Lease::exclusive(store.clone(), name.clone(), ttl),
            LeaseKind::Semaphore { slots } => {
                Lease::semaphore(store.clone(), name.clone(), slots, ttl)
            }
        };
        ensure!(lease.acquire(false, None).await?);
        ensure!(
            lease.refresh(None).await?,
            "{kind:?}: a live lease refreshes"
        );
        tokio::time::sleep(Duration::from_millis(350)).await;
        // Nobody else took it, and still the old holder can neither refresh nor release.
        ensure!(
            !lease.refresh(None).await?,
            "{kind:?}: refreshed after expiry"
        );
        ensure!(!lease.release().await?, "{kind:?}: released after expiry");
        ensure!(
            store.holders(kind, &name).await?.is_empty(),
            "{kind:?}: still listed"
        );
        // refresh(ttl) extends from now.
        ensure!(lease.acquire(false, None).await?);
        ensure!(lease.refresh(Some(Duration::from_secs(5))).await?);
        let left = lease.grant().context("no grant")?.expires_in;
        ensure!(
            left > Duration::from_secs(4),
            "{kind:?}: {left:?} left after refresh(5 s)"
        );
        ensure!(lease.release().await?);
        ensure!(!lease.release().await?, "{kind:?}: released twice");
    }
    Ok(())
}

async fn a_wrong_token_is_refused(store: Arc<dyn LeaseStore>) -> Result<()> {
    for kind in [LeaseKind::Exclusive, LeaseKind::Semaphore { slots: 1 }] {
        let name = unique("token");
        let holder = Lease::exclusive(store.clone(), name.clone(), LONG);
        let holder = match kind {
            LeaseKind::Exclusive => holder,
            LeaseKind::Semaphore { slots } => {
                Lease::semaphore(store.clone(), name.clone(), slots, LONG)
            }
        };
        ensure!(holder.acquire(false, None).await?);
        let stranger = LeaseToken::random();
        ensure!(
            store
                .refresh_kind(kind, &name, &stranger, None)
                .await?
                .is_none()
        );
        ensure!(!store.release_kind(kind, &name, &stranger).await?);
        let held = store.holders(kind, &name).await?;
        ensure!(
            held.len() == 1 && held[0].token == holder.token(),
            "{kind:?}: holder lost"
        );
        ensure!(holder.release().await?);
    }
    Ok(())
}

async fn a_blocking_wait_returns_within_wait_plus_one_backoff(
    store: Arc<dyn LeaseStore>,
) -> Result<()> {
    let name = unique("wait");
    let holder = Lease::exclusive(store.clone(), name.clone(), LONG);
    ensure!(holder.acquire(false, None).await?);
    let waiter = Lease::exclusive(store.clone(), name.clone(), LONG);
    let wait = Duration::from_millis(400);
    let started = Instant::now();
    ensure!(!waiter.acquire(true, Some(wait)).await?, "got a held lease");
    let took = started.elapsed();
    ensure!(
        took >= wait,
        "gave up after {took:?}, before its wait of {wait:?}"
    );
    // One back-off, plus the time of one attempt at the backend.
    ensure!(
        took <= wait + MAX_BACKOFF + Duration::from_millis(500),
        "took {took:?} for a wait of {wait:?}"
    );
    // Non-blocking: one attempt, at once.
    let started = Instant::now();
    ensure!(!waiter.acquire(false, None).await?);
    ensure!(started.elapsed() < Duration::from_millis(500));
    // Blocking gets it once the holder lets go.
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        holder.release().await
    });
    ensure!(waiter.acquire(true, Some(Duration::from_secs(10))).await?);
    ensure!(releaser.await??);
    ensure!(waiter.release().await?);
    Ok(())
}

async fn an_owner_token_reacquires_its_own_lease(store: Arc<dyn LeaseStore>) -> Result<()> {
    for kind in [LeaseKind::Exclusive, LeaseKind::Semaphore { slots: 1 }] {
        let name = unique("owner");
        let make = |token: Option<LeaseToken>| {
            let lease = match kind {
                LeaseKind::Exclusive => Lease::exclusive(store.clone(), name.clone(), LONG),
                LeaseKind::Semaphore { slots } => {
                    Lease::semaphore(store.clone(), name.clone(), slots, LONG)
                }
            };
            match token {
                Some(token) => lease.with_owner_token(token).with_owner("importer"),
                None => lease.with_owner("someone else"),
            }
        };
        let first = make(None).with_owner("importer");
        ensure!(first.acquire(false, None).await?);
        let fence = first.fence().context("no fence")?;
        // The same job, retried in a new process with the token it kept: its own lease back.
        let retry = make(Some(first.token()));
        ensure!(
            retry.acquire(false, None).await?,
            "{kind:?}: the retry was refused"
        );
        ensure!(
            retry.fence() == Some(fence),
            "{kind:?}: the retry got a new fence"
        );
        let other = make(None);
        ensure!(
            !other.acquire(false, None).await?,
            "{kind:?}: someone else got it"
        );
        ensure!(retry.release().await?);
        ensure!(!first.release().await?, "{kind:?}: released twice");
    }
    Ok(())
}

/// An acquire with the holder's token renews its lease and replaces its owner text in one
/// write, same token and fence: what a record kept as a lease's owner text (the station's
/// ledger of duties) is rewritten without a moment when it is not there.
async fn a_holders_acquire_rewrites_its_owner_text_in_place(
    store: Arc<dyn LeaseStore>,
) -> Result<()> {
    for kind in [LeaseKind::Exclusive, LeaseKind::Semaphore { slots: 1 }] {
        let name = unique("rewrite");
        let first = match store
            .try_acquire_kind(
                kind,
                &name,
                AcquireRequest::new("version 1".to_owned(), LONG),
            )
            .await?
        {
            Acquisition::Taken(grant) => grant,
            other => anyhow::bail!("{kind:?}: not taken: {other:?}"),
        };
        let again =
            AcquireRequest::new("version 2".to_owned(), LONG).with_retry_token(first.token.clone());
        let second = match store.try_acquire_kind(kind, &name, again).await? {
            Acquisition::Renewed(grant) => grant,
            other => anyhow::bail!("{kind:?}: not renewed: {other:?}"),
        };
        ensure!(
            (second.owner.as_str(), second.fence, &second.token)
                == ("version 2", first.fence, &first.token),
            "{kind:?}: {second:?}"
        );
        let held = store.holders(kind, &name).await?;
        ensure!(
            held.len() == 1 && held[0].owner == "version 2",
            "{kind:?}: the store keeps {held:?}"
        );
        ensure!(store.release_kind(kind, &name, &first.token).await?);
    }
    Ok(())
}

async fn a_guard_acquires_and_releases(store: Arc<dyn LeaseStore>) -> Result<()> {
    let name = unique("guard");
    let guard = Lease::exclusive(store.clone(), name.clone(), LONG)
        .guard(false, None)
        .await?;
    let refused = Lease::exclusive(store.clone(), name.clone(), LONG)
        .guard(false, None)
        .await;
    ensure!(
        matches!(refused, Err(LeaseGuardError::LeaseNotAcquired { .. })),
        "{refused:?}"
    );
    ensure!(guard.release().await?);
    // Dropped: released in the background.
    let dropped = Lease::exclusive(store.clone(), name.clone(), LONG)
        .guard(false, None)
        .await?;
    drop(dropped);
    let next = Lease::exclusive(store.clone(), name.clone(), LONG);
    ensure!(
        next.acquire(true, Some(Duration::from_secs(5))).await?,
        "a dropped guard did not release"
    );
    ensure!(next.release().await?);
    Ok(())
}

async fn a_semaphores_capacity_is_fixed_while_it_has_holders(
    store: Arc<dyn LeaseStore>,
) -> Result<()> {
    let name = unique("capacity");
    let first = Lease::semaphore(store.clone(), name.clone(), 1, LONG).with_owner("one slot");
    ensure!(first.acquire(false, None).await?);
    // Asking for more slots does not make more: it is a clear error naming the capacity.
    let greedy = Lease::semaphore(store.clone(), name.clone(), 1000, LONG).with_owner("greedy");
    let conflict = |answer: &Result<bool, station_lease::LeaseStoreError>, in_force: u32| matches!(answer, Err(error) if error.to_string().contains(&format!("has {in_force} slots")));
    let answer = greedy.acquire(false, None).await;
    ensure!(
        conflict(&answer, 1),
        "slots=1000 on a semaphore of 1 slot held: {answer:?}"
    );
    ensure!(greedy.fence().is_none(), "believed held");
    let held = store
        .holders(LeaseKind::Semaphore { slots: 1 }, &name)
        .await?;
    ensure!(
        held.len() == 1,
        "{} holders of a one-slot semaphore",
        held.len()
    );
    // A blocking acquire ends at once: waiting cannot change the answer while it is held.
    let started = Instant::now();
    let answer = greedy.acquire(true, Some(LONG)).await;
    ensure!(conflict(&answer, 1), "{answer:?}");
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "waited on a conflict"
    );
    // The same capacity is refused as full, not as a conflict.
    let same = Lease::semaphore(store.clone(), name.clone(), 1, LONG);
    ensure!(!same.acquire(false, None).await?, "two holders of one slot");
    // Once nobody holds it, the next holder sets the capacity anew.
    ensure!(first.release().await?);
    ensure!(
        greedy.acquire(false, None).await?,
        "a free semaphore refused"
    );
    let answer = first.acquire(false, None).await;
    ensure!(
        conflict(&answer, 1000),
        "slots=1 while 1000 are in force: {answer:?}"
    );
    ensure!(greedy.release().await?);
    Ok(())
}

async fn a_chosen_token_only_gets_back_the_lease_it_holds(
    store: Arc<dyn LeaseStore>,
) -> Result<()> {
    for kind in [LeaseKind::Exclusive, LeaseKind::Semaphore { slots: 1 }] {
        let name = unique("chosen");
        let make = |owner: &str| {
            match kind {
                LeaseKind::Exclusive => Lease::exclusive(store.clone(), name.clone(), LONG),
                LeaseKind::Semaphore { slots } => {
                    Lease::semaphore(store.clone(), name.clone(), slots, LONG)
                }
            }
            .with_owner(owner)
        };
        // A weak token on a free name: the lease is taken, with a token of the store's own.
        let first = make("first").with_owner_token(LeaseToken::from_text("1"));
        ensure!(first.acquire(false, None).await?, "{kind:?}: not taken");
        let grant = first.grant().context("no grant")?;
        ensure!(
            grant.token != LeaseToken::from_text("1"),
            "{kind:?}: the lease was given the client's token \"1\""
        );
        ensure!(
            grant.token.as_str().len() == 32
                && grant.token.as_str().bytes().all(|b| b.is_ascii_hexdigit()),
            "{kind:?}: the token is not 128 random bits in hex"
        );
        // A second client guessing "1" gets nothing: not the lease, no refresh, no release.
        let guesser = make("guesser").with_owner_token(LeaseToken::from_text("1"));
        ensure!(
            !guesser.acquire(false, None).await?,
            "{kind:?}: a guessed token got the lease"
        );
        let guessed = LeaseToken::from_text("1");
        ensure!(
            store
                .refresh_kind(kind, &name, &guessed, None)
                .await?
                .is_none()
        );
        ensure!(!store.release_kind(kind, &name, &guessed).await?);
        // The token the store gave gets its own lease back, same fence.
        let retry = make("first").with_owner_token(grant.token.clone());
        ensure!(
            retry.acquire(false, None).await?,
            "{kind:?}: the retry was refused"
        );
        ensure!(
            retry.fence() == Some(grant.fence),
            "{kind:?}: the retry got a new fence"
        );
        ensure!(retry.release().await?);
    }
    Ok(())
}

/// One test per behaviour for a backend.
macro_rules! behaviour_suite {
    ($backend:ident, $open:path) => {
        mod $backend {
            use super::*;

            async fn run<F, Fut>(behaviour: F)
            where
                F: FnOnce(Arc<dyn LeaseStore>) -> Fut,
                Fut: std::future::Future<Output = Result<()>>,
            {
                behaviour($open().await).await.unwrap();
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mutual_exclusion_under_32_acquirers() {
                run(super::mutual_exclusion_under_32_acquirers).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_semaphore_never_has_more_than_n_holders() {
                run(super::a_semaphore_never_has_more_than_n_holders).await;
            }

            #[tokio::test]
            async fn fences_strictly_increase() {
                run(super::fences_strictly_increase).await;
            }

            #[tokio::test]
            async fn refresh_and_release_after_expiry_are_refused() {
                run(super::refresh_and_release_after_expiry_are_refused).await;
            }

            #[tokio::test]
            async fn a_wrong_token_is_refused() {
                run(super::a_wrong_token_is_refused).await;
            }

            #[tokio::test]
            async fn a_blocking_wait_returns_within_wait_plus_one_backoff() {
                run(super::a_blocking_wait_returns_within_wait_plus_one_backoff).await;
            }

            #[tokio::test]
            async fn an_owner_token_reacquires_its_own_lease() {
                run(super::an_owner_token_reacquires_its_own_lease).await;
            }

            #[tokio::test]
            async fn a_semaphores_capacity_is_fixed_while_it_has_holders() {
                run(super::a_semaphores_capacity_is_fixed_while_it_has_holders).await;
            }

            #[tokio::test]
            async fn a_chosen_token_only_gets_back_the_lease_it_holds() {
                run(super::a_chosen_token_only_gets_back_the_lease_it_holds).await;
            }

            #[tokio::test]
            async fn a_guard_acquires_and_releases() {
                run(super::a_guard_acquires_and_releases).await;
            }

            #[tokio::test]
            async fn a_holders_acquire_rewrites_its_owner_text_in_place() {
                run(super::a_holders_acquire_rewrites_its_owner_text_in_place).await;
            }
        }
    };
}

behaviour_suite!(memory, open_memory);
behaviour_suite!(sqlite, open_sqlite);
behaviour_suite!(postgres, open_postgres);
behaviour_suite!(redis, open_redis);

// ---------------------------------------------------------------------------------------------
// Faults.

/// A private directory in the temp directory, removed when dropped.
struct PrivateDir(std::path::PathBuf);

impl PrivateDir {
    fn new(what: &str) -> PrivateDir {
        let path = std::env::temp_dir().join(format!(
            "station-lease-{what}-{}",
            &LeaseToken::random().as_str()[..12]
        ));
        std::fs::create_dir(&path).expect("a private directory in the temp directory");
        PrivateDir(path)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn redis_unreachable_is_an_error_never_held() -> Result<()> {
    // A unix socket nobody listens on: unreachable for certain, unlike a TCP port let go.
    let dir = PrivateDir::new("no-redis");
    let url = format!("redis+unix://{}", dir.0.join("redis.sock").display());
    let store: Arc<dyn LeaseStore> = Arc::new(RedisLeaseStore::new(&url)?);
    let lease = Lease::exclusive(store.clone(), unique("down"), LONG);
    ensure!(
        lease.acquire(false, None).await.is_err(),
        "acquired on no Redis"
    );
    ensure!(lease.fence().is_none(), "believed held");
    ensure!(
        lease
            .acquire(true, Some(Duration::from_millis(300)))
            .await
            .is_err()
    );
    ensure!(lease.refresh(None).await.is_err());
    ensure!(lease.release().await.is_err());
    ensure!(store.holders(LeaseKind::Exclusive, "x").await.is_err());
    let guard = Lease::exclusive(store, unique("down"), LONG)
        .guard(false, None)
        .await;
    ensure!(matches!(guard, Err(LeaseGuardError::Store(_))), "{guard:?}");
    Ok(())
}

/// A private `redis-server` (no persistence, no TCP) on a unix socket in its own directory,
/// killed when dropped. A restart listens on the same socket, which no other process can take.
struct PrivateRedis {
    child: tokio::process::Child,
    socket: std::path::PathBuf,
}

impl PrivateRedis {
    /// Starts one on `socket` and waits (at most 10 s) for its "ready to accept connections".
    async fn start(socket: &std::path::Path) -> PrivateRedis {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocket",
            ])
            .arg(socket)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "redis-server cannot be started ({error}): the Redis fault tests run their \
                     own private one; install it (apt-get install redis-server) or run \
                     `bash tests/run-all.sh`"
                )
            });
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await? {
                if line
                    .to_ascii_lowercase()
                    .contains("ready to accept connections")
                {
                    return Ok(true);
                }
            }
            Ok::<bool, std::io::Error>(false)
        })
        .await;
        assert!(
            matches!(ready, Ok(Ok(true))),
            "redis-server on {} did not say it was ready within 10 s: {ready:?}",
            socket.display()
        );
        // Keep reading its log, so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        PrivateRedis {
            child,
            socket: socket.to_owned(),
        }
    }

    fn url(&self) -> String {
        format!("redis+unix://{}", self.socket.display())
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("redis-server is running");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Kills it and waits until it has exited.
    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

#[tokio::test]
async fn redis_paused_is_an_error_and_a_restart_without_data_keeps_fences_rising() -> Result<()> {
    let dir = PrivateDir::new("redis");
    let socket = dir.0.join("redis.sock");
    let server = PrivateRedis::start(&socket).await;
    let store: Arc<dyn LeaseStore> = Arc::new(RedisLeaseStore::new(&server.url())?);
    let name = unique("restart");
    let mut last = 0;
    for _ in 0..3 {
        let lease = Lease::exclusive(store.clone(), name.clone(), LONG);
        ensure!(lease.acquire(false, None).await?);
        last = lease.fence().context("no fence")?;
        ensure!(lease.release().await?);
    }
    // Paused: answers time out; nothing is reported held.
    server.signal("-STOP");
    let paused = Lease::exclusive(store.clone(), name.clone(), LONG);
    let started = Instant::now();
    let answer = paused.acquire(false, None).await;
    server.signal("-CONT");
    ensure!(answer.is_err(), "acquired on a paused Redis: {answer:?}");
    ensure!(paused.fence().is_none());
    ensure!(started.elapsed() < Duration::from_secs(5));
    // Restarted without its data, on the same socket: the fence counter is gone, yet the next
    // fence is higher.
    server.stop().await;
    let server = PrivateRedis::start(&socket).await;
    let lease = Lease::exclusive(store.clone(), name.clone(), LONG);
    // The first call may meet the connection the restart broke; the store then drops it, and
    // the next call connects anew.
    let mut answers = Vec::new();
    for _ in 0..3 {
        let answer = lease.acquire(false, None).await;
        let acquired = matches!(answer, Ok(true));
        answers.push(answer);
        if acquired {
            break;
        }
    }
    ensure!(
        matches!(answers.last(), Some(Ok(true))),
        "not acquired after the restart: {answers:?}"
    );
    let fence = lease.fence().context("no fence")?;
    ensure!(
        fence > last,
        "fence went from {last} to {fence} across a Redis restart"
    );
    server.stop().await;
    Ok(())
}

#[tokio::test]
async fn an_sqlite_file_from_before_semaphore_capacities_is_completed_and_keeps_its_fences()
-> Result<()> {
    let path = sqlite_path();
    let older = rusqlite::Connection::open(&path)?;
    older.execute_batch(
        "CREATE TABLE sm_lease (
            name TEXT NOT NULL, slot INTEGER NOT NULL, holder TEXT NOT NULL DEFAULT '',
            owner TEXT NOT NULL DEFAULT '', fence INTEGER NOT NULL DEFAULT 0,
            expires_at INTEGER NOT NULL DEFAULT 0, ttl_ms INTEGER NOT NULL DEFAULT 0,
            since_ms INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (name, slot));
         INSERT INTO sm_lease (name, slot, fence) VALUES ('test:older', 0, 41);",
    )?;
    drop(older);
    let store = BackendUrl::parse(&format!("sqlite:{}", path.display()))?
        .open()
        .await?;
    let lease = Lease::exclusive(store.clone(), "test:older", LONG);
    ensure!(lease.acquire(false, None).await?);
    ensure!(
        lease.fence() == Some(42),
        "fence {:?} after 41",
        lease.fence()
    );
    let slot = Lease::semaphore(store.clone(), "test:older-semaphore", 2, LONG);
    ensure!(slot.acquire(false, None).await?);
    let greedy = Lease::semaphore(store, "test:older-semaphore", 3, LONG);
    ensure!(
        greedy.acquire(false, None).await.is_err(),
        "capacity not kept"
    );
    let _ = std::fs::remove_file(&path);
    Ok(())
}

#[tokio::test]
async fn sqlite_locked_past_busy_timeout_is_an_error() -> Result<()> {
    let path = sqlite_path();
    let url = format!("sqlite:{}?busy_timeout_ms=200", path.display());
    let store = BackendUrl::parse(&url)?.open().await?;
    let name = unique("locked");
    let lease = Lease::exclusive(store.clone(), name.clone(), LONG);
    ensure!(lease.acquire(false, None).await?);
    let blocker = rusqlite::Connection::open(&path)?;
    blocker.execute_batch("BEGIN EXCLUSIVE")?;
    let started = Instant::now();
    let other = Lease::exclusive(store.clone(), name.clone(), LONG);
    let answer = other.acquire(false, None).await;
    ensure!(
        answer.is_err(),
        "answered through an exclusive lock: {answer:?}"
    );
    ensure!(
        started.elapsed() >= Duration::from_millis(200),
        "did not wait for busy_timeout"
    );
    ensure!(
        lease.refresh(None).await.is_err(),
        "refreshed through an exclusive lock"
    );
    blocker.execute_batch("COMMIT")?;
    // Unlocked: the holder still holds it.
    ensure!(lease.refresh(None).await?);
    ensure!(!other.acquire(false, None).await?);
    // Fences live in the file: a new store on it carries on.
    let fence = lease.fence().context("no fence")?;
    ensure!(lease.release().await?);
    let reopened = BackendUrl::parse(&url)?.open().await?;
    let again = Lease::exclusive(reopened, name, LONG);
    ensure!(again.acquire(false, None).await?);
    ensure!(
        again.fence() > Some(fence),
        "fence reused after reopening the file"
    );
    let _ = std::fs::remove_file(&path);
    Ok(())
}

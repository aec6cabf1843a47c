//! One seed's world: the simulated station, the lease store, one or two gateways (an owner
//! and its standby), the clients and the faults, all on one current-thread runtime with paused
//! time, every choice drawn from one seeded random number generator.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use station_core::lease::control::SafeStopState;
use station_core::station::ChangeOutcome;
use station_simulator::{Profile, Simulator, SimulatorHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::assembly::{self, GatewayStart, Refusal, SimGateway};
use crate::invariants::{Checker, Records, SafeStopRecord, Tenure, WriteAnswer, WriteIntent};
use crate::naming::{Naming, StationNames};
use crate::pipe::LineControl;
use crate::store::SimStore;
use crate::trace::Trace;

mod clients;
mod faults;
mod scenarios;
use clients::*;
use faults::*;
use scenarios::Mix;

pub use crate::rng::SimRng;

/// How one seed is run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub seed: u64,
    /// Simulated time with faults; the heal and the final checks come after it.
    pub faulty_for: Duration,
    /// Print the trace as it is written.
    pub echo: bool,
    /// The hole put back (`--reintroduce NAME`), if any.
    pub reintroduce: Option<String>,
}

/// What one seed did.
pub struct SeedOutcome {
    pub seed: u64,
    pub failure: Option<String>,
    pub trace: String,
    pub simulated: Duration,
}

/// The longest any request of a client may stay unanswered, faults or not (invariant 6).
const ANSWER_LIMIT: Duration = Duration::from_secs(130);
/// After the faults heal, a waiting acquirer is served within the lease's TTL, the
/// lock-delay, the link-owner lease's TTL and lock-delay, and this.
const SERVED_AFTER_HEAL: Duration = Duration::from_secs(45);

/// Runs `options.seed` to its end on a runtime of its own.
pub fn run(options: RunOptions) -> SeedOutcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let seed = options.seed;
    let state_dir = std::env::temp_dir().join(format!(
        "station-dst-{}-{seed}-{}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::create_dir_all(&state_dir);
    let outcome = runtime.block_on(async {
        let world = World::new(&options, state_dir.clone()).await;
        world.run().await
    });
    drop(runtime);
    let _ = std::fs::remove_dir_all(&state_dir);
    outcome
}

static NEXT_DIR: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

struct World {
    options: RunOptions,
    rng: SimRng,
    trace: Trace,
    sim: SimulatorHandle,
    store: Arc<SimStore>,
    gateways: Arc<Mutex<Vec<Slot>>>,
    records: Arc<Mutex<Records>>,
    state_dir: PathBuf,
    /// How this seed mixes its faults.
    mix: Mix,
    /// While set, the clients hold off (a scripted scenario runs alone).
    calm: std::sync::atomic::AtomicBool,
    /// Scripted faults still running on tasks of their own (a scenario waits for them).
    scripts: Arc<std::sync::atomic::AtomicUsize>,
    /// Set once a check failed: the world stops.
    failed: CancellationToken,
    failure: Arc<Mutex<Option<String>>>,
}

/// One gateway's place: its process now (none while it is down), how it is configured.
struct Slot {
    running: Option<Arc<SimGateway>>,
    standby: bool,
    /// How its configuration names the station.
    names: StationNames,
    line: LineControl,
    incarnation: u32,
    /// Every process it ran, for the audit trails (invariant 5).
    all: Vec<Arc<SimGateway>>,
}

impl World {
    async fn new(options: &RunOptions, state_dir: PathBuf) -> World {
        let rng: SimRng = Arc::new(Mutex::new(StdRng::seed_from_u64(options.seed)));
        let trace = Trace::new(options.echo);
        let sim = Simulator::in_process(Profile::default_station());
        let processing = Duration::from_millis(rng.lock().unwrap().gen_range(2..40));
        sim.set_processing_time(processing);
        // Half the stations carry a change out after its connection closed (serial lines).
        let ignores_close = rng.lock().unwrap().gen_bool(0.5);
        sim.set_ignores_close(ignores_close);
        let two = rng.lock().unwrap().gen_bool(0.5);
        let mix = Mix::of_seed(options.seed);
        let count = if two || mix.needs_two() { 2 } else { 1 };
        trace.note(format!(
            "seed {}: {count} gateway(s), station processing {} ms, ignores a close: {ignores_close}",
            options.seed,
            processing.as_millis()
        ));
        if mix != Mix::Usual {
            trace.note(format!("mix: {}", mix.words()));
        }
        let store = SimStore::new(count, rng.clone(), trace.clone());
        let naming = Naming::draw(options.seed, count);
        if naming.differs() {
            trace.note(format!(
                "gw1 names the station otherwise: {}",
                naming.of(1).describe()
            ));
            store.epochs_of_the_station_lease();
        }
        store.draw_clock_step(options.seed, options.faulty_for);
        let slots = (0..count)
            .map(|index| Slot {
                running: None,
                standby: naming.of(index).configured_standby(index),
                names: naming.of(index),
                line: LineControl::with_window(mix.window()),
                incarnation: 0,
                all: Vec::new(),
            })
            .collect();
        World {
            options: options.clone(),
            rng,
            trace,
            sim,
            store,
            gateways: Arc::new(Mutex::new(slots)),
            records: Arc::new(Mutex::new(Records::default())),
            state_dir,
            mix,
            calm: std::sync::atomic::AtomicBool::new(false),
            scripts: Arc::default(),
            failed: CancellationToken::new(),
            failure: Arc::new(Mutex::new(None)),
        }
    }

    fn draw<T: rand::distributions::uniform::SampleUniform + PartialOrd>(
        &self,
        range: std::ops::Range<T>,
    ) -> T {
        self.rng.lock().unwrap().gen_range(range)
    }

    async fn run(self) -> SeedOutcome {
        let world = Arc::new(self);
        let start = Instant::now();
        let count = world.gateways.lock().unwrap().len();
        for index in 0..count {
            restart_when_down(&world, index).await;
        }
        let clients = world.draw(2..4);
        let stop_clients = CancellationToken::new();
        let mut tasks = Vec::new();
        for client in 0..clients {
            tasks.push(tokio::spawn(client_life(
                world.clone(),
                client,
                stop_clients.clone(),
            )));
        }
        let checker = tokio::spawn(check_every_step(world.clone()));
        let faults = tokio::spawn(faults(world.clone()));
        tokio::select! {
            biased;
            _ = tokio::time::sleep(world.options.faulty_for) => {}
            _ = world.failed.cancelled() => {}
        }
        faults.abort();
        heal(&world).await;
        world.trace.note("heal: every fault ends");
        let healed_at = Instant::now();
        // Invariant 6: a waiting acquirer is served once the faults are healed.
        if !world.failed.is_cancelled() {
            let served = tokio::time::timeout(SERVED_AFTER_HEAL, final_acquirer(world.clone()));
            tokio::select! {
                biased;
                result = served => if result.is_err() {
                    fail(&world, format!(
                        "invariant 6: a waiting acquirer was not served within {} s after the faults healed",
                        SERVED_AFTER_HEAL.as_secs()
                    ));
                },
                _ = world.failed.cancelled() => {}
            }
        }
        stop_clients.cancel();
        for task in tasks {
            let limit = ANSWER_LIMIT.saturating_sub(healed_at.elapsed());
            if tokio::time::timeout(limit.max(Duration::from_secs(1)), task)
                .await
                .is_err()
            {
                fail(
                    &world,
                    "invariant 6: a client's request was left unanswered".into(),
                );
            }
        }
        // Whatever is still in doubt lands or lapses, and the read-backs run.
        tokio::time::sleep(Duration::from_secs(10)).await;
        checker.abort();
        check_now(&world, true);
        let simulated = start.elapsed();
        let failure = world.failure.lock().unwrap().clone();
        let gateways: Vec<_> = world
            .gateways
            .lock()
            .unwrap()
            .iter()
            .filter_map(|slot| slot.running.clone())
            .collect();
        for gateway in gateways {
            gateway.kill();
        }
        world.sim.shutdown();
        SeedOutcome {
            seed: world.options.seed,
            failure,
            trace: world.trace.text(),
            simulated,
        }
    }
}

fn fail(world: &World, why: String) {
    let mut failure = world.failure.lock().unwrap();
    if failure.is_none() {
        world.trace.note(format!("FAILED {why}"));
        *failure = Some(why);
    }
    world.failed.cancel();
}

/// Starts gateway `index` (again): as configured, or as a standby when another owns the link.
/// `false` when it could not start now.
async fn start_gateway(world: &Arc<World>, index: usize) -> bool {
    let (standby, line, incarnation, names) = {
        let mut slots = world.gateways.lock().unwrap();
        let slot = &mut slots[index];
        slot.incarnation += 1;
        (
            slot.standby,
            slot.line.clone(),
            slot.incarnation,
            slot.names.clone(),
        )
    };
    let setup = |standby| GatewayStart {
        index,
        incarnation,
        standby,
        store: world.store.view(index),
        sim: world.sim.clone(),
        line: line.clone(),
        state_file: world.state_dir.join(format!("gw{index}.state")),
        names: names.clone(),
    };
    let started = match assembly::start(setup(standby)).await {
        Ok(gateway) => Ok(gateway),
        // Its link-owner lease is another's now (a standby took over): it stands by.
        Err(_) if !standby => assembly::start(setup(true)).await,
        Err(why) => Err(why),
    };
    match started {
        Ok(gateway) => {
            let gateway = Arc::new(gateway);
            world.trace.note(format!(
                "gw{index}: started ({})",
                if gateway.ha.standing_by().is_some() {
                    "standby"
                } else {
                    "owner"
                }
            ));
            {
                let mut slots = world.gateways.lock().unwrap();
                slots[index].running = Some(gateway.clone());
                slots[index].all.push(gateway.clone());
            }
            tokio::spawn(exit_when_stopped_by_itself(world.clone(), gateway));
            true
        }
        Err(why) => {
            world.trace.note(format!(
                "gw{index}: cannot start now: {}",
                why.replace(&*world.state_dir.to_string_lossy(), "STATE")
            ));
            false
        }
    }
}

/// A gateway that stopped itself (it could no longer prove it owns the link) exits, as the
/// process does, and is started again a moment later, as its service manager does.
async fn exit_when_stopped_by_itself(world: Arc<World>, gateway: Arc<SimGateway>) {
    tokio::select! {
        biased;
        () = gateway.gone.cancelled() => return,
        () = gateway.shutdown.cancelled() => {}
    }
    let index = gateway.index;
    {
        let mut slots = world.gateways.lock().unwrap();
        if slots[index]
            .running
            .as_ref()
            .is_some_and(|running| Arc::ptr_eq(running, &gateway))
        {
            slots[index].running = None;
        }
    }
    world.trace.note(format!(
        "gw{index}: stopped by itself (link ownership lost), exits"
    ));
    gateway.kill();
    tokio::time::sleep(Duration::from_millis(world.draw(500..3_000))).await;
    restart_when_down(&world, index).await;
}

/// The gateways running now, in order.
fn running(world: &World) -> Vec<Arc<SimGateway>> {
    world
        .gateways
        .lock()
        .unwrap()
        .iter()
        .filter_map(|slot| slot.running.clone())
        .collect()
}

/// Runs `op` against `gateway` as a client's request: answered `None` when the gateway's
/// process went away meanwhile (the connection dropped) or the client hung up after `patience`.
async fn request<T>(
    gateway: &SimGateway,
    patience: Option<Duration>,
    op: impl Future<Output = T>,
) -> Option<T> {
    let limit = patience.unwrap_or(ANSWER_LIMIT);
    tokio::select! {
        biased;
        result = tokio::time::timeout(limit, op) => result.ok(),
        _ = gateway.gone.cancelled() => None,
    }
}

/// After the heal: one acquirer waits in line until it gets the lease (invariant 6).
async fn final_acquirer(world: Arc<World>) {
    loop {
        // Where the station is served: a gateway whose link stands by (a standby, or one that
        // names the station otherwise while the other serves it) answers 503 naming the other.
        for gateway in running(&world)
            .into_iter()
            .filter(|g| g.serves_the_station())
        {
            let answer = request(
                &gateway,
                None,
                gateway.acquire(
                    "final acquirer",
                    Duration::from_secs(5),
                    None,
                    Duration::from_secs(10),
                ),
            )
            .await;
            if let Some(Ok(answer)) = answer {
                world.trace.note(format!(
                    "final acquirer: holds the lease, fence {}",
                    answer.fence
                ));
                let _ = gateway.release(&answer.lease_id).await;
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Checks the invariants against the station's log every few simulated milliseconds.
async fn check_every_step(world: Arc<World>) {
    loop {
        tokio::time::sleep(Duration::from_millis(25)).await;
        check_now(&world, false);
    }
}

fn check_now(world: &World, last: bool) {
    let log = world.sim.write_log();
    let audits: Vec<_> = world
        .gateways
        .lock()
        .unwrap()
        .iter()
        .flat_map(|slot| slot.all.iter().map(|g| (g.index, g.runtime.audit.clone())))
        .collect();
    let records = world.records.lock().unwrap();
    let checker = Checker {
        log: &log,
        records: &records,
        epochs: world.store.owner_epochs(),
        start: world.trace.start(),
        now: Instant::now(),
        last,
        audits: &audits,
    };
    if let Err(why) = checker.check() {
        drop(records);
        fail(world, why);
    }
}

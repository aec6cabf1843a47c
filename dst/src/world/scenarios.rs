//! The seed's mix of faults, and the scripted scenarios some mixes play between their random
//! faults. Most seeds draw every fault family at random; the others (chosen from the seed
//! alone, never from the hole put back) lean on one family that the random mix reaches too
//! rarely, each scenario something a lab really produces: several scripts at once on a
//! station that takes one request at a time, an owner cut off from the store while the station
//! is slow over its writes, and a station that carries a change out later than it promised
//! while its gateway restarts or hands over.

use std::sync::atomic::Ordering;

use super::*;

/// How a seed mixes its faults: odd seeds the usual way (drawing exactly what they drew before
/// the mixes existed, so that a seed once printed still replays), even seeds one of the others,
/// drawn from the seed alone by a generator of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mix {
    /// Every fault family at random.
    Usual,
    /// The station takes one request at a time (a serial line), and now and then several
    /// clients change it at once while another takes the lease.
    OneAtATime,
    /// Two gateways; now and then the owner is cut off from the store while the station takes
    /// seconds over each of its writes, and the standby takes over.
    OwnerCutOff,
    /// Now and then the station carries a lease-less change out after `max_processing_ms`
    /// (by less than the lock-delay), and its gateway stops, is killed or hands over while
    /// the lock-delay that follows runs.
    LateStation,
}

impl Mix {
    /// The mix of `seed`.
    pub(super) fn of_seed(seed: u64) -> Mix {
        if seed % 2 == 1 {
            return Mix::Usual;
        }
        let mut own = StdRng::seed_from_u64(seed ^ 0x6d69_7865_735f_6f66);
        match own.gen_range(0..3u32) {
            0 => Mix::OneAtATime,
            1 => Mix::OwnerCutOff,
            _ => Mix::LateStation,
        }
    }

    /// The station's window on every line (0: the usual).
    pub(super) fn window(self) -> u16 {
        match self {
            Mix::OneAtATime => 1,
            _ => 0,
        }
    }

    /// Whether the seed runs two gateways whatever it draws.
    pub(super) fn needs_two(self) -> bool {
        self == Mix::OwnerCutOff
    }

    pub(super) fn words(self) -> &'static str {
        match self {
            Mix::Usual => "usual",
            Mix::OneAtATime => "one request at a time, several clients at once",
            Mix::OwnerCutOff => "the owner cut off from the store while the station is slow",
            Mix::LateStation => "a station later than its max_processing_ms over a restart",
        }
    }
}

/// The scripted clients of the scenarios below.
const BURST_WRITER: usize = 9;
const SECOND_WRITER: usize = 10;
const NEXT_HOLDER: usize = 11;

/// Plays the seed's scenario once, if its mix has one (the random faults wait meanwhile).
pub(super) async fn play(world: &Arc<World>) {
    match world.mix {
        Mix::Usual => {}
        Mix::OneAtATime => several_at_once(world).await,
        Mix::OwnerCutOff => owner_cut_off(world).await,
        Mix::LateStation => late_past_its_contract(world).await,
    }
}

/// The clients hold off and the faults end, until a scenario is over: what it tests is then
/// the only thing happening. Waits (12 s at most) until no scripted fault runs any more,
/// nothing is at the station, and a gateway serves firmly with its lease at rest.
async fn calm(world: &World) {
    world.calm.store(true, Ordering::SeqCst);
    world.store.heal();
    world.sim.set_stall(false);
    for slot in world.gateways.lock().unwrap().iter() {
        slot.line.set_held(false);
    }
    world
        .sim
        .set_processing_time(Duration::from_millis(world.draw(2..40)));
    for _ in 0..1_200 {
        if world.scripts.load(Ordering::SeqCst) == 0
            && world.sim.requests_in_progress() == 0
            && serving(world).is_some_and(|g| at_rest(&g))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(world.draw(100..600))).await;
}

/// Nobody holds `gateway`'s lease, nothing is owed and no lock-delay runs.
fn at_rest(gateway: &SimGateway) -> bool {
    let view = gateway.runtime.lease.view();
    !view.held && view.owner.is_none() && view.safe_state.is_none() && view.lock_delay_ms.is_none()
}

/// Whether `client`'s last write reached the station (within 50 ms: it took the delay armed
/// for it): `false` when it was answered first (refused), so that the delay is taken back.
/// (`since`: how many writes the records held before it was sent.)
async fn reached_the_station(world: &World, client: usize, since: usize) -> bool {
    let until = Instant::now() + Duration::from_millis(50);
    loop {
        let pending = world.records.lock().unwrap().writes[since..]
            .iter()
            .find(|w| w.client == client)
            .is_none_or(|w| matches!(w.answer, WriteAnswer::Pending));
        if !pending {
            break;
        }
        // The delay armed for it was taken by a write at the station: another request in
        // progress there (a HELLO after a reconnection) says nothing of this one.
        if world.sim.requests_in_progress() > 0 && !world.sim.write_delay_armed() {
            return true;
        }
        if Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    world
        .sim
        .delay_next_write_to(assembly::SETPOINT, Duration::ZERO);
    false
}

fn calm_over(world: &World) {
    world.calm.store(false, Ordering::SeqCst);
}

/// The gateway that serves the station now (the owner), if one runs and has proved it owns
/// the link lately (its gate stays open another 2.5 s at least: it is not about to lose it).
fn serving(world: &World) -> Option<Arc<SimGateway>> {
    let firmly = Instant::now() + Duration::from_millis(2_500);
    running(world).into_iter().find(|g| {
        g.ha.standing_by().is_none()
            && g.runtime
                .link_gate
                .as_ref()
                .is_none_or(|gate| gate.until().is_some_and(|until| until > firmly))
    })
}

/// Holds a scripted lease a while, then releases it.
async fn hold_then_release(world: &World, gateway: &SimGateway, held: (String, u64, usize)) {
    let (token, fence, tenure) = held;
    tokio::time::sleep(Duration::from_millis(world.draw(1_000..2_500))).await;
    world.records.lock().unwrap().tenures[tenure].end_asked(Instant::now());
    world
        .trace
        .note(format!("client{NEXT_HOLDER}: release fence {fence}"));
    if let Some(Ok(())) = request(gateway, None, gateway.release(&token)).await {
        world.records.lock().unwrap().tenures[tenure].released = true;
    }
}

/// Several scripts at once on a station that takes one request at a time: one writes without
/// a lease and the station takes a while over it, another writes without a lease behind it
/// (queued at the link), and a third takes the lease meanwhile. The queued change was admitted
/// while nobody held the lease: it must not reach the station inside the new holder's lease.
async fn several_at_once(world: &Arc<World>) {
    calm(world).await;
    if let Some(gateway) = serving(world).filter(|g| at_rest(g)) {
        let slow = Duration::from_millis(world.draw(200..900));
        world.trace.note(format!(
            "scenario: at {}, a change the station takes {} ms more over, another queued behind it, and an acquirer meanwhile",
            gateway.name,
            slow.as_millis()
        ));
        world.sim.delay_next_write_to(assembly::SETPOINT, slow);
        let since = world.records.lock().unwrap().writes.len();
        let first = {
            let (world, gateway) = (world.clone(), gateway.clone());
            tokio::spawn(async move {
                let name = format!("client{BURST_WRITER}");
                write(&world, &name, BURST_WRITER, &gateway, None, None).await;
            })
        };
        if reached_the_station(world, BURST_WRITER, since).await {
            tokio::time::sleep(Duration::from_millis(world.draw(1..80))).await;
            let second = {
                let (world, gateway) = (world.clone(), gateway.clone());
                tokio::spawn(async move {
                    let name = format!("client{SECOND_WRITER}");
                    write(&world, &name, SECOND_WRITER, &gateway, None, None).await;
                })
            };
            tokio::time::sleep(Duration::from_millis(world.draw(1..80))).await;
            let ttl = Duration::from_millis(world.draw(2_000..4_000));
            if let Some(held) = scripted_acquire(world, NEXT_HOLDER, &gateway, ttl).await {
                hold_then_release(world, &gateway, held).await;
            }
            let _ = second.await;
        }
        let _ = first.await;
    }
    calm_over(world);
}

/// The owner cut off from the store while the station takes seconds over each of its writes
/// (within `max_processing_ms`, at a station that carries a change out after its connection
/// closed): its link must stop sending before the standby may take over, so that none of its
/// writes lands after the new owner's first.
async fn owner_cut_off(world: &Arc<World>) {
    calm(world).await;
    let (owner, standby) = {
        let gateways = running(world);
        let owner = gateways
            .iter()
            .find(|g| g.ha.standing_by().is_none())
            .cloned();
        let standby = gateways
            .iter()
            .find(|g| g.ha.standing_by().is_some())
            .cloned();
        (owner, standby)
    };
    let (Some(owner), Some(standby)) = (owner, standby) else {
        calm_over(world);
        return;
    };
    let index = owner.index;
    world.trace.note(format!(
        "scenario: {} cut off from the store while the station takes seconds over each of its writes; {} stands by",
        owner.name, standby.name
    ));
    world.sim.set_ignores_close(true);
    world.store.set_faults(|f| f.partitioned[index] = true);
    let until = Instant::now() + Duration::from_secs(15);
    let old = {
        let (world, owner) = (world.clone(), owner.clone());
        tokio::spawn(async move {
            let mut writes = Vec::new();
            let name = format!("client{BURST_WRITER}");
            while Instant::now() < until && !owner.gone.is_cancelled() {
                // With the 2 to 40 ms of processing, under the 4 s max_processing_ms.
                let slow = Duration::from_millis(world.draw(2_000..3_900));
                world.sim.delay_next_write_to(assembly::SETPOINT, slow);
                let (at, owner, name) = (world.clone(), owner.clone(), name.clone());
                writes.push(tokio::spawn(async move {
                    write(&at, &name, BURST_WRITER, &owner, None, None).await;
                }));
                tokio::time::sleep(Duration::from_millis(world.draw(100..400))).await;
            }
            world
                .sim
                .delay_next_write_to(assembly::SETPOINT, Duration::ZERO);
            for write in writes {
                let _ = write.await;
            }
        })
    };
    let new = {
        let (world, standby) = (world.clone(), standby.clone());
        tokio::spawn(async move {
            let name = format!("client{SECOND_WRITER}");
            while Instant::now() < until && !standby.gone.is_cancelled() {
                if standby.ha.standing_by().is_none() {
                    write(&world, &name, SECOND_WRITER, &standby, None, None).await;
                }
                tokio::time::sleep(Duration::from_millis(world.draw(50..300))).await;
            }
        })
    };
    let _ = old.await;
    let _ = new.await;
    world.store.set_faults(|f| f.partitioned[index] = false);
    calm_over(world);
}

/// A station later than its contract: it carries a lease-less change out after
/// `max_processing_ms` (by less than the lock-delay, which is what the lock-delay is for).
/// After the change left doubt, a client asks for the lease (the grant's settle starts the
/// lock-delay), or nobody does (the lock-delay runs from the lapse, before any grant); then the
/// gateway stops cleanly, is killed, or (two gateways) hands over while it runs, and a client
/// takes the lease at once. The lock-delay kept in the station's ledger must hold the next
/// grant back until the late change can no longer land.
async fn late_past_its_contract(world: &Arc<World>) {
    calm(world).await;
    let Some(gateway) = serving(world).filter(|g| at_rest(g)) else {
        calm_over(world);
        return;
    };
    let index = gateway.index;
    let max_processing = assembly::config().max_processing();
    let lock_delay = assembly::config().lock_delay();
    // The station's processing is 2 to 40 ms now (calm): the change lands this long after
    // its sending, between max_processing_ms and max_processing_ms plus the lock-delay.
    let past = Duration::from_millis(world.draw(300..3_000)).min(lock_delay / 2);
    let late = max_processing + past;
    let how = world.draw(0..3u32);
    let asks = world.draw(0..2u32) == 0;
    world.trace.note(format!(
        "scenario: at {}, a lease-less change the station carries out {} ms after its sending, past max_processing_ms; {}, then the gateway {}",
        gateway.name,
        late.as_millis(),
        match asks {
            true => "a client asks for the lease",
            false => "nobody asks for the lease",
        },
        ["stops cleanly and restarts", "is killed and restarts", "stops cleanly and restarts"][how as usize]
    ));
    world.sim.set_ignores_close(true);
    world.sim.delay_next_write_to(assembly::SETPOINT, late);
    let since = world.records.lock().unwrap().writes.len();
    let sent = Instant::now();
    let writer = {
        let (world, gateway) = (world.clone(), gateway.clone());
        tokio::spawn(async move {
            let name = format!("client{BURST_WRITER}");
            write(&world, &name, BURST_WRITER, &gateway, None, None).await;
        })
    };
    if !reached_the_station(world, BURST_WRITER, since).await {
        let _ = writer.await;
        calm_over(world);
        return;
    }
    // After the change left doubt, before it lands.
    let ask_at = sent
        + max_processing
        + Duration::from_millis(world.draw(20..past.as_millis() as u64 / 2 + 21));
    tokio::time::sleep_until(ask_at).await;
    if gateway.gone.is_cancelled() || gateway.ha.standing_by().is_some() {
        // It went meanwhile (what the scenario is about did not happen): nothing more.
        let _ = writer.await;
        calm_over(world);
        return;
    }
    if asks {
        ask_for_the_lease(world, &gateway).await;
    }
    tokio::time::sleep(Duration::from_millis(world.draw(10..200))).await;
    let running = world.gateways.lock().unwrap()[index].running.take();
    if let Some(gateway) = running {
        if how == 1 {
            world.trace.note(format!(
                "fault: gw{index} killed while its lock-delay runs, restarts"
            ));
            gateway.kill();
        } else {
            world.trace.note(format!(
                "fault: gw{index} stopped cleanly while its lock-delay runs, restarts"
            ));
            gateway.stop().await;
        }
        let world = world.clone();
        tokio::spawn(async move {
            restart_when_down(&world, index).await;
        });
    }
    // The next client takes the lease at once, at whichever gateway serves first.
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        if let Some(next) = serving(world) {
            let ttl = Duration::from_millis(world.draw(2_000..4_000));
            if let Some(held) = scripted_acquire(world, NEXT_HOLDER, &next, ttl).await {
                hold_then_release(world, &next, held).await;
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = writer.await;
    calm_over(world);
}

/// `client10` asks `gateway` for the lease once, not waiting in line: refused while the
/// lock-delay runs; a lease it is granted is judged as everyone's, and released.
async fn ask_for_the_lease(world: &World, gateway: &SimGateway) {
    let name = format!("client{SECOND_WRITER}");
    world.trace.note(format!(
        "{name}: acquire at {} (ttl 3000 ms, wait 0 ms)",
        gateway.name
    ));
    match request(
        gateway,
        None,
        gateway.acquire(&name, Duration::from_secs(3), None, Duration::ZERO),
    )
    .await
    {
        Some(Ok(answer)) => {
            // The lock-delay did not hold it back: its tenure is judged as everyone's.
            let now = Instant::now();
            let tenure = world.records.lock().unwrap().add_tenure(Tenure {
                client: SECOND_WRITER,
                fence: answer.fence,
                start: now,
                ends_by: now + Duration::from_millis(answer.expires_in_ms),
                ended_at: None,
                released: false,
                unreleased_end: false,
            });
            world
                .trace
                .note(format!("{name}: holds the lease, fence {}", answer.fence));
            world.records.lock().unwrap().tenures[tenure].end_asked(Instant::now());
            if let Some(Ok(())) = request(gateway, None, gateway.release(&answer.lease_id)).await {
                world.records.lock().unwrap().tenures[tenure].released = true;
            }
        }
        Some(Err(refusal)) => world
            .trace
            .note(format!("{name}: acquire refused: {}", short(&refusal))),
        None => world.trace.note(format!("{name}: acquire: hung up")),
    }
}

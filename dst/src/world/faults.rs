//! The faults of a seed, one after another, each drawn from it: links cut from either side,
//! stations that hang or drop every connection, a store stalled, lossy or partitioned from one
//! gateway, gateways killed, paused or stopped and restarted, and the scripted fault that leaves
//! a change at the station past its answer while its lease ends or its gateway goes.

use super::*;

/// The faults, one after another, each drawn from the seed.
pub(super) async fn faults(world: Arc<World>) {
    loop {
        tokio::time::sleep(Duration::from_micros(world.draw(300_000..4_000_000))).await;
        // A mix of its own plays its scenario now and then, the random faults waiting.
        if world.mix != Mix::Usual && world.draw(0..3u32) == 0 {
            scenarios::play(&world).await;
            continue;
        }
        let count = world.gateways.lock().unwrap().len();
        let index = world.draw(0..count);
        let line = world.gateways.lock().unwrap()[index].line.clone();
        match world.draw(0..19u32) {
            17 | 18 => {
                let script = Script::running(&world);
                let world = world.clone();
                tokio::spawn(async move {
                    change_left_at_the_station(world, index).await;
                    drop(script);
                });
            }
            0 => {
                world.trace.note(format!("fault: gw{index}'s link cut"));
                line.cut();
            }
            1 => {
                // The link cut while a request is at the station (within 3 s, if one comes).
                let script = Script::running(&world);
                let world = world.clone();
                tokio::spawn(async move {
                    let _script = script;
                    for _ in 0..300 {
                        if world.sim.requests_in_progress() > 0 {
                            world.trace.note(format!(
                                "fault: gw{index}'s link cut while a request is at the station"
                            ));
                            line.cut();
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                });
            }
            2 => {
                world
                    .trace
                    .note("fault: the station drops every connection");
                world.sim.drop_connections();
            }
            3 => {
                let ignores = world.draw(0..2u32) == 0;
                world
                    .trace
                    .note(format!("fault: the station ignores a close: {ignores}"));
                world.sim.set_ignores_close(ignores);
            }
            4 | 15 | 16 => {
                // With the longest processing (1.8 s), still within station.max_processing_ms (4 s): a
                // station slower than that breaks its own contract.
                let extra = Duration::from_millis(world.draw(500..2_100));
                world.trace.note(format!(
                    "fault: the next write takes {} ms more",
                    extra.as_millis()
                ));
                world.sim.delay_next_write_to(assembly::SETPOINT, extra);
            }
            5 => {
                let stall = Duration::from_millis(world.draw(200..5_000));
                world.trace.note(format!(
                    "fault: the station hangs for {} ms",
                    stall.as_millis()
                ));
                world.sim.set_stall(true);
                let sim = world.sim.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(stall).await;
                    sim.set_stall(false);
                });
            }
            6 => {
                let until = Instant::now() + Duration::from_millis(world.draw(200..5_000));
                world.trace.note("fault: the store stalls");
                world.store.set_faults(|f| f.stalled_until = Some(until));
            }
            7 => {
                let partitioned = world.draw(0..3u32) != 0;
                world.trace.note(format!(
                    "fault: gw{index} partitioned from the store: {partitioned}"
                ));
                world
                    .store
                    .set_faults(|f| f.partitioned[index] = partitioned);
            }
            8 => {
                let per_mille = world.draw(0..150);
                let delay = Duration::from_millis(world.draw(0..800));
                world.trace.note(format!(
                    "fault: the store loses {per_mille}‰ of its answers, delays up to {} ms",
                    delay.as_millis()
                ));
                world.store.set_faults(|f| {
                    f.lose_answer_per_mille = per_mille;
                    f.max_delay = delay;
                });
            }
            9 => {
                let pause = Duration::from_millis(world.draw(300..9_000));
                world.trace.note(format!(
                    "fault: gw{index} paused for {} ms",
                    pause.as_millis()
                ));
                line.set_held(true);
                world.store.set_faults(|f| f.partitioned[index] = true);
                let world = world.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    world.trace.note(format!("gw{index} runs again"));
                    line.set_held(false);
                    world.store.set_faults(|f| f.partitioned[index] = false);
                });
            }
            10 => {
                let running = world.gateways.lock().unwrap()[index].running.take();
                if let Some(gateway) = running {
                    let down = Duration::from_millis(world.draw(100..6_000));
                    world.trace.note(format!(
                        "fault: gw{index} killed, back in {} ms",
                        down.as_millis()
                    ));
                    gateway.kill();
                    let world = world.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(down).await;
                        restart_when_down(&world, index).await;
                    });
                }
            }
            11 => {
                let running = world.gateways.lock().unwrap()[index].running.take();
                if let Some(gateway) = running {
                    world
                        .trace
                        .note(format!("fault: gw{index} stopped cleanly, restarts"));
                    let world = world.clone();
                    tokio::spawn(async move {
                        gateway.stop().await;
                        restart_when_down(&world, index).await;
                    });
                }
            }
            12 => {
                let processing = Duration::from_millis(world.draw(2..1_800));
                world.trace.note(format!(
                    "fault: the station takes {} ms over each request",
                    processing.as_millis()
                ));
                world.sim.set_processing_time(processing);
            }
            _ => {
                world
                    .trace
                    .note("fault: the station answers normally again");
                world
                    .sim
                    .set_processing_time(Duration::from_millis(world.draw(2..40)));
                world.sim.set_stall(false);
            }
        }
    }
}

/// A scripted fault running on a task of its own, counted until it ends.
pub(super) struct Script(Arc<std::sync::atomic::AtomicUsize>);

impl Script {
    pub(super) fn running(world: &World) -> Script {
        world
            .scripts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Script(world.scripts.clone())
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The client that a scripted fault acts as (a client of its own, so its writes and tenures
/// are judged like everyone's).
pub(super) const SCRIPTED_WRITER: usize = 7;
pub(super) const SCRIPTED_ACQUIRER: usize = 8;

/// A change left at the station past its request's timeout: a write (lease-less, or under a
/// lease it then releases) that the station applies after `station.request_timeout_ms` and
/// before `station.max_processing_ms`, while its link is cut from either side or its gateway
/// is killed and restarted with its state file; then another client acquires right away.
/// The lock-delays and doubts that keep that late change out of the next lease are what this
/// fault tests.
pub(super) async fn change_left_at_the_station(world: Arc<World>, index: usize) {
    let Some(gateway) = world.gateways.lock().unwrap()[index].running.clone() else {
        return;
    };
    if gateway.ha.standing_by().is_some() {
        return;
    }
    let leased = world.draw(0..2u32) == 0;
    // Past the 1 s request timeout, within the 4 s station.max_processing_ms (with the longest
    // processing another fault may set, 1.8 s).
    let processing = Duration::from_millis(world.draw(2..40));
    let extra = Duration::from_millis(world.draw(1_100..2_100));
    let ignores_close = world.draw(0..4u32) != 0;
    let after = world.draw(0..4u32);
    world.trace.note(format!(
        "fault: a {} change left at gw{index}'s station for {} ms, ignores a close: {ignores_close}, then {}",
        if leased { "leased" } else { "lease-less" },
        (processing + extra).as_millis(),
        [
            "its link cut",
            "the station drops every connection",
            "gw killed and restarted",
            "gw stopped cleanly and restarted",
        ][after as usize],
    ));
    world.sim.set_processing_time(processing);
    world.sim.set_ignores_close(ignores_close);
    let name = format!("client{SCRIPTED_WRITER}");
    let mut held = None;
    if leased {
        held = scripted_acquire(&world, SCRIPTED_WRITER, &gateway, Duration::from_secs(2)).await;
        if held.is_none() {
            return;
        }
    }
    world.sim.delay_next_write_to(assembly::SETPOINT, extra);
    let writer = {
        let (world, gateway, held) = (world.clone(), gateway.clone(), held.clone());
        tokio::spawn(async move {
            let lease = held
                .as_ref()
                .map(|(token, fence, _): &(String, u64, usize)| (token.as_str(), *fence));
            write(&world, &name, SCRIPTED_WRITER, &gateway, lease, None).await;
        })
    };
    for _ in 0..100 {
        if world.sim.requests_in_progress() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(world.draw(50..1_300))).await;
    let line = world.gateways.lock().unwrap()[index].line.clone();
    let mut killed = false;
    match after {
        0 => {
            world.trace.note(format!(
                "fault: gw{index}'s link cut while a change is at the station"
            ));
            line.cut();
        }
        1 => {
            world
                .trace
                .note("fault: the station drops every connection while a change is at it");
            world.sim.drop_connections();
        }
        2 => killed = true,
        _ => {
            let running = world.gateways.lock().unwrap()[index].running.take();
            if let Some(gateway) = running {
                world.trace.note(format!(
                    "fault: gw{index} stopped cleanly while a change is at the station, restarts"
                ));
                let world = world.clone();
                tokio::spawn(async move {
                    gateway.stop().await;
                    restart_when_down(&world, index).await;
                });
            }
        }
    }
    if let Some((token, fence, tenure)) = &held {
        let released = {
            let (world, gateway, token) = (world.clone(), gateway.clone(), token.clone());
            let (fence, tenure) = (*fence, *tenure);
            tokio::spawn(async move {
                world.records.lock().unwrap().tenures[tenure].end_asked(Instant::now());
                world
                    .trace
                    .note(format!("client{SCRIPTED_WRITER}: release fence {fence}"));
                if let Some(Ok(())) = request(
                    &gateway,
                    Some(Duration::from_millis(1_500)),
                    gateway.release(&token),
                )
                .await
                {
                    world.records.lock().unwrap().tenures[tenure].released = true;
                    world
                        .trace
                        .note(format!("client{SCRIPTED_WRITER}: released fence {fence}"));
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(world.draw(10..300))).await;
        if world.draw(0..2u32) == 0 {
            killed = true;
        }
        if !killed {
            let _ = released.await;
        }
    }
    if killed {
        let running = world.gateways.lock().unwrap()[index].running.take();
        if let Some(gateway) = running {
            world.trace.note(format!(
                "fault: gw{index} killed while a change is at the station, restarts"
            ));
            gateway.kill();
            tokio::time::sleep(Duration::from_millis(world.draw(50..400))).await;
            restart_when_down(&world, index).await;
        }
    }
    let _ = writer.await;
    // The next client acquires right away, at whichever gateway serves.
    let next = running(&world);
    let Some(gateway) = next.iter().find(|g| g.ha.standing_by().is_none()) else {
        return;
    };
    {
        if let Some((token, fence, tenure)) =
            scripted_acquire(&world, SCRIPTED_ACQUIRER, gateway, Duration::from_secs(4)).await
        {
            tokio::time::sleep(Duration::from_millis(world.draw(1_500..3_000))).await;
            world.records.lock().unwrap().tenures[tenure].end_asked(Instant::now());
            world
                .trace
                .note(format!("client{SCRIPTED_ACQUIRER}: release fence {fence}"));
            if let Some(Ok(())) = request(gateway, None, gateway.release(&token)).await {
                world.records.lock().unwrap().tenures[tenure].released = true;
            }
        }
    }
}

/// A scripted client acquires at `gateway` (waiting up to 6 s in line), its tenure recorded:
/// the token, fence and tenure, or `None` when it was not granted.
pub(super) async fn scripted_acquire(
    world: &World,
    client: usize,
    gateway: &SimGateway,
    ttl: Duration,
) -> Option<(String, u64, usize)> {
    let name = format!("client{client}");
    world.trace.note(format!(
        "{name}: acquire at {} (ttl {} ms, wait 6000 ms)",
        gateway.name,
        ttl.as_millis()
    ));
    match request(
        gateway,
        None,
        gateway.acquire(&name, ttl, None, Duration::from_secs(6)),
    )
    .await
    {
        Some(Ok(answer)) => {
            let now = Instant::now();
            let tenure = world.records.lock().unwrap().add_tenure(Tenure {
                client,
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
            Some((answer.lease_id, answer.fence, tenure))
        }
        Some(Err(refusal)) => {
            world
                .trace
                .note(format!("{name}: acquire refused: {}", short(&refusal)));
            None
        }
        None => {
            world.trace.note(format!("{name}: acquire: hung up"));
            None
        }
    }
}

/// Starts gateway `index` again if it is down. Boxed: starting a gateway spawns what restarts
/// it.
pub(super) fn restart_when_down(
    world: &Arc<World>,
    index: usize,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
    let world = world.clone();
    Box::pin(async move {
        // As a service manager does: tried again every second until it runs.
        while world.gateways.lock().unwrap()[index].running.is_none()
            && !start_gateway(&world, index).await
        {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// Every fault ends; a gateway that is down starts again.
pub(super) async fn heal(world: &Arc<World>) {
    world.store.heal();
    world.sim.set_stall(false);
    world.sim.set_ignores_close(false);
    world
        .sim
        .set_processing_time(Duration::from_millis(world.draw(2..40)));
    let count = world.gateways.lock().unwrap().len();
    for index in 0..count {
        let line = world.gateways.lock().unwrap()[index].line.clone();
        line.set_held(false);
        restart_when_down(world, index).await;
    }
}

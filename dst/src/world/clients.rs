//! The simulated clients: each takes the lease, writes, renews (or forgets to), releases (or
//! hangs up), writes without a lease, presses the safe stop and breaks leases, as the seed says.

use super::*;

/// A lease as its client knows it.
pub(super) struct Held {
    token: String,
    fence: u64,
    gateway: usize,
    tenure: usize,
}

/// One client: takes the lease, writes, renews (or forgets to), releases (or hangs up), writes
/// without a lease, presses the safe stop and breaks leases, as the seed says.
pub(super) async fn client_life(world: Arc<World>, client: usize, stop: CancellationToken) {
    let name = format!("client{client}");
    let mut held: Option<Held> = None;
    let ttl = Duration::from_millis(world.draw(2_000..8_000));
    let mut last_renewed = Instant::now();
    let mut forgetful = false;
    // Some clients renew in the last few milliseconds before the deadline.
    let last_minute = world.draw(0..100u32) < 30;
    while !stop.is_cancelled() && !world.failed.is_cancelled() {
        tokio::time::sleep(Duration::from_micros(world.draw(50_000..1_500_000))).await;
        if stop.is_cancelled() {
            break;
        }
        if world.calm.load(std::sync::atomic::Ordering::SeqCst) {
            continue;
        }
        let gateways = running(&world);
        if gateways.is_empty() {
            continue;
        }
        let pick = world.draw(0..gateways.len());
        let gateway = match &held {
            Some(lease) => match gateways.iter().find(|g| g.index == lease.gateway) {
                Some(gateway) => gateway.clone(),
                // Its gateway went: the client finds the one that serves now.
                None => gateways[pick].clone(),
            },
            None => gateways[pick].clone(),
        };
        let roll = world.draw(0..100u32);
        // A client that hangs up: waits this long at most for its answer.
        let patience =
            (world.draw(0..100u32) < 8).then(|| Duration::from_millis(world.draw(1..1_500)));
        match &held {
            None if roll < 45 => {
                let wait = if world.draw(0..2u32) == 0 {
                    Duration::ZERO
                } else {
                    Duration::from_millis(world.draw(100..6_000))
                };
                let sent = Instant::now();
                world.trace.note(format!(
                    "{name}: acquire at {} (ttl {} ms, wait {} ms)",
                    gateway.name,
                    ttl.as_millis(),
                    wait.as_millis()
                ));
                match request(&gateway, patience, gateway.acquire(&name, ttl, None, wait)).await {
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
                        held = Some(Held {
                            token: answer.lease_id,
                            fence: answer.fence,
                            gateway: gateway.index,
                            tenure,
                        });
                        last_renewed = now.min(sent + ttl)
                            - ttl.saturating_sub(Duration::from_millis(answer.expires_in_ms));
                        forgetful = world.draw(0..100u32) < 15;
                    }
                    Some(Err(refusal)) => world
                        .trace
                        .note(format!("{name}: acquire refused: {}", short(&refusal))),
                    None => world.trace.note(format!("{name}: acquire: hung up")),
                }
            }
            None if roll < 75 => {
                write(&world, &name, client, &gateway, None, patience).await;
            }
            None if roll < 80 => safe_stop(&world, &name, &gateway, patience).await,
            None if roll < 83 => {
                world
                    .trace
                    .note(format!("{name}: break at {}", gateway.name));
                let sent = Instant::now();
                world.records.lock().unwrap().press_sent(sent);
                world.records.lock().unwrap().breaks.push(sent);
                if let Some(Ok(broken)) = request(&gateway, patience, gateway.break_lease()).await {
                    world.trace.note(format!(
                        "{name}: broke the lease of {}",
                        broken.as_deref().unwrap_or("nobody")
                    ));
                    if let Some(owner) = broken {
                        world
                            .records
                            .lock()
                            .unwrap()
                            .ended_by_press(sent, false, |t| {
                                owner == format!("client{}", t.client)
                            });
                    }
                }
            }
            None => {}
            Some(lease) => {
                let token = lease.token.clone();
                let (fence, tenure) = (lease.fence, lease.tenure);
                if forgetful {
                    // It stops renewing and writing: the lease runs out on its own.
                    if Instant::now() > last_renewed + ttl + Duration::from_secs(1) {
                        world
                            .trace
                            .note(format!("{name}: forgot its lease (fence {fence})"));
                        world.records.lock().unwrap().tenures[tenure].ran_out();
                        held = None;
                    }
                    continue;
                }
                let deadline = last_renewed + ttl;
                if last_minute && roll < 40 && Instant::now() < deadline {
                    // It renews a few milliseconds before its deadline, while another client
                    // writes without a lease just after it at the same gateway.
                    let at = deadline.checked_sub(Duration::from_millis(world.draw(0..40)));
                    tokio::time::sleep_until(at.unwrap_or(deadline).max(Instant::now())).await;
                    let other = {
                        let (world, gateway) = (world.clone(), gateway.clone());
                        let after = Duration::from_millis(world.draw(1..60));
                        tokio::spawn(async move {
                            tokio::time::sleep_until(deadline + after).await;
                            write(&world, "client6", 6, &gateway, None, None).await;
                        })
                    };
                    if world.draw(0..2u32) == 0 {
                        // The store answers late now and then (up to 300 ms).
                        let delay = Duration::from_millis(world.draw(20..300));
                        world.trace.note(format!(
                            "fault: the store answers up to {} ms late",
                            delay.as_millis()
                        ));
                        world
                            .store
                            .set_faults(|f| f.max_delay = f.max_delay.max(delay));
                    }
                    world
                        .trace
                        .note(format!("{name}: renews fence {fence} at its deadline"));
                    let sent = Instant::now();
                    match request(&gateway, patience, gateway.renew(&token)).await {
                        Some(Ok(answer)) => {
                            let now = Instant::now();
                            let told_end = world.records.lock().unwrap().tenures[tenure].ends_by;
                            if now > told_end + Duration::from_millis(2) {
                                // Invariant 3: its lease ran out at the end it was told (its
                                // changes were refused from then), so it cannot be renewed.
                                fail(
                                    &world,
                                    format!(
                                        "invariant 3: {name}'s renewal of fence {fence} was answered renewed at {:.3} s, after the lease's end it was told ({:.3} s)",
                                        (now - world.trace.start()).as_secs_f64(),
                                        (told_end - world.trace.start()).as_secs_f64()
                                    ),
                                );
                            }
                            let mut records = world.records.lock().unwrap();
                            let tenure = &mut records.tenures[tenure];
                            let ends_by = now + Duration::from_millis(answer.expires_in_ms);
                            tenure.ends_by = tenure.ends_by.max(ends_by);
                            last_renewed = ends_by.checked_sub(ttl).unwrap_or(sent);
                            world.trace.note(format!("{name}: renewed fence {fence}"));
                        }
                        Some(Err(refusal)) => {
                            world.trace.note(format!(
                                "{name}: renewal of fence {fence} refused: {}",
                                short(&refusal)
                            ));
                            if matches!(refusal, Refusal::Lease(_)) {
                                world.records.lock().unwrap().tenures[tenure].ran_out();
                                held = None;
                            }
                        }
                        None => world.trace.note(format!("{name}: renewal: hung up")),
                    }
                    let _ = other.await;
                    continue;
                }
                if Instant::now() + Duration::from_millis(300) > deadline {
                    // Too late to renew reliably: it lets the lease go as a crashed client.
                    world
                        .trace
                        .note(format!("{name}: lease (fence {fence}) ran out"));
                    world.records.lock().unwrap().tenures[tenure].ran_out();
                    held = None;
                    continue;
                }
                if roll < 50 {
                    write(
                        &world,
                        &name,
                        client,
                        &gateway,
                        Some((&token, fence)),
                        patience,
                    )
                    .await;
                } else if roll < 75 {
                    let sent = Instant::now();
                    match request(&gateway, patience, gateway.renew(&token)).await {
                        Some(Ok(answer)) => {
                            let now = Instant::now();
                            let mut records = world.records.lock().unwrap();
                            let tenure = &mut records.tenures[tenure];
                            let ends_by = now + Duration::from_millis(answer.expires_in_ms);
                            tenure.ends_by = tenure.ends_by.max(ends_by);
                            last_renewed = ends_by.checked_sub(ttl).unwrap_or(sent);
                            world.trace.note(format!("{name}: renewed fence {fence}"));
                        }
                        Some(Err(refusal)) => {
                            world.trace.note(format!(
                                "{name}: renewal of fence {fence} refused: {}",
                                short(&refusal)
                            ));
                            if matches!(refusal, Refusal::Lease(_)) {
                                world.records.lock().unwrap().tenures[tenure].ran_out();
                                held = None;
                            }
                        }
                        None => world.trace.note(format!("{name}: renewal: hung up")),
                    }
                } else if roll < 95 {
                    let sent = Instant::now();
                    world.records.lock().unwrap().tenures[tenure].end_asked(sent);
                    world.trace.note(format!("{name}: release fence {fence}"));
                    match request(&gateway, patience, gateway.release(&token)).await {
                        Some(Ok(())) => {
                            world.records.lock().unwrap().tenures[tenure].released = true;
                            world.trace.note(format!("{name}: released fence {fence}"));
                        }
                        Some(Err(refusal)) => {
                            world.trace.note(format!(
                                "{name}: release of fence {fence} refused: {}",
                                short(&refusal)
                            ));
                            if matches!(refusal, Refusal::Lease(_)) {
                                world.records.lock().unwrap().tenures[tenure].ran_out();
                            }
                        }
                        None => world.trace.note(format!("{name}: release: hung up")),
                    }
                    held = None;
                } else {
                    safe_stop(&world, &name, &gateway, patience).await;
                    if world.records.lock().unwrap().tenures[tenure]
                        .ended_at
                        .is_some()
                    {
                        held = None;
                    }
                }
            }
        }
    }
}

pub(super) fn short(refusal: &Refusal) -> String {
    let text = refusal.to_string();
    match text.char_indices().nth(90) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

pub(super) async fn write(
    world: &World,
    name: &str,
    client: usize,
    gateway: &SimGateway,
    lease: Option<(&str, u64)>,
    patience: Option<Duration>,
) {
    let value = {
        let mut records = world.records.lock().unwrap();
        records.next_value += 1.0;
        records.next_value
    };
    let intent = world.records.lock().unwrap().add_write(WriteIntent {
        value,
        client,
        fence: lease.map(|(_, fence)| fence),
        gateway: gateway.index,
        sent: Instant::now(),
        answer: WriteAnswer::Pending,
    });
    world.trace.note(format!(
        "{name}: write {value} at {} under {}",
        gateway.name,
        lease.map_or("no lease".to_string(), |(_, f)| format!("fence {f}"))
    ));
    let answer = match request(
        gateway,
        patience,
        gateway.write(value, lease.map(|(token, _)| token)),
    )
    .await
    {
        None => WriteAnswer::HungUp,
        Some(Err(refusal)) => WriteAnswer::Refused(short(&refusal)),
        Some(Ok(Err(still_running))) => WriteAnswer::Unknown(still_running),
        Some(Ok(Ok(report))) => match report.outcome {
            ChangeOutcome::Applied => WriteAnswer::Applied(Instant::now()),
            ChangeOutcome::Refused { why } => WriteAnswer::Refused(why),
            ChangeOutcome::Partial { why, .. } | ChangeOutcome::Unknown { why } => {
                WriteAnswer::Unknown(why)
            }
        },
    };
    world
        .trace
        .note(format!("{name}: write {value}: {}", answer.word()));
    world.records.lock().unwrap().writes[intent].answer = answer;
}

pub(super) async fn safe_stop(
    world: &World,
    name: &str,
    gateway: &SimGateway,
    patience: Option<Duration>,
) {
    let sent = Instant::now();
    world.records.lock().unwrap().press_sent(sent);
    world
        .trace
        .note(format!("{name}: safe stop at {}", gateway.name));
    match request(gateway, patience, gateway.safe_stop(name)).await {
        Some(Ok(outcome)) => {
            let done = matches!(
                outcome.safe_state,
                SafeStopState::Confirmed | SafeStopState::AlreadySafe
            );
            world.trace.note(format!(
                "{name}: safe stop answered: {:?}, ended {:?}",
                outcome.safe_state,
                outcome.ended.as_ref().map(|(_, fence)| fence)
            ));
            let mut records = world.records.lock().unwrap();
            if let Some((_, fence)) = outcome.ended {
                records.ended_by_press(sent, true, |t| t.fence == fence);
            }
            if done {
                records.safe_stops.push(SafeStopRecord {
                    gateway: gateway.index,
                    sent,
                    answered: Instant::now(),
                });
            }
        }
        Some(Err(refusal)) => world
            .trace
            .note(format!("{name}: safe stop refused: {}", short(&refusal))),
        None => world.trace.note(format!("{name}: safe stop: hung up")),
    }
}

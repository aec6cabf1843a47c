//! Scenarios 2 to 4: forced reads (loaded, alone, on one shared channel, with a slow
//! station), the batched read of 50 names and coalescing, each beside the same READs straight
//! to the station.

use std::time::Instant;

use serde_json::json;

use super::{
    Bench, CpuSpan, Pair, Unloaded, VALUE_GET, VALUES_GET, body, direct_clients, error_notes,
    fill_rate_row, ratio, read_workers, rest_workers,
};
use crate::load::{Measured, drive, new_histogram};
use crate::report::{Row, Verdict, micros, rate_cell};
use crate::workers::{DirectReadWorker, RestWorker};

impl Bench {
    /// 2c. Forced reads from 8 connections all of one channel (several dashboards on the same
    /// monitor), beside the same 8 connections over 8 channels, measured as interleaved pairs.
    pub async fn forced_shared(&self) -> anyhow::Result<Row> {
        let conns = self.conns_or(8);
        let mut row = Row::new(
            "2c",
            format!("Forced read (value/get), {conns} conns on one channel"),
        );
        let spread: Vec<String> = (0..conns)
            .map(|i| self.names[i % self.names.len()].clone())
            .collect();
        let shared = self.names[0].clone();
        let mut pairs = Vec::with_capacity(self.pairs);
        let mut frames = (0u64, 0u64);
        for _ in 0..self.pairs.max(1) {
            let workers = rest_workers(self.gateway.http_addr, conns, VALUE_GET, |i| {
                body(json!({ "Name": spread[i] }))
            })
            .await?;
            let cpu = CpuSpan::start(&self.gateway);
            let baseline = drive(workers, self.bounds).await;
            let baseline_us = cpu.per_request_us(baseline.requests * 6 / 5);

            let workers = rest_workers(self.gateway.http_addr, conns, VALUE_GET, |_| {
                body(json!({ "Name": shared }))
            })
            .await?;
            let before = self.station.read_frames().await?;
            let cpu = CpuSpan::start(&self.gateway);
            let measured = drive(workers, self.bounds).await;
            let gateway_us = cpu.per_request_us(measured.requests * 6 / 5);
            frames.0 += self.station.read_frames().await? - before;
            frames.1 += measured.requests * 6 / 5;
            error_notes(&mut row, &measured, &baseline);
            pairs.push(Pair {
                gateway: measured.throughput(),
                baseline: baseline.throughput(),
                gateway_us,
                baseline_us,
                gateway_p50: measured.p50_us(),
                baseline_p50: baseline.p50_us(),
            });
        }
        let pair = Pair::medians(&pairs);
        let r = ratio(pair.gateway, pair.baseline);
        let p50_ratio = ratio(pair.gateway_p50, pair.baseline_p50);
        row.gateway = format!(
            "{:.1} k req/s · p50 {} · {:.1} µs CPU/request",
            pair.gateway / 1e3,
            micros(pair.gateway_p50),
            pair.gateway_us
        );
        row.baseline = format!(
            "the same {conns} conns over {conns} channels: {:.1} k req/s · p50 {}",
            pair.baseline / 1e3,
            micros(pair.baseline_p50)
        );
        row.ratio = format!("{r:.2}× throughput; {p50_ratio:.2}× p50");
        row.target = "≥ 0.8× the 8-channel throughput; p50 ≤ 2×".to_owned();
        row.verdict = Verdict::from_bool(r >= 0.8 && p50_ratio <= 2.0 && row.notes.is_empty());
        row.notes.push(format!(
            "medians of {} interleaved pairs (8 channels, 1 channel), each {} s: {}; {:.2} requests per READ frame on the shared channel (warm-up included)",
            pairs.len(),
            self.bounds.duration.as_secs(),
            pairs
                .iter()
                .map(|p| format!("{:.1}k/{:.1}k", p.gateway / 1e3, p.baseline / 1e3))
                .collect::<Vec<_>>()
                .join(", "),
            frames.1 as f64 / frames.0.max(1) as f64
        ));
        Ok(row)
    }

    /// 2. Forced reads through the gateway against the same reads straight to the simulator.
    pub async fn forced(&self) -> anyhow::Result<Vec<Row>> {
        let conns = self.conns_or(8);
        let mut row = Row::new("2", format!("Forced read (value/get), {conns} conns"));
        let names: Vec<String> = (0..conns)
            .map(|i| self.names[i % self.names.len()].clone())
            .collect();

        let baseline_workers = read_workers(self.station.addr, &names).await?;
        let own = CpuSpan::of(std::process::id());
        let station = CpuSpan::of(self.station.pid);
        let baseline = drive(baseline_workers, self.bounds).await;
        // Warm-up included: the spans cover the whole run.
        let requests = baseline.requests * 6 / 5;
        let (direct_client_cpu, direct_station_cpu) = (
            own.per_request_us(requests),
            station.per_request_us(requests),
        );

        let workers = rest_workers(self.gateway.http_addr, conns, VALUE_GET, |i| {
            body(json!({ "Name": names[i] }))
        })
        .await?;
        let frames_before = self.station.read_frames().await?;
        let cpu = CpuSpan::start(&self.gateway);
        let own = CpuSpan::of(std::process::id());
        let station = CpuSpan::of(self.station.pid);
        let measured = drive(workers, self.bounds).await;
        let requests = measured.requests * 6 / 5;
        let (gateway_cpu, client_cpu, station_cpu) = (
            cpu.per_request_us(requests),
            own.per_request_us(requests),
            station.per_request_us(requests),
        );
        let cpu = cpu.percent();
        row.notes.push(format!(
            "CPU per request (warm-up included, approximate): direct {:.0} µs = client {direct_client_cpu:.0} + station {direct_station_cpu:.0}; through the gateway {:.0} µs = HTTP client {client_cpu:.0} + gateway {gateway_cpu:.0} + station {station_cpu:.0}",
            direct_client_cpu + direct_station_cpu,
            client_cpu + gateway_cpu + station_cpu
        ));
        let frames = self.station.read_frames().await? - frames_before;

        let overhead = measured.p50_us() - baseline.p50_us();
        let r = ratio(measured.throughput(), baseline.throughput());
        row.gateway = rate_cell(&measured);
        row.baseline = format!(
            "direct byte protocol, {conns} conns: {}",
            rate_cell(&baseline)
        );
        row.ratio = format!("{r:.2}× throughput; p50 +{}", micros(overhead));
        row.target = "p50 overhead ≤ 50 µs; ≥ 0.8× direct".to_owned();
        row.verdict = Verdict::from_bool(overhead <= 50.0 && r >= 0.8 && measured.errors == 0);
        row.notes.push(format!(
            "gateway CPU {cpu:.0} % of one core; {} READ frames reached the station for the gateway's requests, {:.2} requests per frame (warm-up included)",
            frames,
            requests as f64 / frames.max(1) as f64
        ));
        let one = RestWorker::open(
            self.gateway.http_addr,
            VALUE_GET,
            &body(json!({ "Name": names[0] })),
        )
        .await?;
        let unloaded = self.unloaded_side_by_side(&names[0], one).await?;
        row.notes.push(unloaded.note());
        let floor = self.forced_floor(&names, &baseline).await?;
        row.notes.push(floor.note.clone());
        error_notes(&mut row, &measured, &baseline);
        let own_cost = forced_own_cost(
            conns,
            (gateway_cpu, unloaded.overhead_us()),
            (floor.cpu_us, floor.unloaded.overhead_us()),
            measured.errors + floor.errors,
        );
        Ok(vec![row, own_cost])
    }

    /// The forced floor server (`floor.rs`: a READ over a station connection of its own for
    /// each request, with the access and audit lines) as the gateway was measured, loaded and
    /// alone: the least a forced read through any gateway costs.
    async fn forced_floor(
        &self,
        names: &[String],
        baseline: &Measured,
    ) -> anyhow::Result<ForcedFloor> {
        let floor = crate::child::TrivialProcess::spawn_floor(
            &names[0],
            b"",
            crate::floor::Floor::Forced(self.station.addr),
        )
        .await?;
        let workers = rest_workers(floor.addr, names.len(), VALUE_GET, |i| {
            body(json!({ "Name": names[i] }))
        })
        .await?;
        let cpu = CpuSpan::of(floor.pid);
        let loaded = drive(workers, self.bounds).await;
        let cpu_us = cpu.per_request_us(loaded.requests * 6 / 5);
        let one =
            RestWorker::open(floor.addr, VALUE_GET, &body(json!({ "Name": names[0] }))).await?;
        let unloaded = self.unloaded_side_by_side(&names[0], one).await?;
        let note = format!(
            "forced floor server (HTTP in, one READ a request over a station connection of its own, the access and audit lines; no coalescing, lease or cache: the least any gateway's forced read costs), {} conns: {:.1} k req/s · p50 {} · {cpu_us:.1} µs CPU/request (errors {}); {:.2}× direct throughput, p50 +{}; unloaded p50 {} against direct {}: +{}",
            names.len(),
            loaded.throughput() / 1e3,
            micros(loaded.p50_us()),
            loaded.errors,
            ratio(loaded.throughput(), baseline.throughput()),
            micros(loaded.p50_us() - baseline.p50_us()),
            micros(unloaded.through.p50_us()),
            micros(unloaded.direct.p50_us()),
            micros(unloaded.overhead_us()),
        );
        Ok(ForcedFloor {
            note,
            cpu_us,
            unloaded,
            errors: loaded.errors,
        })
    }

    /// 2b. Forced reads while the station takes a millisecond over every request, as station
    /// firmware does: the station, not the machine's CPU, is then the limit, as with hardware.
    pub async fn slow_station(&self) -> anyhow::Result<Row> {
        const PROCESSING_MS: u64 = 1;
        let conns = self.conns_or(8);
        let mut row = Row::new(
            "2b",
            format!(
                "Forced read (value/get), {conns} conns, the station taking {PROCESSING_MS} ms over each request"
            ),
        );
        let names: Vec<String> = (0..conns)
            .map(|i| self.names[i % self.names.len()].clone())
            .collect();
        self.station
            .ask(&format!("processing {PROCESSING_MS}"))
            .await?;
        let outcome: anyhow::Result<(Measured, Measured)> = async {
            let baseline_workers = read_workers(self.station.addr, &names).await?;
            let baseline = drive(baseline_workers, self.bounds).await;
            let workers = rest_workers(self.gateway.http_addr, conns, VALUE_GET, |i| {
                body(json!({ "Name": names[i] }))
            })
            .await?;
            Ok((baseline, drive(workers, self.bounds).await))
        }
        .await;
        self.station.ask("processing 0").await?;
        let (baseline, measured) = outcome?;
        fill_rate_row(
            &mut row,
            &measured,
            &baseline,
            &format!("direct byte protocol, {conns} conns"),
        );
        let r = ratio(measured.throughput(), baseline.throughput());
        row.target = "≥ 0.8× direct".to_owned();
        row.verdict = Verdict::from_bool(r >= 0.8 && measured.errors == 0);
        row.notes.push(format!(
            "the station works on up to {} requests of a connection at once; the direct clients have a connection each, the gateway one for all",
            self.station_window().await
        ));
        Ok(row)
    }

    /// The window the station offers in HELLO.
    async fn station_window(&self) -> String {
        match direct_clients(self.station.addr, 1).await {
            Ok(mut clients) => match clients[0].hello("station-bench").await {
                Ok(hello) => hello.window.to_string(),
                Err(_) => "?".to_owned(),
            },
            Err(_) => "?".to_owned(),
        }
    }

    /// 3a. A forced read of 50 names in one values/get, against one READ of the same names.
    pub async fn batch(&self) -> anyhow::Result<Row> {
        let conns = self.conns_or(8);
        let names: Vec<String> = (0..50)
            .map(|i| self.names[i % self.names.len()].clone())
            .collect();
        let distinct = self.names.len().min(50);
        let mut row = Row::new(
            "3a",
            format!("Batched forced read, 50 names (values/get, no MaxAgeMs), {conns} conns"),
        );
        let clients = direct_clients(self.station.addr, conns).await?;
        let baseline_workers = clients
            .into_iter()
            .map(|client| DirectReadWorker {
                client,
                names: names.clone(),
            })
            .collect();
        let baseline = drive(baseline_workers, self.bounds).await;
        let request = body(json!({ "Names": names }));
        let workers = rest_workers(self.gateway.http_addr, conns, VALUES_GET, |_| {
            request.clone()
        })
        .await?;
        let cpu = CpuSpan::start(&self.gateway);
        let measured = drive(workers, self.bounds).await;
        let cpu = cpu.percent();
        fill_rate_row(
            &mut row,
            &measured,
            &baseline,
            &format!("direct READ of the 50 names, {conns} conns"),
        );
        row.notes.push(format!(
            "gateway CPU {cpu:.0} % of one core; {distinct} distinct names (the station has {} side-effect-free channels; the rest repeat)",
            self.names.len()
        ));
        Ok(row)
    }

    /// 4. Rounds of 100 concurrent forced reads of one channel: hardware reads per request.
    pub async fn coalescing(&self) -> anyhow::Result<Row> {
        const CONCURRENT: usize = 100;
        let mut row = Row::new(
            "4",
            "Coalescing: rounds of 100 concurrent forced reads of one channel",
        );
        let name = self.names[0].clone();
        let request = body(json!({ "Name": name }));
        let mut connections = rest_workers(self.gateway.http_addr, CONCURRENT, VALUE_GET, |_| {
            request.clone()
        })
        .await?;
        let max_rounds = 500u64;
        let mut histogram = new_histogram();
        let mut errors = 0u64;
        let mut first_error = None;
        // Warm-up rounds, not counted (fresh connections, first allocations), as every other
        // scenario has; then the measured ones.
        let warm_until = Instant::now() + self.bounds.warmup;
        while Instant::now() < warm_until && errors == 0 {
            burst(&mut connections, None, &mut errors, &mut first_error).await;
        }
        let reads_before = self.station.reads_of(&name).await?;
        let mut rounds = 0u64;
        let started = Instant::now();
        while rounds < max_rounds && started.elapsed() < self.bounds.duration && errors == 0 {
            burst(
                &mut connections,
                Some(&mut histogram),
                &mut errors,
                &mut first_error,
            )
            .await;
            rounds += 1;
        }
        let elapsed = started.elapsed();
        let reads = self.station.reads_of(&name).await? - reads_before;
        let requests = rounds * CONCURRENT as u64;
        let per_request = reads as f64 / requests.max(1) as f64;
        let measured = Measured {
            requests: histogram.len(),
            errors,
            first_error,
            elapsed,
            histogram,
        };
        row.gateway = format!(
            "{per_request:.4} hardware reads/request ({reads} reads for {requests} requests in {rounds} rounds) · {}",
            rate_cell(&measured)
        );
        row.baseline = "no coalescing: 1 hardware read/request".to_owned();
        row.ratio = format!("{per_request:.4}× the reads");
        // The floor: two reads a round, with room for the one READ already on the wire
        // when counting starts.
        row.target = "≤ 0.0205 hardware reads/request".to_owned();
        row.verdict = Verdict::from_bool(per_request <= 0.0205 && errors == 0);
        row.notes.push(format!(
            "per round: ≥ 1 read (the read on the wire when the round starts) + 1 for the requests that arrived while it was in flight; {} reads per round here",
            format_args!("{:.2}", reads as f64 / rounds.max(1) as f64)
        ));
        if let Some(error) = &measured.first_error {
            row.notes
                .push(format!("{} errors, first: {error}", measured.errors));
        }
        Ok(row)
    }
}

/// The forced floor server measured as the gateway was: loaded, and one connection alone.
struct ForcedFloor {
    note: String,
    /// Its CPU a request under the load (warm-up included).
    cpu_us: f64,
    unloaded: Unloaded,
    errors: u64,
}

/// 2d. The targets for a forced read's own cost: the gateway's own CPU a read and what it adds to
/// an unloaded read's p50, judged beside the forced floor in the same run. `gateway` and
/// `floor` are each (CPU µs a request, unloaded p50 overhead µs).
pub(super) fn forced_own_cost(
    conns: usize,
    gateway: (f64, f64),
    floor: (f64, f64),
    errors: u64,
) -> Row {
    const CPU_US: f64 = 15.0;
    const OVERHEAD_US: f64 = 40.0;
    let mut row = Row::new("2d", "Forced read: the gateway's own cost");
    row.gateway = format!(
        "{:.1} µs CPU a read ({conns} conns); unloaded p50 +{}",
        gateway.0,
        micros(gateway.1)
    );
    row.baseline = format!(
        "forced floor server (see 2): {:.1} µs CPU a read; unloaded p50 +{}",
        floor.0,
        micros(floor.1)
    );
    row.ratio = format!(
        "{:.2}× the floor's CPU; p50 overhead {:+.0} µs beside the floor's",
        ratio(gateway.0, floor.0),
        gateway.1 - floor.1
    );
    row.target =
        format!("gateway CPU ≤ {CPU_US:.0} µs a read; unloaded p50 overhead ≤ {OVERHEAD_US:.0} µs");
    row.verdict = if errors > 0 {
        row.notes.push(format!("{errors} errors (see 2)"));
        Verdict::Missed
    } else {
        Verdict::beside_floor(&[
            (gateway.0 <= CPU_US, floor.0 <= CPU_US),
            (gateway.1 <= OVERHEAD_US, floor.1 <= OVERHEAD_US),
        ])
    };
    if row.verdict == Verdict::OutOfReach {
        row.notes.push(
            "out of reach: each part the gateway missed, the forced floor server missed too in the same run (one READ a request on a station connection of its own, the access and audit lines, nothing else)".to_owned(),
        );
    }
    row
}

/// One round of the coalescing scenario: every connection's request written before any
/// answer is read, from this one task, so the burst leaves as close together as the machine
/// allows. (A task per request spread it over the load generator's scheduling: 3–6 ms a
/// round.) Each latency, recorded into `histogram`, runs from the start of the round to the
/// moment its answer was read: an upper bound.
async fn burst(
    connections: &mut [RestWorker],
    mut histogram: Option<&mut hdrhistogram::Histogram<u64>>,
    errors: &mut u64,
    first_error: &mut Option<String>,
) {
    let started = Instant::now();
    let mut sent = Vec::with_capacity(connections.len());
    for worker in connections.iter_mut() {
        let result = worker.connection.send(&worker.request).await;
        if let Err(why) = &result {
            *errors += 1;
            first_error.get_or_insert(format!("{why:#}"));
        }
        sent.push(result.is_ok());
    }
    for (worker, sent) in connections.iter_mut().zip(sent) {
        if !sent {
            continue;
        }
        match worker.connection.receive().await {
            Ok(_) => {
                if let Some(histogram) = histogram.as_deref_mut() {
                    let _ = histogram.record(started.elapsed().as_nanos().max(1) as u64);
                }
            }
            Err(why) => {
                *errors += 1;
                first_error.get_or_insert(format!("{why:#}"));
            }
        }
    }
}

//! Scenario 1, the cached read: the gateway beside the trivial server, nginx and the floor
//! servers, in interleaved rounds, saturated and at an equal offered load.

use bytes::Bytes;
use serde_json::json;

use super::{Bench, CpuSpan, Pair, VALUES_GET, body, error_notes, median, ratio, rest_workers};
use crate::http::HttpConnection;
use crate::load::{Bounds, drive};
use crate::report::{Row, Verdict, micros};

impl Bench {
    /// 1. Cached read over 64 keep-alive connections, against a trivial hyper server.
    pub async fn cached(&self) -> anyhow::Result<Row> {
        let mut row = Row::new(
            "1",
            format!(
                "Cached read (values/get, 1 name, MaxAgeMs 600000), {} conns",
                self.conns_or(64)
            ),
        );
        let request = body(json!({ "Names": [self.names[0]], "MaxAgeMs": 600_000 }));
        // Prime the cache, and take the exact answer for the trivial server to send.
        let mut probe = HttpConnection::open(self.gateway.http_addr).await?;
        let answer = probe.post(VALUES_GET, &request).await?;
        drop(probe);

        // Interleaved pairs: the trivial hyper server in a process of its own (it pays the same
        // process hops as the gateway), then the gateway, `pairs` times, so a change in the
        // machine's load falls on both alike; the medians are compared.
        let conns = self.conns_or(64);
        let mut pairs = Vec::with_capacity(self.pairs);
        // nginx (one worker, `return 200` with the same bytes) in each round too, when installed:
        // (req/s, CPU µs per request) per round.
        let mut nginx_runs: Vec<(f64, f64)> = Vec::new();
        // The floor servers (trivial + JSON parse, lookup, access line; and the same with the
        // audit line) in each round too: (req/s, CPU µs per request), lower bounds on the
        // gateway's cost.
        let floors = [
            (
                crate::floor::Floor::Plain,
                "floor server",
                "floor server (the trivial one + the JSON body parsed, the name looked up, an access line; a lower bound on any gateway)",
            ),
            (
                crate::floor::Floor::Audited,
                "audited floor server",
                "audited floor server (the floor server + the audit line every request has, rendered and handed to a writer thread; a lower bound on any gateway that keeps the station's audit log)",
            ),
        ];
        let mut floor_runs: [Vec<(f64, f64)>; 2] = Default::default();
        for _ in 0..self.pairs.max(1) {
            for ((floor, label, _), runs) in floors.iter().zip(floor_runs.iter_mut()) {
                let server =
                    crate::child::TrivialProcess::spawn_floor(&self.names[0], &answer, *floor)
                        .await?;
                runs.push(
                    reference_round(
                        &mut row,
                        label,
                        (server.addr, server.pid),
                        conns,
                        &request,
                        self.bounds,
                        None,
                    )
                    .await?,
                );
            }
            if crate::child::NginxProcess::available() {
                let nginx = crate::child::NginxProcess::spawn(&answer).await?;
                let server = (nginx.addr, nginx.pid);
                nginx_runs.push(
                    reference_round(
                        &mut row,
                        "nginx",
                        server,
                        conns,
                        &request,
                        self.bounds,
                        None,
                    )
                    .await?,
                );
            }
            let trivial = crate::child::TrivialProcess::spawn(&answer).await?;
            let workers =
                rest_workers(trivial.addr, conns, VALUES_GET, |_| request.clone()).await?;
            let trivial_cpu = CpuSpan::of(trivial.pid);
            let baseline = drive(workers, self.bounds).await;
            let trivial_us = trivial_cpu.per_request_us(baseline.requests * 6 / 5);
            drop(trivial);

            let workers = rest_workers(self.gateway.http_addr, conns, VALUES_GET, |_| {
                request.clone()
            })
            .await?;
            let cpu = CpuSpan::start(&self.gateway);
            let measured = drive(workers, self.bounds).await;
            let gateway_us = cpu.per_request_us(measured.requests * 6 / 5);
            error_notes(&mut row, &measured, &baseline);
            pairs.push(Pair {
                gateway: measured.throughput(),
                baseline: baseline.throughput(),
                gateway_us,
                baseline_us: trivial_us,
                gateway_p50: measured.p50_us(),
                baseline_p50: baseline.p50_us(),
            });
        }
        let pair = Pair::medians(&pairs);
        let r = ratio(pair.gateway, pair.baseline);
        let cpu_ratio = ratio(pair.gateway_us, pair.baseline_us);
        row.gateway = format!(
            "{:.1} k req/s · p50 {} · {:.2} µs CPU/request",
            pair.gateway / 1e3,
            micros(pair.gateway_p50),
            pair.gateway_us
        );
        row.baseline = format!(
            "trivial hyper server in a child process: {:.1} k req/s · p50 {} · {:.2} µs CPU/request",
            pair.baseline / 1e3,
            micros(pair.baseline_p50),
            pair.baseline_us
        );
        row.ratio = format!("{r:.2}× throughput; {cpu_ratio:.2}× CPU per request");
        row.target = "≥ 0.95× the child-process server; CPU ≤ 1.15×".to_owned();
        let equal_load = self
            .cached_at_equal_load(&mut row, &answer, &request, 0.8 * pair.gateway)
            .await?;
        // Each part of the target, (gateway met, audited floor met in a round), for the
        // verdict (`cached_parts`).
        let trivial_rounds: Vec<(f64, f64)> =
            pairs.iter().map(|p| (p.baseline, p.baseline_us)).collect();
        let mut parts = cached_parts(r, cpu_ratio, &floor_runs[1], &trivial_rounds);
        if !nginx_runs.is_empty() {
            let nginx = median(nginx_runs.iter().map(|run| run.0));
            let nginx_us = median(nginx_runs.iter().map(|run| run.1));
            let to_nginx = ratio(pair.gateway, nginx);
            parts.push(nginx_part(to_nginx, &floor_runs[1], &nginx_runs));
            row.baseline.push_str(&format!(
                "; nginx, 1 worker, `return 200`: {:.1} k req/s · {nginx_us:.2} µs CPU/request",
                nginx / 1e3
            ));
            row.ratio
                .push_str(&format!("; {to_nginx:.2}× nginx's throughput"));
            row.target.push_str("; ≥ 0.8× nginx");
            row.notes.push(format!(
                "nginx in each round before the pair: {}",
                nginx_runs
                    .iter()
                    .map(|run| format!("{:.1}k", run.0 / 1e3))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (runs, (_, _, what)) in floor_runs.iter().zip(&floors) {
            let floor = median(runs.iter().map(|run| run.0));
            let floor_us = median(runs.iter().map(|run| run.1));
            row.notes.push(format!(
                "{what}: {:.1} k req/s · {floor_us:.2} µs CPU/request, {:.2}× the trivial server's throughput, {:.2}× its CPU (rounds: {})",
                floor / 1e3,
                ratio(floor, pair.baseline),
                ratio(floor_us, pair.baseline_us),
                runs.iter()
                    .map(|run| format!("{:.1}k", run.0 / 1e3))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        // Judged beside the audited floor: the gateway keeps the station's audit log, so a
        // target the audited floor misses in the same run no gateway meets on this machine.
        row.verdict = if row.notes.iter().any(|n| n.contains("error")) {
            Verdict::Missed
        } else {
            Verdict::beside_floor(&parts)
        };
        if row.verdict == Verdict::OutOfReach {
            row.notes.push(
                "out of reach: each part of the target the gateway missed, the audited floor server missed too, in every round (a server that does less than any gateway with the access and audit logs must)".to_owned(),
            );
        }
        row.notes.push(equal_load);
        row.notes.push(format!(
            "medians of {} interleaved pairs (trivial server, gateway), each {} s: {}; answer {} bytes; CPU per request includes the warm-up",
            pairs.len(),
            self.bounds.duration.as_secs(),
            pairs
                .iter()
                .map(|p| format!("{:.1}k/{:.1}k", p.gateway / 1e3, p.baseline / 1e3))
                .collect::<Vec<_>>()
                .join(", "),
            answer.len()
        ));
        Ok(row)
    }

    /// The cached read's CPU a request with every server offered the same load, `rate`
    /// requests a second (below the gateway's saturation, so below every server's): the
    /// trivial server, the audited floor and the gateway in turn, in up to three rounds;
    /// the note that reports it. A saturated run also charges the slower server for the load
    /// generator's threads preempting its own; this one does not.
    async fn cached_at_equal_load(
        &self,
        row: &mut Row,
        answer: &[u8],
        request: &Bytes,
        rate: f64,
    ) -> anyhow::Result<String> {
        let rate = (rate / 1e3).floor() * 1e3;
        let conns = self.conns_or(64);
        // (trivial, audited floor, gateway) CPU a request, a round each.
        let mut rounds: Vec<[f64; 3]> = Vec::new();
        for _ in 0..self.pairs.clamp(1, 3) {
            let trivial = crate::child::TrivialProcess::spawn(answer).await?;
            let server = (trivial.addr, trivial.pid);
            let label = "trivial server at the equal load";
            let (_, trivial_us) =
                reference_round(row, label, server, conns, request, self.bounds, Some(rate))
                    .await?;
            drop(trivial);
            let floor = crate::child::TrivialProcess::spawn_floor(
                &self.names[0],
                answer,
                crate::floor::Floor::Audited,
            )
            .await?;
            let server = (floor.addr, floor.pid);
            let label = "audited floor server at the equal load";
            let (_, floor_us) =
                reference_round(row, label, server, conns, request, self.bounds, Some(rate))
                    .await?;
            drop(floor);
            let server = (self.gateway.http_addr, self.gateway.pid);
            let label = "gateway at the equal load";
            let (_, gateway_us) =
                reference_round(row, label, server, conns, request, self.bounds, Some(rate))
                    .await?;
            rounds.push([trivial_us, floor_us, gateway_us]);
        }
        let of = |i: usize| median(rounds.iter().map(|round| round[i]));
        let (trivial_us, floor_us, gateway_us) = (of(0), of(1), of(2));
        row.ratio.push_str(&format!(
            "; at an equal offered load {:.2}× CPU",
            ratio(gateway_us, trivial_us)
        ));
        Ok(format!(
            "at an equal offered load ({:.0} k req/s, 0.8× the gateway's saturated throughput, {conns} paced connections; medians of {} rounds): gateway {gateway_us:.2} µs CPU/request, trivial server {trivial_us:.2} µs ({:.2}×), audited floor {floor_us:.2} µs ({:.2}× the trivial server's; the gateway {:.2}× the floor's); rounds (trivial/floor/gateway µs): {}",
            rate / 1e3,
            rounds.len(),
            ratio(gateway_us, trivial_us),
            ratio(floor_us, trivial_us),
            ratio(gateway_us, floor_us),
            rounds
                .iter()
                .map(|[t, f, g]| format!("{t:.2}/{f:.2}/{g:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// One server's round of the cached read (a reference server's, or the gateway's at an equal
/// load): its throughput and its CPU per request (warm-up included); errors noted under
/// `name`. Offered `rate` requests a second when given ([`crate::load::drive_paced`]), as
/// fast as it answers otherwise; a server that answered fewer than 97 % of the requests
/// offered is noted, as its CPU a request is then not at the load offered.
async fn reference_round(
    row: &mut Row,
    name: &str,
    (addr, pid): (std::net::SocketAddr, u32),
    conns: usize,
    request: &Bytes,
    bounds: Bounds,
    rate: Option<f64>,
) -> anyhow::Result<(f64, f64)> {
    let workers = rest_workers(addr, conns, VALUES_GET, |_| request.clone()).await?;
    let cpu = CpuSpan::of(pid);
    let run = match rate {
        Some(rate) => crate::load::drive_paced(workers, bounds, rate).await,
        None => drive(workers, bounds).await,
    };
    if run.errors > 0 {
        row.notes
            .push(format!("{name}: {} errors in a round", run.errors));
    }
    if let Some(rate) = rate
        && run.throughput() < rate * 0.97
    {
        row.notes.push(format!(
            "{name}: answered {:.1} k req/s of the {:.1} k offered",
            run.throughput() / 1e3,
            rate / 1e3
        ));
    }
    Ok((run.throughput(), cpu.per_request_us(run.requests * 6 / 5)))
}

/// The cached read's throughput and CPU parts (≥ 0.95×, ≤ 1.15× the trivial server), each as
/// (the gateway's medians met it, the audited floor met it in a round). `floor` and `trivial`
/// are each round's (req/s, CPU µs a request), round by round. The floor counts as meeting a
/// part when it did so in any round beside that round's trivial server: the medians of a few
/// rounds on a shared machine swing across the target, and "out of reach" is claimed only when
/// the floor missed the part in every round.
pub(super) fn cached_parts(
    throughput_ratio: f64,
    cpu_ratio: f64,
    floor: &[(f64, f64)],
    trivial: &[(f64, f64)],
) -> Vec<(bool, bool)> {
    let in_a_round = |met: fn(&(f64, f64), &(f64, f64)) -> bool| {
        floor
            .iter()
            .zip(trivial)
            .any(|(floor, trivial)| met(floor, trivial))
    };
    vec![
        (
            throughput_ratio >= 0.95,
            in_a_round(|floor, trivial| ratio(floor.0, trivial.0) >= 0.95),
        ),
        (
            cpu_ratio <= 1.15,
            in_a_round(|floor, trivial| ratio(floor.1, trivial.1) <= 1.15),
        ),
    ]
}

/// The cached read's nginx part (≥ 0.8× its throughput), as [`cached_parts`]: the gateway's
/// median against the floor round by round beside that round's nginx.
pub(super) fn nginx_part(
    to_nginx: f64,
    floor: &[(f64, f64)],
    nginx: &[(f64, f64)],
) -> (bool, bool) {
    let floor_met = floor
        .iter()
        .zip(nginx)
        .any(|(floor, nginx)| ratio(floor.0, nginx.0) >= 0.8);
    (to_nginx >= 0.8, floor_met)
}

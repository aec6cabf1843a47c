//! Scenario 6: READs through the gateway's legacy listener, beside the same READs straight to
//! the station.

use std::time::Duration;

use super::{Bench, direct_clients, fill_rate_row, ratio, read_workers};
use crate::load::drive;
use crate::report::{Row, Verdict, micros};
use crate::workers::DirectReadWorker;

impl Bench {
    /// 6. Reads through the gateway's legacy listener against reads straight to the simulator.
    pub async fn legacy(&self) -> Row {
        let conns = self.conns_or(8);
        let scenario = format!("Legacy port: READ of 1 channel, {conns} conns");
        let scenario = scenario.as_str();
        let Some(legacy_addr) = self.gateway.legacy_addr else {
            return Row::not_measurable(
                "6",
                scenario,
                "the gateway did not log a legacy listener address (`legacy byte-protocol listener on ADDR`)".to_owned(),
            );
        };
        let clients = match tokio::time::timeout(
            Duration::from_secs(5),
            direct_clients(legacy_addr, conns),
        )
        .await
        {
            Ok(Ok(clients)) => clients,
            Ok(Err(why)) => {
                return Row::not_measurable(
                    "6",
                    scenario,
                    format!("the legacy listener at {legacy_addr} did not answer HELLO: {why:#}"),
                );
            }
            Err(_) => {
                return Row::not_measurable(
                    "6",
                    scenario,
                    format!(
                        "the legacy listener at {legacy_addr} accepted nothing / answered no HELLO within 5 s (not served yet in this build)"
                    ),
                );
            }
        };
        let result: anyhow::Result<Row> = async {
            let mut row = Row::new("6", scenario);
            let names: Vec<String> = (0..conns)
                .map(|i| self.names[i % self.names.len()].clone())
                .collect();
            let baseline_workers = read_workers(self.station.addr, &names).await?;
            let baseline = drive(baseline_workers, self.bounds).await;
            let workers = clients
                .into_iter()
                .zip(&names)
                .map(|(client, name)| DirectReadWorker {
                    client,
                    names: vec![name.clone()],
                })
                .collect();
            let measured = drive(workers, self.bounds).await;
            fill_rate_row(
                &mut row,
                &measured,
                &baseline,
                &format!("direct to the station, {conns} conns"),
            );
            let overhead = measured.p50_us() - baseline.p50_us();
            let r = ratio(measured.throughput(), baseline.throughput());
            row.ratio = format!("{r:.2}× throughput; p50 +{}", micros(overhead));
            row.target = "(as forced read) p50 +≤ 50 µs; ≥ 0.8×".to_owned();
            row.verdict = Verdict::from_bool(overhead <= 50.0 && r >= 0.8 && measured.errors == 0);
            let one = direct_clients(legacy_addr, 1).await?.remove(0);
            let one = DirectReadWorker {
                client: one,
                names: vec![names[0].clone()],
            };
            row.notes
                .push(self.unloaded_side_by_side(&names[0], one).await?.note());
            Ok(row)
        }
        .await;
        result.unwrap_or_else(|why| Row::not_measurable("6", scenario, format!("{why:#}")))
    }
}

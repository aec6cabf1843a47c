//! Scenario 3's changes: `value/set` of one name and `values/set` of six, beside the same
//! WRITE frames straight to the station.

use serde_json::json;
use station_protocol::Value;

use super::{Bench, VALUE_SET, VALUES_SET, body, direct_clients, fill_rate_row, rest_workers};
use crate::load::drive;
use crate::report::Row;
use crate::workers::DirectWriteWorker;

impl Bench {
    /// 3b. value/set of VSET1, against a WRITE of it.
    pub async fn set_one(&self) -> anyhow::Result<Row> {
        let conns = self.conns_or(8);
        let mut row = Row::new("3b", format!("value/set VSET1, {conns} conns"));
        let name = "0.4.ESH10000662.VSET1";
        let clients = direct_clients(self.station.addr, conns).await?;
        let baseline_workers = clients
            .into_iter()
            .map(|client| DirectWriteWorker {
                client,
                items: vec![(name.to_owned(), Value::Float(100.0))],
            })
            .collect();
        let baseline = drive(baseline_workers, self.bounds).await;
        let request = body(json!({ "Name": name, "Value": "100" }));
        let workers = rest_workers(self.gateway.http_addr, conns, VALUE_SET, |_| {
            request.clone()
        })
        .await?;
        let measured = drive(workers, self.bounds).await;
        fill_rate_row(
            &mut row,
            &measured,
            &baseline,
            &format!("direct WRITE, {conns} conns"),
        );
        Ok(row)
    }

    /// 3c. values/set of 6 names, against one WRITE of them.
    pub async fn set_many(&self) -> anyhow::Result<Row> {
        let conns = self.conns_or(8);
        let mut row = Row::new(
            "3c",
            format!("values/set of 6 names (VSET1-4, ISET1-2), {conns} conns"),
        );
        let items: Vec<(String, f64)> = (1..=4)
            .map(|n| (format!("0.4.ESH10000662.VSET{n}"), 100.0))
            .chain((1..=2).map(|n| (format!("0.4.ESH10000662.ISET{n}"), 500.0)))
            .collect();
        let clients = direct_clients(self.station.addr, conns).await?;
        let baseline_workers = clients
            .into_iter()
            .map(|client| DirectWriteWorker {
                client,
                items: items
                    .iter()
                    .map(|(name, v)| (name.clone(), Value::Float(*v)))
                    .collect(),
            })
            .collect();
        let baseline = drive(baseline_workers, self.bounds).await;
        let resources: serde_json::Map<String, serde_json::Value> = items
            .iter()
            .map(|(name, v)| (name.clone(), json!(v.to_string())))
            .collect();
        let request = body(json!({ "Resources": resources }));
        let workers = rest_workers(self.gateway.http_addr, conns, VALUES_SET, |_| {
            request.clone()
        })
        .await?;
        let measured = drive(workers, self.bounds).await;
        fill_rate_row(
            &mut row,
            &measured,
            &baseline,
            &format!("direct WRITE of 6 items, {conns} conns"),
        );
        Ok(row)
    }
}

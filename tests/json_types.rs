//! Every response's JSON types against the types the .NET reference client binds
//! (`tests/data/dotnet_models.json`, written from its `WebApiClient/Models/*.cs`): a string where
//! .NET binds an int, a number above 255 where it binds a byte, an enum name it does not know,
//! all fail here, as they would throw in `JsonConvert.DeserializeObject`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use common::sse::Sse;
use common::*;
use reqwest::Method;
use serde_json::{Value as Json, json};

const TABLE: &str = include_str!("data/dotnet_models.json");
const OPENAPI: &str = include_str!("../docs/openapi.json");

struct Table(Json);

impl Table {
    fn load() -> Table {
        Table(serde_json::from_str(TABLE).expect("tests/data/dotnet_models.json is JSON"))
    }

    /// What the .NET client binds the answer of `label` to (`None`: it reads no body).
    fn endpoint(&self, label: &str) -> Option<&str> {
        let binds = self.0["endpoints"]
            .get(label)
            .unwrap_or_else(|| panic!("{label} is not in the table"));
        binds.as_str()
    }

    /// The type mismatches of `value` against the .NET type `ty`, each naming its JSON path.
    fn check(&self, ty: &str, value: &Json, at: &str) -> Vec<String> {
        let mut wrong = Vec::new();
        self.check_into(ty, value, at, &mut wrong);
        wrong
    }

    fn check_into(&self, ty: &str, value: &Json, at: &str, wrong: &mut Vec<String>) {
        let mut fail = |what: &str| wrong.push(format!("{at}: {what}, got {value}"));
        if let Some(inner) = ty.strip_suffix('?') {
            if !value.is_null() {
                self.check_into(inner, value, at, wrong);
            }
            return;
        }
        if let Some(item) = ty.strip_suffix("[]") {
            match value.as_array() {
                Some(items) => {
                    for (i, v) in items.iter().enumerate() {
                        self.check_into(item, v, &format!("{at}[{i}]"), wrong);
                    }
                }
                None => fail(&format!("{ty} needs an array")),
            }
            return;
        }
        if let Some(item) = ty.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            match value.as_object() {
                Some(map) => {
                    for (k, v) in map {
                        self.check_into(item, v, &format!("{at}.{k}"), wrong);
                    }
                }
                None => fail(&format!("Dictionary<string, {item}> needs an object")),
            }
            return;
        }
        let ok = match ty {
            "object" => true,
            "int" => value.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            "long" => value.as_i64().is_some(),
            "byte" => value.as_u64().is_some_and(|n| n <= 255),
            "uint" => value.as_u64().is_some_and(|n| n <= u64::from(u32::MAX)),
            "double" => value.is_number(),
            "bool" => value.is_boolean(),
            "string" => value.is_string(),
            "DateTime" | "DateTimeOffset" => value
                .as_str()
                .is_some_and(|s| s.len() >= 19 && s.as_bytes()[4] == b'-' && s.contains('T')),
            _ => {
                if let Some(model) = self.0["models"].get(ty) {
                    return self.check_model(ty, model, value, at, wrong);
                }
                let Some(en) = self.0["enums"].get(ty) else {
                    panic!("{ty} is neither a type nor a model nor an enum of the table");
                };
                let names: Vec<&str> = en["names"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap())
                    .collect();
                match value {
                    Json::Number(n) => n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
                    Json::String(s) if en["flags"] == true => {
                        s.split(',').all(|part| names.contains(&part.trim()))
                    }
                    Json::String(s) => names.contains(&s.as_str()),
                    _ => false,
                }
            }
        };
        if !ok {
            fail(&format!(".NET binds {ty}"));
        }
    }

    /// A model: each of its fields present in `value` (keys matched case-insensitively, as
    /// Newtonsoft does) has its field's type; absent fields keep their defaults in .NET.
    fn check_model(&self, ty: &str, model: &Json, value: &Json, at: &str, wrong: &mut Vec<String>) {
        let Some(object) = value.as_object() else {
            wrong.push(format!("{at}: .NET binds the object {ty}, got {value}"));
            return;
        };
        for (field, field_ty) in model["fields"].as_object().unwrap() {
            let found = object.iter().find(|(k, _)| k.eq_ignore_ascii_case(field));
            if let Some((key, v)) = found {
                self.check_into(field_ty.as_str().unwrap(), v, &format!("{at}.{key}"), wrong);
            }
        }
    }
}

#[test]
fn the_checker_refuses_what_dotnet_cannot_bind() {
    let table = Table::load();
    assert!(
        !table
            .check("CapabilitiesDto", &json!({"apiVersion": "1.0"}), "$")
            .is_empty()
    );
    assert!(
        !table
            .check("CapabilitiesDto", &json!({"codecVersion": 1.5}), "$")
            .is_empty()
    );
    assert!(
        table
            .check(
                "CapabilitiesDto",
                &json!({"apiVersion": 1, "features": []}),
                "$"
            )
            .is_empty()
    );
    let module = |revision: Json| json!({"modules": [{"revision": revision}]});
    assert!(
        !table
            .check("PhysicalSystemDto", &module(json!(256)), "$")
            .is_empty()
    );
    assert!(
        !table
            .check("PhysicalSystemDto", &module(json!("1")), "$")
            .is_empty()
    );
    assert!(
        table
            .check("PhysicalSystemDto", &module(json!(255)), "$")
            .is_empty()
    );
    // A flag name .NET lacks fails; the integer of any bits binds.
    assert!(
        !table
            .check("ChannelDto", &json!({"channelType": "Analog, Bit9"}), "$")
            .is_empty()
    );
    assert!(
        table
            .check("ChannelDto", &json!({"channelType": 512 | 1}), "$")
            .is_empty()
    );
    // `details` with a field of the wrong type (an audio device's Name is a string).
    assert!(
        !table
            .check("ChannelDto", &json!({"details": {"name": 3}}), "$")
            .is_empty()
    );
    assert!(
        !table
            .check(
                "ChannelDto",
                &json!({"details": {"destinationNets": "A"}}),
                "$"
            )
            .is_empty()
    );
    assert!(!table.check("ModuleStatus", &json!("Fine"), "$").is_empty());
    assert!(
        !table
            .check("StreamStateDto", &json!({"generation": null}), "$")
            .is_empty()
    );
}

/// The requests that exercise every endpoint with a body, each with its label in the table.
async fn exercise(rig: &Rig, table: &Table) -> Result<BTreeMap<String, Vec<String>>> {
    let mut found = BTreeMap::new();
    let mut record = |label: &str, status: u16, answer: &Json| {
        assert_eq!(status, 200, "{label}: {answer}");
        let ty = table
            .endpoint(label)
            .unwrap_or_else(|| panic!("{label} binds no type"));
        // The event stream's events are checked one by one below.
        let wrong = match ty {
            "events" => Vec::new(),
            _ => table.check(ty, answer, "$"),
        };
        found.insert(label.to_owned(), wrong);
    };
    for path in [
        "capabilities",
        "connection/status",
        "resources/names",
        "channels",
        "modules",
        "modules/loaded",
        "modules/physical-system",
        "modules/apps",
        "modules/apps/licensed",
        "application/name",
        "application/identification",
        "application/status",
        "application/log",
        "lease",
    ] {
        let (status, answer) = rig.get(path).await;
        record(&format!("GET api/{path}"), status, &answer);
    }
    let posts = [
        ("resources/value/get", json!({ "Name": MON_3V3 })),
        (
            "resources/values/get",
            json!({ "Names": [MON_3V3, VMON1], "MaxAgeMs": 5000 }),
        ),
        (
            "resources/transact",
            json!({ "Name": "0.ESH10000023.UART01", "Value": "*IDN?\n" }),
        ),
        ("channels/channel", json!({ "Alias": MON_3V3 })),
    ];
    for (path, body) in posts {
        let (status, answer) = rig.post(path, body).await;
        record(&format!("POST api/{path}"), status, &answer);
    }

    // The event stream's events, and subscriptions and the lease, which live beside it.
    let (mut sse, hello) = Sse::open_hello(rig).await?;
    record("GET api/events", 200, &json!({}));
    let events = &table.0["events"];
    let mut event_errors = table.check(events["hello"].as_str().unwrap(), &hello, "hello");
    let stream = hello["streamId"].as_str().context("no streamId")?;
    let (status, sub) = rig
        .post(
            "subscriptions",
            json!({ "StreamId": stream, "Channels": [VMON1, MON_3V3], "IntervalMs": 200 }),
        )
        .await;
    record("POST api/subscriptions", status, &sub);
    let id = sub["id"].as_str().context("no subscription id")?;
    let (status, renewed) = rig
        .send(
            Method::PUT,
            &format!("subscriptions/{id}"),
            Some(json!({ "Channels": [VMON1], "IntervalMs": 200 })),
        )
        .await;
    record("PUT api/subscriptions/{id}", status, &renewed);
    let values = sse.next_named("values", Duration::from_secs(5)).await?;
    event_errors.extend(table.check("ValuesEventDto", &values.data, "values"));
    let (status, lease) = rig
        .post("lease", json!({ "Owner": "json types", "TtlMs": 30000 }))
        .await;
    record("POST api/lease", status, &lease);
    let lease_event = sse.next_named("lease", Duration::from_secs(5)).await?;
    event_errors.extend(table.check("LeaseStateDto", &lease_event.data, "lease event"));
    let (status, held) = rig.get("lease").await;
    record("GET api/lease", status, &held);
    let lease_id = lease["leaseId"].as_str().context("no lease id")?;
    let (status, renewed) = rig
        .send(Method::PUT, &format!("lease/{lease_id}"), Some(json!({})))
        .await;
    record("PUT api/lease/{id}", status, &renewed);
    rig.release_lease(lease_id).await;
    // A reset: the link goes down and up (`connection`) and reports `configuration`.
    let (status, answer) = rig.post("application/reset", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    for name in ["connection", "configuration"] {
        let event = sse.next_named(name, Duration::from_secs(10)).await?;
        let ty = events[name].as_str().unwrap();
        event_errors.extend(table.check(ty, &event.data, name));
    }
    found.insert("events".into(), event_errors);
    Ok(found)
}

#[tokio::test]
async fn every_response_binds_to_the_dotnet_models() -> Result<()> {
    let rig = rig(|_| {}).await;
    let table = Table::load();
    let found = exercise(&rig, &table).await?;
    let wrong: Vec<&String> = found.values().flatten().collect();
    assert!(wrong.is_empty(), "types .NET cannot bind:\n{wrong:#?}");

    // Every endpoint the OpenAPI document says answers 200 is in the table, and every one of
    // them that binds a type was exercised above.
    let doc: Json = serde_json::from_str(OPENAPI)?;
    let mut answering = BTreeSet::new();
    for (path, operations) in doc["paths"].as_object().unwrap() {
        let Some(below) = path.strip_prefix("/") else {
            continue;
        };
        if !below.starts_with("api/") {
            continue;
        }
        let template: Vec<&str> = below
            .split('/')
            .map(|s| if s.starts_with('{') { "{id}" } else { s })
            .collect();
        for (method, operation) in operations.as_object().unwrap() {
            if operation["responses"].get("200").is_some() {
                answering.insert(format!("{} {}", method.to_uppercase(), template.join("/")));
            }
        }
    }
    for label in &answering {
        if table.endpoint(label).is_some() {
            assert!(
                found.contains_key(label),
                "{label} binds a type but was not exercised"
            );
        }
    }
    Ok(())
}

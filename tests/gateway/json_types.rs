//! Every response's JSON types against the types the reference clients bind
//! (`tests/data/dotnet_models.json`, each row re-derived from the .NET client's
//! `WebApiClient/Models/*.cs` at a named commit, or from `accordionq2` 5.28.1, or marked the
//! gateway's own; a test here keeps every row naming a source of one of those forms): a string where
//! .NET binds an int, a number above 255 where it binds a byte, an enum name it does not know,
//! all fail here, as they would throw in `JsonConvert.DeserializeObject`; a field the model has
//! (not nullable) that the answer lacks fails too, as .NET would silently read its default
//! (`IsConnected` false).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use common::sse::Sse;
use common::*;
use reqwest::Method;
use serde_json::{Value as Json, json};

const TABLE: &str = include_str!("../data/dotnet_models.json");
const OPENAPI: &str = include_str!("../../docs/openapi.json");

struct Table(Json);

impl Table {
    fn load() -> Table {
        Table(serde_json::from_str(TABLE).expect("tests/data/dotnet_models.json is JSON"))
    }

    /// What the .NET client binds the answer of `label` to (`None`: it reads no body): a type,
    /// or an object of `{id}` → type where the type depends on the path's `{id}`.
    fn endpoint(&self, label: &str) -> Option<&Json> {
        let binds = self.0["endpoints"]
            .get(label)
            .unwrap_or_else(|| panic!("{label} is not in the table"));
        (!binds.is_null()).then_some(binds)
    }

    /// The type the answer of `label` binds to, its path's `{id}` being `id`.
    fn binds(&self, label: &str, id: Option<&str>) -> &str {
        let binds = self
            .endpoint(label)
            .unwrap_or_else(|| panic!("{label} binds no type"));
        match (binds, id) {
            (Json::String(ty), _) => ty,
            (Json::Object(by_id), Some(id)) => by_id
                .get(id)
                .and_then(Json::as_str)
                .unwrap_or_else(|| panic!("{label}: the table has no type for {{id}} = {id}")),
            _ => panic!("{label}: the table's entry {binds} needs the path's {{id}}"),
        }
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
            "TimeSpan" => value.as_str().is_some_and(timespan_binds),
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
    /// Newtonsoft does) has its field's type, and each that is not nullable is present (.NET
    /// would read its default: a real station's answer has it).
    fn check_model(&self, ty: &str, model: &Json, value: &Json, at: &str, wrong: &mut Vec<String>) {
        let Some(object) = value.as_object() else {
            wrong.push(format!("{at}: .NET binds the object {ty}, got {value}"));
            return;
        };
        for (field, field_ty) in model["fields"].as_object().unwrap() {
            let field_ty = field_ty.as_str().unwrap();
            let found = object.iter().find(|(k, _)| k.eq_ignore_ascii_case(field));
            match found {
                Some((key, v)) => self.check_into(field_ty, v, &format!("{at}.{key}"), wrong),
                None if !field_ty.ends_with('?') => wrong.push(format!(
                    "{at}.{field}: missing; {ty} has it ({field_ty}) and .NET would read its default"
                )),
                None => {}
            }
        }
    }

    /// Like [`check`](Self::check), the types only: fields the value lacks are not counted
    /// (the checker's own tests, on partial values).
    fn check_types(&self, ty: &str, value: &Json, at: &str) -> Vec<String> {
        self.check(ty, value, at)
            .into_iter()
            .filter(|wrong| !wrong.contains(": missing; "))
            .collect()
    }

    /// An event's data against the model its name binds (`events` in the table): a field the
    /// model gives to another event only (`onlyIn`) may be absent.
    fn check_event(&self, event: &str, data: &Json) -> Vec<String> {
        let ty = self.0["events"][event]
            .as_str()
            .unwrap_or_else(|| panic!("no event {event} in the table"));
        let only_in = &self.0["models"][ty]["onlyIn"];
        self.check(ty, data, event)
            .into_iter()
            .filter(|wrong| {
                !only_in.as_object().is_some_and(|fields| {
                    fields.iter().any(|(field, owner)| {
                        owner != event && wrong.starts_with(&format!("{event}.{field}: missing"))
                    })
                })
            })
            .collect()
    }
}

/// What Newtonsoft reads as a `TimeSpan` (`TimeSpan.Parse`'s constant format):
/// `[-][d.]hh:mm:ss[.fffffff]`, hours below 24, minutes and seconds below 60.
fn timespan_binds(text: &str) -> bool {
    let text = text.strip_prefix('-').unwrap_or(text);
    let (clock, fraction) = match text.split_once('.') {
        // `d.hh:mm:ss`: the first dot comes before the first colon.
        Some((days, rest)) if !days.contains(':') => match rest.split_once('.') {
            Some((clock, fraction)) => {
                if !days.bytes().all(|b| b.is_ascii_digit()) || days.is_empty() {
                    return false;
                }
                (clock, Some(fraction))
            }
            None => {
                if !days.bytes().all(|b| b.is_ascii_digit()) || days.is_empty() {
                    return false;
                }
                (rest, None)
            }
        },
        Some((clock, fraction)) => (clock, Some(fraction)),
        None => (text, None),
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let limits = [24, 60, 60];
    let clock_ok = parts.len() == 3
        && parts.iter().zip(limits).all(|(part, limit)| {
            !part.is_empty() && part.len() <= 2 && part.parse::<u32>().is_ok_and(|n| n < limit)
        });
    let fraction_ok = fraction
        .is_none_or(|f| (1..=7).contains(&f.len()) && f.bytes().all(|b| b.is_ascii_digit()));
    clock_ok && fraction_ok
}

/// The .NET client's repository, the one repository the table's rows may cite.
const DOTNET_REPO: &str = "esharpab/esharp-accordion-projects-webapiclient";

/// Whether `source` (an entry of the table's `sources`) is of a form the table allows: a file
/// of the .NET client's repository at a full commit id, a file of the Python package
/// `accordionq2` 5.28.1 (the version the suite installs), or the gateway's own shape, naming
/// the page of this repository that documents it and why it is its own. What is wrong, if any.
fn source_form_is_wrong(source: &Json) -> Option<String> {
    let field = |key: &str| source.get(key).and_then(Json::as_str);
    let keys: BTreeSet<&str> = source.as_object()?.keys().map(String::as_str).collect();
    let is_commit = |c: &str| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit());
    if keys == BTreeSet::from(["repo", "file", "commit"]) {
        let (repo, file, commit) = (field("repo")?, field("file")?, field("commit")?);
        return (repo != DOTNET_REPO || !file.starts_with("WebApiClient/") || !is_commit(commit))
            .then(|| format!("not a file of {DOTNET_REPO} at a full commit id"));
    }
    if keys == BTreeSet::from(["package", "version", "file"]) {
        let ok = field("package") == Some("accordionq2")
            && field("version") == Some("5.28.1")
            && field("file").is_some_and(|f| f.starts_with("accordionq2/") && f.ends_with(".py"));
        return (!ok).then(|| "not a module of accordionq2 5.28.1".to_owned());
    }
    if keys == BTreeSet::from(["gateway", "why"]) {
        let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(field("gateway")?);
        let ok = page.is_file() && field("why").is_some_and(|why| !why.trim().is_empty());
        return (!ok).then(|| "the gateway's own needs a page of this repository and a why".into());
    }
    Some(format!("keys {keys:?} are no allowed form"))
}

/// Every row of the reference table (each enum, model, endpoint and event, and each field a
/// model takes from elsewhere) names a source, and every source is of an allowed form: a type
/// that came from nowhere has no row.
#[test]
fn every_row_of_the_reference_table_names_a_source_of_an_allowed_form() {
    let table = Table::load().0;
    let sources = table["sources"].as_object().expect("the table has sources");
    for (name, source) in sources {
        if let Some(wrong) = source_form_is_wrong(source) {
            panic!("source {name} ({source}): {wrong}");
        }
    }
    let mut cited = BTreeSet::new();
    let mut cite = |row: String, key: Option<&Json>| {
        let key = key
            .and_then(Json::as_str)
            .unwrap_or_else(|| panic!("{row} names no source"));
        assert!(sources.contains_key(key), "{row} names {key}, not a source");
        cited.insert(key.to_owned());
    };
    for (name, en) in table["enums"].as_object().unwrap() {
        cite(format!("enum {name}"), en.get("source"));
    }
    for (name, model) in table["models"].as_object().unwrap() {
        cite(format!("model {name}"), model.get("source"));
        for (field, key) in model["fieldSources"].as_object().into_iter().flatten() {
            assert!(
                model["fields"].get(field).is_some(),
                "{name}.{field} has a source but no row"
            );
            cite(format!("field {name}.{field}"), Some(key));
        }
    }
    let endpoints = table["endpoints"].as_object().unwrap();
    let endpoint_sources = table["endpointSources"].as_object().unwrap();
    assert_eq!(
        endpoints.keys().collect::<Vec<_>>(),
        endpoint_sources.keys().collect::<Vec<_>>(),
        "every endpoint has one source, in the same order"
    );
    for (label, key) in endpoint_sources {
        cite(format!("endpoint {label}"), Some(key));
    }
    let events = table["events"].as_object().unwrap();
    for event in events.keys() {
        cite(format!("event {event}"), table["eventSources"].get(event));
    }
    let unused: Vec<_> = sources.keys().filter(|k| !cited.contains(*k)).collect();
    assert!(unused.is_empty(), "sources no row names: {unused:?}");
    // The forms are checked, not just present.
    for (bad, why) in [
        (
            json!({"repo": DOTNET_REPO, "file": "WebApiClient/Models/X.cs", "commit": "7356d81"}),
            "short commit",
        ),
        (
            json!({"repo": "someone/else", "file": "WebApiClient/X.cs", "commit": "0".repeat(40)}),
            "another repository",
        ),
        (
            json!({"package": "accordionq2", "version": "5.27.0", "file": "accordionq2/models.py"}),
            "another version",
        ),
        (
            json!({"gateway": "docs/no-such-page.md", "why": "x"}),
            "no such page",
        ),
        (json!({"gateway": "docs/rest-api.md", "why": " "}), "no why"),
        (json!({"file": "WebApiClient/Models/X.cs"}), "no form"),
    ] {
        assert!(source_form_is_wrong(&bad).is_some(), "{why}: {bad}");
    }
}

#[test]
fn the_checker_refuses_what_dotnet_cannot_bind() {
    let table = Table::load();
    assert!(
        !table
            .check_types("CapabilitiesDto", &json!({"apiVersion": "1.0"}), "$")
            .is_empty()
    );
    assert!(
        !table
            .check_types("CapabilitiesDto", &json!({"codecVersion": 1.5}), "$")
            .is_empty()
    );
    assert!(
        table
            .check_types(
                "CapabilitiesDto",
                &json!({"apiVersion": 1, "features": []}),
                "$"
            )
            .is_empty()
    );
    let module = |revision: Json| json!({"modules": [{"revision": revision}]});
    assert!(
        !table
            .check_types("PhysicalSystemDto", &module(json!(256)), "$")
            .is_empty()
    );
    assert!(
        !table
            .check_types("PhysicalSystemDto", &module(json!("1")), "$")
            .is_empty()
    );
    assert!(
        table
            .check_types("PhysicalSystemDto", &module(json!(255)), "$")
            .is_empty()
    );
    // A flag name .NET lacks fails; the integer of any bits binds.
    assert!(
        !table
            .check_types("ChannelDto", &json!({"channelType": "Analog, Bit9"}), "$")
            .is_empty()
    );
    assert!(
        table
            .check_types("ChannelDto", &json!({"channelType": 512 | 1}), "$")
            .is_empty()
    );
    // `details` with a field of the wrong type (an audio device's Name is a string).
    assert!(
        !table
            .check_types("ChannelDto", &json!({"details": {"name": 3}}), "$")
            .is_empty()
    );
    assert!(
        !table
            .check_types(
                "ChannelDto",
                &json!({"details": {"destinationNets": "A"}}),
                "$"
            )
            .is_empty()
    );
    assert!(!table.check("ModuleStatus", &json!("Fine"), "$").is_empty());
    // TimeSpan: .NET's constant format, not milliseconds nor ISO 8601.
    for good in ["00:00:00.1000000", "01:02:05", "1.02:03:04.5", "-00:00:01"] {
        assert!(
            table.check("TimeSpan", &json!(good), "$").is_empty(),
            "{good}"
        );
    }
    for bad in [
        json!(100),
        json!("PT0.1S"),
        json!("00:60:00"),
        json!("1:2"),
        json!("00:00:00.12345678"),
    ] {
        assert!(!table.check("TimeSpan", &bad, "$").is_empty(), "{bad}");
    }
    assert!(
        !table
            .check_types("NumericStatsDto", &json!({"count": 3, "mean": "1.0"}), "$")
            .is_empty()
    );
    assert!(
        table
            .check_types("NumericStatsDto", &json!({"count": 1, "stdev": null}), "$")
            .is_empty()
    );
    assert!(
        !table
            .check_types(
                "BusTransactionResponse",
                &json!({"numberOfBytesReceived": "2"}),
                "$"
            )
            .is_empty()
    );
    assert!(
        !table
            .check_types("StreamStateDto", &json!({"generation": null}), "$")
            .is_empty()
    );
    // A field the model has and the answer lacks: .NET would read its default.
    let configuration = json!({"changeType": "Changed", "generation": 2});
    assert_eq!(
        table.check_event("configuration", &configuration),
        [
            "configuration.IsConnected: missing; StreamStateDto has it (bool) and .NET would read its default"
        ]
    );
    let with_it = json!({"isConnected": true, "changeType": "Changed", "generation": 2});
    assert!(table.check_event("configuration", &with_it).is_empty());
    // ApiVersion is hello's: absent elsewhere, required there.
    assert!(
        !table
            .check_event("hello", &json!({"isConnected": true, "generation": 1}))
            .is_empty()
    );
    // A nullable field may be absent.
    assert!(
        table
            .check(
                "LeaseStateDto",
                &json!({"held": false, "expiresInMs": 0.0}),
                "$"
            )
            .is_empty()
    );
}

/// The requests that exercise every endpoint with a body, each with its label in the table.
async fn exercise(rig: &Rig, table: &Table) -> Result<BTreeMap<String, Vec<String>>> {
    let mut found = BTreeMap::new();
    let mut record = |label: &str, status: u16, answer: &Json| {
        record_in(&mut found, table, label, None, status, answer);
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
    let mut event_errors = table.check_event("hello", &hello);
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
    event_errors.extend(table.check_event("values", &values.data));
    let (status, lease) = rig
        .post("lease", json!({ "Owner": "json types", "TtlMs": 30000 }))
        .await;
    record("POST api/lease", status, &lease);
    let lease_event = sse.next_named("lease", Duration::from_secs(5)).await?;
    event_errors.extend(table.check_event("lease", &lease_event.data));
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
        event_errors.extend(table.check_event(name, &event.data));
    }
    found.insert("events".into(), event_errors);
    // The channels as a real station gives them after a reset: every field, details included.
    rig.connected().await;
    let (status, channels) = rig.get("channels").await;
    record_in(
        &mut found,
        table,
        "GET api/channels",
        None,
        status,
        &channels,
    );
    exercise_buses(rig, table, &mut found).await;
    exercise_numeric_results(rig, table, &mut found).await;
    exercise_configuration(rig, table, &mut found).await;
    // And after a configure and a load.
    let (status, channels) = rig.get("channels").await;
    record_in(
        &mut found,
        table,
        "GET api/channels",
        None,
        status,
        &channels,
    );
    let (status, log) = rig.get("audit/log?tail=20").await;
    record_in(&mut found, table, "GET api/audit/log", None, status, &log);
    Ok(found)
}

/// Checks `answer` (which must be a 200) against what `label` binds, `id` being its path's
/// `{id}`, and keeps what does not bind under `label`.
fn record_in(
    found: &mut BTreeMap<String, Vec<String>>,
    table: &Table,
    label: &str,
    id: Option<&str>,
    status: u16,
    answer: &Json,
) {
    assert_eq!(status, 200, "{label}: {answer}");
    // The event stream's events are checked one by one.
    let wrong = match table.binds(label, id) {
        "events" => Vec::new(),
        ty => table.check(
            ty,
            answer,
            &format!("${}", id.map(|i| format!("({i})")).unwrap_or_default()),
        ),
    };
    found.entry(label.to_owned()).or_default().extend(wrong);
}

/// A request the .NET client reads no body of: it only needs the success.
fn no_body(table: &Table, label: &str, status: u16, answer: &impl std::fmt::Display) {
    assert!(
        table.endpoint(label).is_none(),
        "{label} binds a type: check its answer"
    );
    assert!((200..300).contains(&status), "{label}: {status} {answer}");
}

const I2C: &str = "0.ESH10000023.I2C09";
const UART: &str = "0.ESH10000023.UART01";
const SPI: &str = "0.ESH10000023.SPI01";
const ADC_NR: &str = "0.8.ESH10000590.NumericResult";
const ADC01: &str = "0.8.ESH10000590.ADC01";

/// `api/comm/*`: transactions that receive bytes, so `received` is not empty.
async fn exercise_buses(rig: &Rig, table: &Table, found: &mut BTreeMap<String, Vec<String>>) {
    let transactions = [
        (
            "i2c",
            json!({ "DeviceName": I2C, "Address": "00", "Action": "Scan" }),
        ),
        (
            "i2c",
            json!({ "DeviceName": I2C, "Address": "50", "Action": "SendReceive",
                    "DataToSend": "00", "NumberOfBytesToReceive": 2 }),
        ),
        (
            "uart",
            json!({ "DeviceName": UART, "Action": "SendReceive", "DataToSend": "2A49444E3F0A",
                    "NumberOfBytesToReceive": 64, "UseTerminationByte": true,
                    "TerminationByte": "0A", "TimeoutMs": 1000 }),
        ),
        (
            "spi",
            json!({ "DeviceName": SPI, "Action": "SendReceive", "DataToSend": "010000",
                    "NumberOfBytesToReceive": 3 }),
        ),
    ];
    for (bus, body) in transactions {
        let (status, answer) = rig.post(&format!("comm/{bus}"), body).await;
        record_in(
            found,
            table,
            &format!("POST api/comm/{bus}"),
            None,
            status,
            &answer,
        );
    }
}

/// `api/numeric-results/*`: the channels, a one-call acquisition with limits (so `cp` and
/// `cpk` are there), a kept measurement with its samples, and every statistic of it.
async fn exercise_numeric_results(
    rig: &Rig,
    table: &Table,
    found: &mut BTreeMap<String, Vec<String>>,
) {
    let (status, channels) = rig.get("numeric-results/channels").await;
    record_in(
        found,
        table,
        "GET api/numeric-results/channels",
        None,
        status,
        &channels,
    );
    let query = format!("channel={ADC_NR}");
    let (status, targets) = rig.get(&format!("numeric-results/targets?{query}")).await;
    record_in(
        found,
        table,
        "GET api/numeric-results/targets",
        None,
        status,
        &targets,
    );
    let (status, acquired) = rig
        .post(
            "numeric-results/acquire",
            json!({ "Channel": ADC_NR, "Target": ADC01, "Samples": 50, "Lsl": -10.0, "Usl": 10.0 }),
        )
        .await;
    record_in(
        found,
        table,
        "POST api/numeric-results/acquire",
        None,
        status,
        &acquired,
    );
    let (status, measured) = rig
        .post(
            "numeric-results/measure",
            json!({ "ChannelNetName": ADC_NR, "TargetNetName": ADC01, "Samples": 50, "ReducedSet": false }),
        )
        .await;
    record_in(
        found,
        table,
        "POST api/numeric-results/measure",
        None,
        status,
        &measured,
    );
    for statistic in ["mean", "min", "max", "stdev", "samples"] {
        let (status, value) = rig
            .get(&format!("numeric-results/result/{statistic}?{query}"))
            .await;
        let label = "GET api/numeric-results/result/{id}";
        record_in(found, table, label, Some(statistic), status, &value);
    }
    // One sample has no deviation: .NET's `GetStdDevAsync` binds a double and Python's
    // `get_stdev` a float, so a 200 with `null` would throw in both; it is a 400 naming why.
    let (status, measured) = rig
        .post(
            "numeric-results/measure",
            json!({ "ChannelNetName": ADC_NR, "TargetNetName": ADC01, "Samples": 1 }),
        )
        .await;
    record_in(
        found,
        table,
        "POST api/numeric-results/measure",
        None,
        status,
        &measured,
    );
    for statistic in ["mean", "min", "max"] {
        let (status, value) = rig
            .get(&format!("numeric-results/result/{statistic}?{query}"))
            .await;
        let label = "GET api/numeric-results/result/{id}";
        record_in(found, table, label, Some(statistic), status, &value);
    }
    let (status, answer) = rig
        .get(&format!("numeric-results/result/stdev?{query}"))
        .await;
    assert_eq!(status, 400, "stdev of one sample: {answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("stdev") && message.contains("2 samples"),
        "{answer}"
    );
}

/// Channel configuration and the configuration files: save, list, load, loaded, download,
/// upload (multipart, as the clients send it) and delete.
async fn exercise_configuration(
    rig: &Rig,
    table: &Table,
    found: &mut BTreeMap<String, Vec<String>>,
) {
    let (status, answer) = rig
        .post(
            "channels/channel/configure",
            json!({ "NetName": VSET1, "Description": "json types" }),
        )
        .await;
    no_body(
        table,
        "POST api/channels/channel/configure",
        status,
        &answer,
    );
    let (status, answer) = rig
        .post(
            "channels/configure",
            json!([{ "NetName": VSET1, "Description": "json types, again" }]),
        )
        .await;
    no_body(table, "POST api/channels/configure", status, &answer);

    let file = json!({ "FileName": "json-types.cfg" });
    let (status, answer) = rig.post("application/config/save", file.clone()).await;
    no_body(table, "POST api/application/config/save", status, &answer);
    let (status, list) = rig.get("application/config/list").await;
    record_in(
        found,
        table,
        "GET api/application/config/list",
        None,
        status,
        &list,
    );
    let (status, answer) = rig.post("application/config/load", file).await;
    no_body(table, "POST api/application/config/load", status, &answer);
    let (status, loaded) = rig.get("application/config/loaded").await;
    record_in(
        found,
        table,
        "GET api/application/config/loaded",
        None,
        status,
        &loaded,
    );
    assert_eq!(loaded, json!(["json-types.cfg"]));

    let response = rig
        .http
        .get(rig.url("application/config/download/json-types.cfg"))
        .send()
        .await
        .expect("the download answers");
    let status = response.status().as_u16();
    let data = response.bytes().await.expect("the download's bytes");
    no_body(
        table,
        "GET api/application/config/download/{id}",
        status,
        &String::from_utf8_lossy(&data),
    );
    let boundary = "json-types-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"copy.cfg\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let response = rig
        .http
        .post(rig.url("application/config/upload"))
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .expect("the upload answers");
    let status = response.status().as_u16();
    let answer = response.text().await.unwrap_or_default();
    no_body(table, "POST api/application/config/upload", status, &answer);
    let (status, list) = rig.get("application/config/list").await;
    record_in(
        found,
        table,
        "GET api/application/config/list",
        None,
        status,
        &list,
    );
    assert!(
        list.as_array().unwrap().contains(&json!("copy.cfg")),
        "{list}"
    );
    let (status, answer) = rig
        .send(Method::DELETE, "application/config/copy.cfg", None)
        .await;
    no_body(table, "DELETE api/application/config/{id}", status, &answer);
}

#[tokio::test]
async fn every_response_binds_to_the_dotnet_models() -> Result<()> {
    let dir =
        std::env::temp_dir().join(format!("station-gateway-json-types-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rig = rig(|c| c.config_files.dir = dir.clone()).await;
    let table = Table::load();
    let found = exercise(&rig, &table).await?;
    let _ = std::fs::remove_dir_all(&dir);
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

/// A body that starts with a UTF-8 byte-order mark (as Windows tools write JSON) is read as the
/// JSON after it, not refused with 400 "not JSON".
#[tokio::test]
async fn a_body_with_a_utf8_byte_order_mark_is_read() {
    let rig = rig(|_| {}).await;
    let mut body = b"\xEF\xBB\xBF".to_vec();
    body.extend_from_slice(json!({ "Name": MON_3V3 }).to_string().as_bytes());
    let response = rig
        .http
        .post(rig.url("resources/value/get"))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let answer: Json = response.json().await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["value"].as_str().unwrap().starts_with("3."),
        "{answer}"
    );
}

/// A name no channel has is quoted in the 404, so an empty name or a trailing space shows
/// (`no such resource: ` alone would name nothing visible).
#[tokio::test]
async fn an_unknown_name_is_quoted_so_an_empty_one_or_a_trailing_space_shows() {
    let rig = rig(|_| {}).await;
    for (asked, said) in [
        ("", "no such resource: \"\""),
        (
            "0.1.ESH10000158.MON_3V3 ",
            "no such resource: \"0.1.ESH10000158.MON_3V3 \"",
        ),
    ] {
        let (status, answer) = rig
            .post("resources/value/get", json!({ "Name": asked }))
            .await;
        assert_eq!(status, 404, "{asked:?}: {answer}");
        assert_eq!(answer["error"], said, "{asked:?}");
    }
}

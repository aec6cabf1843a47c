//! `api/resources/...`: channel names, reads (forced and cached) and writes, through the
//! station service.

use foldhash::{HashSet, HashSetExt};

use serde_json::{Value as Json, json};
use station_protocol::ItemResult;

use super::call::{Answer, Call, answered, known_channels, ok, reached_now};
use crate::config::Role;
use crate::credentials::AccessError;
use crate::error::ApiError;
use crate::link::ChannelTable;
use crate::reply::json_bytes_response;
use crate::requests::resources::{
    ResourceNameRequest, ResourceValueRequest, ResourceValuesRequest, ResourceValuesSetRequest,
    item,
};
use crate::station::{
    ChangeAnswer, ChangeWhat, ConsumingRule, ItemError, ItemReading, ReadError, ReadPolicy,
    UnknownRule,
};

/// `GET api/resources/names`.
/// `GET api/resources/names`.
pub(super) async fn names(call: Call<'_>) -> Answer {
    let channels = known_channels(call.gateway)?;
    ok(Json::Array(
        channels
            .channels
            .iter()
            .map(|ch| Json::String(ch.name.clone()))
            .collect(),
    ))
}

/// `POST api/resources/value/get {Name}`: a forced read.
pub(super) async fn value_get(call: Call<'_>, request: ResourceNameRequest) -> Answer {
    let value = read_one(&call, request.name).await?;
    // `{"value":"..."}` written straight into bytes, as `values/get` is: the forced read's path.
    let mut out = Vec::with_capacity(16 + value.len());
    out.extend_from_slice(b"{\"value\":");
    write_json_str(&mut out, value.as_str());
    out.push(b'}');
    Ok(json_bytes_response(out))
}

/// `POST api/resources/value/set {Name, Value}`.
pub(super) async fn value_set(call: Call<'_>, request: ResourceValueRequest) -> Answer {
    let (name, text) = request.checked()?;
    let (name, value) = item(name, &text, &*known_channels(call.gateway)?)?;
    let names = vec![name.clone()];
    let report = call.change(ChangeWhat::Write(vec![(name, value)])).await?;
    let results = answered(report, ChangeAnswer::written)?;
    first_item_error(&names, &results)?;
    ok(json!({}))
}

/// `POST api/resources/values/get {Names, MaxAgeMs?}`.
///
/// Not an `async fn`: one keeps its argument twice in its state, as passed and as bound, and
/// this is the hot read path, its future boxed for every request.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its Call twice in its state"
)]
pub(super) fn values_get(
    call: Call<'_>,
    request: ResourceValuesRequest,
) -> impl Future<Output = Answer> + Send + '_ {
    async move {
        let answer = read_many(&call, request).await?;
        Ok(json_bytes_response(answer))
    }
}

/// `POST api/resources/values/set {Resources}`.
pub(super) async fn values_set(call: Call<'_>, request: ResourceValuesSetRequest) -> Answer {
    ok(write_many(&call, request).await?)
}

/// `POST api/resources/transact {Name, Value}`: write and read back in one step.
pub(super) async fn transact(call: Call<'_>, request: ResourceValueRequest) -> Answer {
    let (name, text) = request.checked()?;
    let (name, value) = item(name, &text, &*known_channels(call.gateway)?)?;
    let report = call.change(ChangeWhat::Transact { name, value }).await?;
    let answer = answered(report, ChangeAnswer::transacted)?;
    ok(json!({ "value": answer.render() }))
}

/// Checks every name against the channel list; 404 names the first unknown one.
fn check_names(channels: &ChannelTable, names: &[String]) -> Result<(), ApiError> {
    match names.iter().find(|name| channels.get(name).is_none()) {
        Some(unknown) => Err(ApiError::no_such_resource(unknown)),
        None => Ok(()),
    }
}

fn first_item_error<T>(names: &[String], results: &[ItemResult<T>]) -> Result<(), ApiError> {
    for (name, result) in names.iter().zip(results) {
        if let Err(error) = result {
            let mut api = ApiError::from(error.clone());
            if !api.message.contains(name.as_str()) {
                api.message = format!("{name}: {}", api.message);
            }
            return Err(api);
        }
    }
    Ok(())
}

/// A forced read of the body's `Name`: its value as text.
async fn read_one(call: &Call<'_>, name: String) -> Result<String, ApiError> {
    let gateway = call.gateway;
    check_names(&reached_now(gateway)?.channels, std::slice::from_ref(&name))?;
    let names = vec![name];
    let who = call.who_if_rules();
    let mut policy = ReadPolicy::hardware(Some(call.peer), call.admitted.guard.as_ref());
    policy.consuming = consuming_rule(call.granted);
    policy.who = who.as_ref();
    let readings = gateway
        .station
        .read(&names, policy)
        .await
        .map_err(|error| read_refused(call, error))?;
    first_reading_error(&names, &readings)?;
    let reading = readings.into_iter().next().and_then(Result::ok);
    Ok(reading.map(|r| r.value.render()).unwrap_or_default())
}

/// Reads that consume data are changes: with access control on, they need the control role.
fn consuming_rule(granted: Option<Role>) -> ConsumingRule {
    match granted {
        Some(role) if role < Role::Control => ConsumingRule::NeedsControl,
        _ => ConsumingRule::Read,
    }
}

/// A read refused as a whole, as the client sees it: 423 for a non-holder's cached read of a
/// channel with nothing cached (naming the holder), 403 for a consuming read without the
/// control role.
fn read_refused(call: &Call<'_>, error: ReadError) -> ApiError {
    match error {
        ReadError::NotCached { name, consuming } => {
            match call.admitted.refuse_uncached(&name, consuming) {
                Some(refusal) => ApiError::from(refusal),
                None => ApiError::locked(format!("{name}: not cached")),
            }
        }
        ReadError::NeedsControl(name) => {
            let granted = call.granted.unwrap_or(Role::Read);
            let mut api = ApiError::from(AccessError::Forbidden {
                needed: Role::Control,
                granted,
            });
            api.message = format!(
                "reading {name} from the hardware consumes its data, which is a change: {}",
                api.message
            );
            api
        }
        ReadError::AccessDenied(refusal) => ApiError::from(crate::link::LinkError::Refused(
            crate::link::GuardRefusal::from(refusal),
        )),
    }
}

/// The first failure of a REST read, if it has one: a link failure for the whole read, else
/// the first name the station refused (named in the message). Checked in place: every reading
/// is then `Ok`.
fn first_reading_error(names: &[String], readings: &[ItemReading]) -> Result<(), ApiError> {
    if let Some(Err(ItemError::Link(error))) = readings
        .iter()
        .find(|reading| matches!(reading, Err(ItemError::Link(_))))
    {
        return Err(ApiError::from(error.clone()));
    }
    for (name, reading) in names.iter().zip(readings) {
        if let Err(error) = reading {
            let mut api = match error {
                ItemError::Station(station) => ApiError::from(station.clone()),
                ItemError::Link(link) => ApiError::from(link.clone()),
                other => ApiError::station_failed(other.to_string()),
            };
            if !api.message.contains(name.as_str()) {
                api.message = format!("{name}: {}", api.message);
            }
            return Err(api);
        }
    }
    Ok(())
}

/// `values/get`: `{"resources": {name: value}, "ageMs": {name: age}}`, each name once, in the
/// order first asked. Written straight into bytes: this is the hot read path (every cached
/// read and every batch), and a `serde_json::Value` tree of two maps cost more than the rest
/// of the request.
async fn read_many(call: &Call<'_>, request: ResourceValuesRequest) -> Result<Vec<u8>, ApiError> {
    let (gateway, admitted, peer) = (call.gateway, &call.admitted, call.peer);
    // Only the holder reads the hardware: every value's true age goes with it.
    let (names, freshness) = request.names_and_freshness(admitted.cache_only.is_some())?;
    check_names(&reached_now(gateway)?.channels, &names)?;
    let who = call.who_if_rules();
    let policy = ReadPolicy {
        freshness,
        consuming: consuming_rule(call.granted),
        unknown: UnknownRule::AskStation,
        caller: Some(peer),
        cancel: None,
        guard: admitted.guard.as_ref(),
        who: who.as_ref(),
    };
    let readings = gateway
        .station
        .read(&names, policy)
        .await
        .map_err(|error| read_refused(call, error))?;
    first_reading_error(&names, &readings)?;
    // Each name once, where it was first asked, with that first reading (every reading is
    // `Ok` here; `null` would stand for one that is not).
    let listed = first_of_each(&names);
    let mut out = Vec::with_capacity(32 + listed.len() * 64);
    out.extend_from_slice(b"{\"resources\":");
    write_object(&mut out, &names, &listed, |out, at| match &readings[at] {
        Ok(reading) => write_json_str(out, reading.value.render().as_str()),
        Err(_) => out.extend_from_slice(b"null"),
    });
    out.extend_from_slice(b",\"ageMs\":");
    write_object(&mut out, &names, &listed, |out, at| match &readings[at] {
        Ok(reading) => write_json(out, &reading.age_ms()),
        Err(_) => out.extend_from_slice(b"null"),
    });
    out.push(b'}');
    Ok(out)
}

/// The positions in `names` of each name's first appearance, in order. Small lists (every
/// client's) are searched as they are; long ones through a set.
fn first_of_each(names: &[String]) -> Vec<usize> {
    const SEARCHED_AS_IS: usize = 16;
    if names.len() <= SEARCHED_AS_IS {
        return (0..names.len())
            .filter(|&at| !names[..at].contains(&names[at]))
            .collect();
    }
    let mut seen: HashSet<&str> = HashSet::with_capacity(names.len());
    (0..names.len())
        .filter(|&at| seen.insert(names[at].as_str()))
        .collect()
}

/// Appends `{"name": value, ...}` for the names at `listed`, in that order, each value
/// written by `write_value` from its position.
fn write_object(
    out: &mut Vec<u8>,
    names: &[String],
    listed: &[usize],
    write_value: impl Fn(&mut Vec<u8>, usize),
) {
    out.push(b'{');
    for (i, &at) in listed.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_json_str(out, names[at].as_str());
        out.push(b':');
        write_value(out, at);
    }
    out.push(b'}');
}

/// Appends `value` as JSON. Only strings and numbers are written this way, and writing those
/// into a `Vec` cannot fail.
fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    let _ = serde_json::to_writer(out, value);
}

/// Appends `text` as a JSON string, byte for byte as [`write_json`] would: between quotes as
/// it is when nothing in it needs escaping (every channel name and value text the station
/// has), through `serde_json` otherwise. A third of the cost for a cached read's three strings.
fn write_json_str(out: &mut Vec<u8>, text: &str) {
    // JSON escapes only control characters, `"` and `\`; other bytes (UTF-8 too) go as they are.
    // Without a branch for each byte, which the compiler turns into a few wide compares.
    let escaped = text.as_bytes().iter().fold(0u8, |any, &b| {
        any | u8::from(b < 0x20) | u8::from(b == b'"') | u8::from(b == b'\\')
    });
    if escaped == 0 {
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        write_json(out, text);
    }
}

async fn write_many(call: &Call<'_>, request: ResourceValuesSetRequest) -> Result<Json, ApiError> {
    let items = request.into_items(&*known_channels(call.gateway)?)?;
    if items.is_empty() {
        return Ok(json!({}));
    }
    let names: Vec<String> = items.iter().map(|(name, _)| name.clone()).collect();
    let report = call.change(ChangeWhat::Write(items)).await?;
    let results = answered(report, ChangeAnswer::written)?;
    if results.iter().all(Result::is_ok) {
        return Ok(json!({}));
    }
    // Say exactly what was and was not applied: a POST is never half-applied silently.
    let mut failed = Vec::new();
    let mut applied = Vec::new();
    let mut kind = crate::error::ErrorKind::BadRequest;
    for (name, result) in names.iter().zip(&results) {
        match result {
            Ok(()) => applied.push(name.as_str()),
            Err(error) => {
                if failed.is_empty() {
                    kind = ApiError::from(error.clone()).kind;
                }
                // The station's message usually names the channel already.
                if error.message.contains(name.as_str()) {
                    failed.push(error.message.clone());
                } else {
                    failed.push(format!("{name}: {}", error.message));
                }
            }
        }
    }
    let applied = if applied.is_empty() {
        "none".to_owned()
    } else {
        applied.join(", ")
    };
    Err(ApiError::new(
        kind,
        format!("not applied: {}; applied: {applied}", failed.join("; ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::{first_of_each, write_json_str};

    #[test]
    fn a_json_string_is_written_as_serde_json_writes_it() {
        for text in [
            "",
            "0.1.ESH10000158.MON_3V3",
            "3.288",
            "Grüße, µA",
            "a \"quoted\" name",
            "back\\slash",
            "tab\there",
            "line\nbreak",
            "\u{1}\u{1f}\u{7f}",
        ] {
            let mut ours = Vec::new();
            write_json_str(&mut ours, text);
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string(text).unwrap(),
                "{text:?}"
            );
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn each_name_is_listed_once_where_it_was_first_asked() {
        assert_eq!(first_of_each(&names(&["b", "a", "b", "c", "a"])), [0, 1, 3]);
        assert_eq!(first_of_each(&names(&[])), Vec::<usize>::new());
        // A long list (through the set) the same way.
        let long: Vec<String> = (0..40).map(|i| format!("n{}", i % 25)).collect();
        assert_eq!(first_of_each(&long), (0..25).collect::<Vec<_>>());
        let mut reversed = long.clone();
        reversed.reverse();
        // Reversed, the first appearances are of n14 down to n0 (positions 0..15), then n24
        // down to n15 (positions 15..25).
        assert_eq!(first_of_each(&reversed), (0..25).collect::<Vec<_>>());
    }
}

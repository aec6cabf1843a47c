//! Unit tests of typed bodies: names in any case, `null` as absent, unknown fields ignored,
//! and the messages of the field-by-field reads.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value as Json;

use super::*;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Read {
    names: StringList,
    max_age_ms: Option<Whole>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Named {
    name: String,
    note: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Outer {
    inner: Inner,
    options: Option<BTreeMap<String, Inner>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Inner {
    interval_ms: Whole,
}

fn typed<'de, T: Deserialize<'de>>(body: &'de JsonBody) -> Result<T, String> {
    body.typed::<T>().map_err(|error| error.message)
}

fn body(text: &str) -> JsonBody {
    JsonBody::parse(text.as_bytes()).unwrap()
}

#[test]
fn fields_bind_in_any_letter_case_as_get_binds_them() {
    for text in [
        r#"{"Names": ["a"], "MaxAgeMs": 5}"#,
        r#"{"names": ["a"], "maxAgeMs": 5}"#,
        r#"{"NAMES": ["a"], "MAXAGEMS": 5.0}"#,
        "\u{feff}{\"names\": [\"a\"], \"maxagems\": 5}",
    ] {
        let body = JsonBody::parse(text.as_bytes()).unwrap();
        let read: Read = typed(&body).unwrap();
        assert_eq!(read.names.0, ["a"], "{text}");
        assert_eq!(read.max_age_ms, Some(Whole(5)), "{text}");
    }
    // The one `get` finds: the last of a repeated name, the first spelling in byte order.
    for text in [
        r#"{"Name": "A", "Name": "B"}"#,
        r#"{"name": "low", "NAME": "up", "Name": "mixed"}"#,
        r#"{"Name": null, "name": "A"}"#,
        r#"{"name": "A", "Name": null}"#,
    ] {
        let body = body(text);
        let named: Result<Named, String> = typed(&body);
        let by_get = body.string("Name").map_err(|error| error.message);
        assert_eq!(named.map(|n| n.name), by_get.map(str::to_owned), "{text}");
    }
}

#[test]
fn a_missing_or_null_field_is_missing_and_an_optional_one_none() {
    assert_eq!(
        typed::<Named>(&body("{}")).unwrap_err(),
        "the field Name is missing"
    );
    assert_eq!(
        typed::<Named>(&body(r#"{"Name": null}"#)).unwrap_err(),
        "the field Name is missing"
    );
    assert_eq!(
        typed::<Named>(&body("")).unwrap_err(),
        "the field Name is missing"
    );
    let named: Named = typed(&body(r#"{"Name": "x", "Note": null}"#)).unwrap();
    assert_eq!(named.note, None);
    let read: Read = typed(&body(r#"{"Names": []}"#)).unwrap();
    assert_eq!(read.max_age_ms, None);
}

#[test]
fn unknown_fields_are_ignored() {
    let named: Named = typed(&body(
        r#"{"Name": "x", "Extra": [1, {"a": null}], "PortName": "COM3"}"#,
    ))
    .unwrap();
    assert_eq!(named.name, "x");
}

/// Each message as `JsonBody`'s field reads gave it, for the same body.
#[test]
fn wrong_types_are_refused_in_the_words_of_the_field_reads() {
    for text in [
        r#"{"Name": 5}"#,
        r#"{"Name": true}"#,
        r#"{"Name": ["a"]}"#,
        r#"{"Name": {"a": 1}}"#,
        r#"{"Name": 1.5}"#,
    ] {
        let body = body(text);
        assert_eq!(
            typed::<Named>(&body).unwrap_err(),
            body.string("Name").unwrap_err().message,
            "{text}"
        );
    }
    for text in [
        r#"{"Names": "a"}"#,
        r#"{"Names": ["a", 1]}"#,
        r#"{"Names": [null]}"#,
        r#"{"Names": {"a": "b"}}"#,
        r#"{"Names": 5}"#,
    ] {
        let body = body(text);
        assert_eq!(
            typed::<Read>(&body).unwrap_err(),
            body.string_list("Names").unwrap_err().message,
            "{text}"
        );
    }
    for text in [
        r#"{"Names": [], "MaxAgeMs": -1}"#,
        r#"{"Names": [], "MaxAgeMs": 1.5}"#,
        r#"{"Names": [], "MaxAgeMs": "5"}"#,
        r#"{"Names": [], "MaxAgeMs": 1e300}"#,
        r#"{"Names": [], "MaxAgeMs": 9e15}"#,
        r#"{"Names": [], "MaxAgeMs": true}"#,
        r#"{"Names": [], "MaxAgeMs": [5]}"#,
    ] {
        let body = body(text);
        assert_eq!(
            typed::<Read>(&body).unwrap_err(),
            body.optional_u64("MaxAgeMs").unwrap_err().message,
            "{text}"
        );
    }
}

#[test]
fn numbers_are_read_as_optional_u64_reads_them() {
    for (text, expected) in [
        ("0", Some(0)),
        ("18446744073709551615", Some(u64::MAX)),
        ("600000.0", Some(600_000)),
        ("-0", Some(0)),
        ("8999999999999998", Some(8_999_999_999_999_998)),
        ("18446744073709551616", None),
        ("-1", None),
        ("0.5", None),
    ] {
        let body = body(&format!(r#"{{"Names": [], "MaxAgeMs": {text}}}"#));
        let by_field = body.optional_u64("MaxAgeMs").ok().flatten();
        let typed = typed::<Read>(&body).ok().and_then(|r| r.max_age_ms);
        assert_eq!(typed.map(|w| w.0), expected, "{text}");
        assert_eq!(typed.map(|w| w.0), by_field, "{text}");
    }
}

#[test]
fn nested_fields_bind_in_any_case_and_errors_name_their_path() {
    let outer: Outer = typed(&body(
        r#"{"inner": {"INTERVALMS": 5}, "Options": {"ch1": {"intervalMs": 7}}}"#,
    ))
    .unwrap();
    assert_eq!(outer.inner.interval_ms, Whole(5));
    assert_eq!(outer.options.unwrap()["ch1"].interval_ms, Whole(7));
    for (text, message) in [
        (r#"{}"#, "the field Inner is missing"),
        (r#"{"Inner": {}}"#, "the field Inner.IntervalMs is missing"),
        (r#"{"Inner": 5}"#, "the field Inner must be an object"),
        (
            r#"{"Inner": {"IntervalMs": "x"}}"#,
            "the field Inner.IntervalMs must be a whole number of 0 or more",
        ),
        (
            r#"{"Inner": {"IntervalMs": 1}, "Options": []}"#,
            "the field Options must be an object",
        ),
        (
            r#"{"Inner": {"IntervalMs": 1}, "Options": {"ch1": "x"}}"#,
            "the field Options.ch1 must be an object",
        ),
        (
            r#"{"Inner": {"IntervalMs": 1}, "Options": {"a": {"IntervalMs": 1}, "ch1": {"IntervalMs": -2}}}"#,
            "the field Options.ch1.IntervalMs must be a whole number of 0 or more",
        ),
    ] {
        assert_eq!(typed::<Outer>(&body(text)).unwrap_err(), message, "{text}");
    }
}

/// A map of JSON values is the map `JsonBody::object` gave: every entry as sent, the last of
/// a repeated name, nulls kept.
#[test]
fn a_map_of_values_is_the_map_object_gave() {
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Resources {
        resources: serde_json::Map<String, Json>,
    }
    for text in [
        r#"{"Resources": {"b": 1, "a": "x", "b": true, "A": null, "c": [1, {"d": 2.5}]}}"#,
        r#"{"resources": {}}"#,
        r#"{"Resources": {"\u00e9\"": "\ud83d\ude00"}}"#,
    ] {
        let body = body(text);
        let typed: Resources = typed(&body).unwrap();
        assert_eq!(
            &typed.resources,
            body.object("Resources").unwrap(),
            "{text}"
        );
    }
    let body = body(r#"{"Resources": [1]}"#);
    assert_eq!(
        typed::<Resources>(&body).unwrap_err(),
        body.object("Resources").unwrap_err().message
    );
}

#[test]
fn a_deferred_field_is_refused_only_when_checked() {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Later {
        first: String,
        second: Deferred<String>,
        third: Deferred<Option<String>>,
    }
    let later: Later = typed(&body(r#"{"First": "a", "Third": 5}"#)).unwrap();
    assert_eq!(later.first, "a");
    assert_eq!(
        later.second.checked().unwrap_err().message,
        "the field Second is missing"
    );
    assert_eq!(
        later.third.checked().unwrap_err().message,
        "the field Third must be a string"
    );
    let later: Later = typed(&body(r#"{"first": "a", "second": "b"}"#)).unwrap();
    assert_eq!(later.second.checked().unwrap(), "b");
    assert_eq!(later.third.checked().unwrap(), None);
}

#[test]
fn a_field_types_own_words_name_the_field() {
    struct Odd;
    impl<'de> Deserialize<'de> for Odd {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let value = Json::deserialize(deserializer)?;
            Err(said("", format_args!(" must be odd, not {value}")))
        }
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    #[allow(dead_code)]
    struct WithOdd {
        inner: BTreeMap<String, Odd>,
    }
    assert_eq!(
        typed::<WithOdd>(&body(r#"{"Inner": {"x": [2]}}"#))
            .err()
            .unwrap(),
        "Inner.x must be odd, not [2]"
    );
}

/// A typed read of a body reads what the field reads read. (Its cost is the benchmark
/// harness's to measure, not a test's: `station-bench`'s write scenarios read typed bodies.)
#[test]
fn a_typed_read_reads_what_the_field_reads_read() {
    let body = body(r#"{"Names": ["0.1.ESH10000158.MON_3V3", "VSET1"], "MaxAgeMs": 600000}"#);
    let names = body.string_list("Names").unwrap();
    let age = body.optional_u64("MaxAgeMs").unwrap();
    let read: Read = body.typed().unwrap();
    assert_eq!(read.names.0, names);
    assert_eq!(read.max_age_ms.map(|w| w.0), age);
}

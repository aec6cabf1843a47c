//! Unit tests of the request types: each field's accepted inputs and messages as the field
//! reads gave them.

use serde_json::{Value as Json, json};

use super::events::SubscriptionBody;
use super::lease::{LeaseAcquireRequest, NamedLeaseAcquireRequest};
use super::numeric::{NumericAcquireRequest, NumericMeasureRequest};
use super::resources::{ResourceValueRequest, ResourceValuesSetRequest};
use crate::body::{JsonBody, value_text};
use crate::events::filter::Deadband;

fn body(json: Json) -> JsonBody {
    JsonBody::parse(json.to_string().as_bytes()).unwrap()
}

/// A value as text is what `value_text` made of it, and refused in its words.
#[test]
fn a_value_is_text_a_number_or_a_boolean_as_value_text_took_it() {
    for value in [
        json!("5"),
        json!(5),
        json!(-5),
        json!(2.5),
        json!(1e20),
        json!(true),
        json!(false),
        json!(18446744073709551615u64),
        json!(null),
        json!([1]),
        json!({"a": 1}),
    ] {
        let body = body(json!({"Name": "x", "Value": value}));
        let typed = body
            .typed::<ResourceValueRequest>()
            .unwrap()
            .checked()
            .map(|(_, value)| value.0)
            .map_err(|error| error.message);
        let by_field = body.value_text("Value").map_err(|error| error.message);
        assert_eq!(typed, by_field, "{value}");
    }
}

#[test]
fn a_batchs_values_are_checked_when_their_names_are_found() {
    let body = body(json!({"Resources": {"b": [1], "a": "1"}}));
    let request: ResourceValuesSetRequest = body.typed().unwrap();
    let mut values = request.resources.into_iter();
    let (name, a) = values.next().unwrap();
    assert_eq!(
        (name.as_str(), a.value.checked().unwrap().0.as_str()),
        ("a", "1")
    );
    let (name, b) = values.next().unwrap();
    assert_eq!(name, "b");
    assert_eq!(
        b.value.checked().unwrap_err().message,
        value_text(&json!([1]), "Resources.b").unwrap_err().message
    );
}

#[test]
fn a_subscription_reads_its_filters_and_refuses_in_the_events_words() {
    let request = body(json!({
        "channels": ["A", "B"],
        "intervalMs": 500.0,
        "deadband": {"absolute": 0.5, "Percent": null},
        "minIntervalMs": 100,
        "channelOptions": {"B": {"DEADBAND": {"Percent": 2}}}
    }))
    .typed::<SubscriptionBody>()
    .unwrap()
    .into_request();
    assert_eq!(request.channels, ["A", "B"]);
    assert_eq!(request.interval_ms, 500);
    assert_eq!(request.options.deadband, Some(Deadband::Absolute(0.5)));
    assert_eq!(
        request.options.min_interval,
        Some(std::time::Duration::from_millis(100))
    );
    assert_eq!(request.channel_options.len(), 1);
    assert_eq!(
        request.channel_options[0].1.deadband,
        Some(Deadband::Percent(2.0))
    );
    for (sent, message) in [
        (json!({"Channels": ["A"]}), "the field IntervalMs is missing".to_owned()),
        (
            json!({"Channels": ["A"], "IntervalMs": 100.5}),
            crate::events::EventsError::IntervalNotWhole("100.5".into()).to_string(),
        ),
        (
            json!({"Channels": ["A"], "IntervalMs": "x"}),
            crate::events::EventsError::IntervalNotWhole("\"x\"".into()).to_string(),
        ),
        (
            json!({"Channels": ["A"], "IntervalMs": 100, "Deadband": 5}),
            "the field Deadband must be {\"Absolute\": number} or {\"Percent\": number}"
                .to_owned(),
        ),
        (
            json!({"Channels": ["A"], "IntervalMs": 100, "Deadband": {"Absolute": 1, "Percent": 1}}),
            "the field Deadband must be {\"Absolute\": number} or {\"Percent\": number}"
                .to_owned(),
        ),
        (
            json!({"Channels": ["A"], "IntervalMs": 100, "Deadband": {"Absolute": "1"}}),
            "the field Deadband.Absolute must be a number".to_owned(),
        ),
        (
            json!({"Channels": ["A"], "IntervalMs": 100,
                   "ChannelOptions": {"A": {"Deadband": {"Relative": 1}}}}),
            "the field ChannelOptions.A.Deadband must be {\"Absolute\": number} or {\"Percent\": number}"
                .to_owned(),
        ),
        (
            json!({"Channels": ["A"], "IntervalMs": 100, "ChannelOptions": {"A": 1}}),
            "the field ChannelOptions.A must be an object".to_owned(),
        ),
        // The one message that changed: it read "ChannelOptions.A.the field MinIntervalMs
        // must be …" before.
        (
            json!({"Channels": ["A"], "IntervalMs": 100,
                   "ChannelOptions": {"A": {"MinIntervalMs": -1}}}),
            "the field ChannelOptions.A.MinIntervalMs must be a whole number of 0 or more"
                .to_owned(),
        ),
        (
            json!({"Channels": ["A"], "IntervalMs": 100, "MaxIntervalMs": 1.5}),
            "the field MaxIntervalMs must be a whole number of 0 or more".to_owned(),
        ),
    ] {
        let refused = body(sent.clone()).typed::<SubscriptionBody>().unwrap_err();
        assert_eq!(refused.message, message, "{sent}");
    }
}

#[test]
fn the_control_leases_owner_is_checked_before_its_ttl() {
    let asked = |sent: Json| {
        body(sent)
            .typed::<LeaseAcquireRequest>()
            .and_then(LeaseAcquireRequest::owner_and_ttl)
    };
    let (owner, ttl) = asked(json!({"owner": "  bench 3 ", "ttlMs": 5000})).unwrap();
    assert_eq!(
        (owner.as_str(), ttl),
        ("bench 3", Some(std::time::Duration::from_secs(5)))
    );
    assert_eq!(
        asked(json!({"TtlMs": 5000})).unwrap_err().message,
        "the field Owner is missing"
    );
    let blank = asked(json!({"Owner": " ", "TtlMs": "x"})).unwrap_err();
    assert!(
        blank.message.starts_with("the field Owner must name"),
        "{}",
        blank.message
    );
    let ttl = asked(json!({"Owner": "a", "TtlMs": "x"})).unwrap_err();
    assert_eq!(
        ttl.message,
        "the field TtlMs must be a whole number of 0 or more"
    );
    let long = asked(json!({"Owner": "x".repeat(300)})).unwrap().0;
    assert_eq!(long.chars().count(), super::lease::MAX_OWNER_CHARS);
}

#[test]
fn a_named_leases_owner_is_anonymous_unless_given() {
    let owner = |sent: Json| {
        let asked: NamedLeaseAcquireRequest = body(sent).typed().unwrap();
        asked
            .owner
            .checked()
            .and_then(NamedLeaseAcquireRequest::owner)
    };
    assert_eq!(owner(json!({"ttlMs": 1000})).unwrap(), "anonymous");
    assert_eq!(owner(json!({"owner": "  "})).unwrap(), "anonymous");
    assert_eq!(owner(json!({"OWNER": " lab "})).unwrap(), "lab");
    assert_eq!(
        owner(json!({"owner": 5})).unwrap_err().message,
        "the field owner must be a string"
    );
}

#[test]
fn owners_and_reasons_with_control_characters_are_refused_naming_the_field() {
    for bad in [
        "\u{0}",
        "\u{1b}[2J",
        "bench\u{7f}",
        "a\u{85}b",
        "x\u{202e}gnp.exe",
    ] {
        let control: LeaseAcquireRequest = body(json!({"Owner": format!("TAT {bad}")}))
            .typed()
            .unwrap();
        let refused = control.owner_and_ttl().unwrap_err();
        assert_eq!(refused.kind, crate::error::ErrorKind::BadRequest);
        assert!(
            refused
                .message
                .starts_with("the field Owner holds the control character U+"),
            "{bad:?}: {}",
            refused.message
        );
        let named: NamedLeaseAcquireRequest = body(json!({"owner": bad})).typed().unwrap();
        let refused = named
            .owner
            .checked()
            .and_then(NamedLeaseAcquireRequest::owner)
            .unwrap_err();
        assert!(
            refused.message.starts_with("the field owner holds"),
            "{}",
            refused.message
        );
        let stop: super::safe_stop::SafeStopRequest =
            body(json!({"Reason": format!("smoke {bad}")}))
                .typed()
                .unwrap();
        let refused = stop.reason().unwrap_err();
        assert!(
            refused.message.starts_with("the field Reason holds"),
            "{}",
            refused.message
        );
    }
    // Where it is, and which one.
    let nul: LeaseAcquireRequest = body(json!({"Owner": "ab\u{0}"})).typed().unwrap();
    assert!(
        nul.owner_and_ttl()
            .unwrap_err()
            .message
            .contains("U+0000 (character 3)")
    );
    // Printable text of any script is welcome.
    let fine: LeaseAcquireRequest = body(json!({"Owner": "Prüfplatz 3 — 试验台"}))
        .typed()
        .unwrap();
    assert_eq!(fine.owner_and_ttl().unwrap().0, "Prüfplatz 3 — 试验台");
}

#[test]
fn numeric_bodies_take_the_clients_defaults_and_refuse_in_their_words() {
    let measure: NumericMeasureRequest = body(json!({"channelNetName": "N"})).typed().unwrap();
    assert_eq!(measure.reduced_and_samples().unwrap(), (true, 1000));
    assert_eq!(
        measure.target_net_name.value.checked().unwrap_err().message,
        "the field TargetNetName is missing"
    );
    for (sent, message) in [
        (
            json!({"ReducedSet": "yes"}),
            "the field ReducedSet must be true or false",
        ),
        (
            json!({"Samples": 1.5}),
            "the field Samples must be a whole number",
        ),
        (
            json!({"Samples": "5"}),
            "the field Samples must be a whole number",
        ),
    ] {
        let refused = body(sent.clone())
            .typed::<NumericMeasureRequest>()
            .unwrap()
            .reduced_and_samples()
            .unwrap_err();
        assert_eq!(refused.message, message, "{sent}");
    }
    // Both wrong: the first declared is named.
    let both: NumericMeasureRequest = body(json!({"Samples": "5", "ReducedSet": 1}))
        .typed()
        .unwrap();
    assert_eq!(
        both.reduced_and_samples().unwrap_err().message,
        "the field ReducedSet must be true or false"
    );
    let measure: NumericMeasureRequest = body(json!({"Samples": -5.0, "ReducedSet": false}))
        .typed()
        .unwrap();
    assert_eq!(measure.reduced_and_samples().unwrap(), (false, -5));
    let acquire: NumericAcquireRequest = body(json!({"Lsl": 2, "Usl": 1, "Samples": "x"}))
        .typed()
        .unwrap();
    assert_eq!(
        acquire.limits().unwrap_err().message,
        "Lsl (2) must be below Usl (1)"
    );
    assert_eq!(
        NumericAcquireRequest::samples(acquire.samples.value)
            .unwrap_err()
            .message,
        "the field Samples must be a whole number"
    );
    let refused = body(json!({"Lsl": "1", "Usl": "2"}))
        .typed::<NumericAcquireRequest>()
        .unwrap()
        .limits()
        .unwrap_err();
    assert_eq!(refused.message, "the field Lsl must be a number");
    let one_limit: NumericAcquireRequest = body(json!({"Usl": 1})).typed().unwrap();
    assert_eq!(one_limit.limits().unwrap(), None);
}

/// A `ChannelConfigRequest`'s fields in its own words: unknown ones refused, each wrong one
/// named, in the order they are checked once the channel is found.
#[test]
fn a_channel_config_entry_refuses_in_its_own_words() {
    use super::channel_config::{ChannelConfigRequest, ConfigText, DetailsSent};
    use crate::config_files::settings::GivenDetail;

    let entry = |sent: Json| {
        let Json::Object(entry) = sent else {
            panic!("not an object")
        };
        ChannelConfigRequest::from_entry(entry)
    };
    let unknown = entry(json!({"NetName": "A", "Gain": 2})).unwrap_err();
    assert!(
        unknown
            .message
            .starts_with("Gain is not a field of ChannelConfigRequest (fields: NetName, Alias"),
        "{}",
        unknown.message
    );
    // A null field is as good as absent, a field the contract has in any letter case.
    let asked = entry(
        json!({"netname": "A", "Gain": null, "UNIT": 5, "Enabled": "yes",
        "Direction": "SIDEWAYS", "ChannelType": true,
        "Details": {"Gain": 2, "Offset": 0.5, "Mode": "x", "Off": null, "Bad": [1]}}),
    )
    .unwrap();
    assert_eq!(
        asked.net_name.checked().unwrap(),
        Some(ConfigText("A".into()))
    );
    assert_eq!(
        asked.unit.checked().unwrap_err().message,
        "Unit must be a string"
    );
    assert_eq!(
        asked.enabled.checked().unwrap_err().message,
        "Enabled must be true or false"
    );
    assert_eq!(
        asked.direction.checked().unwrap_err().message,
        "Direction \"SIDEWAYS\" is not IN, OUT or \"IN, OUT\""
    );
    let wrong_type = asked.channel_type.checked().unwrap_err().message;
    assert!(
        wrong_type.starts_with("ChannelType true names no channel type; the types are Analog,"),
        "{wrong_type}"
    );
    assert_eq!(
        asked.details.checked().unwrap_err().message,
        "Details.Bad: must be a number, true/false or a string"
    );
    let details = entry(json!({"Details": {"Gain": 2, "Offset": 0.5, "Mode": "x", "On": true}}))
        .unwrap()
        .details
        .checked()
        .unwrap();
    assert_eq!(
        details,
        Some(DetailsSent(vec![
            ("Gain".into(), GivenDetail::Integer(2)),
            ("Mode".into(), GivenDetail::Text("x".into())),
            ("Offset".into(), GivenDetail::Number(0.5)),
            ("On".into(), GivenDetail::Bool(true)),
        ]))
    );
    let not_object = entry(json!({"Details": 5})).unwrap().details.checked();
    assert_eq!(not_object.unwrap_err().message, "Details must be an object");
}

/// Every name of the clients' `ChannelTypes` (the .NET client's `WebApiClient/Models/Enums.cs`,
/// the Python client's `enums.py`), as Newtonsoft sends it, is a channel type: alone, several
/// joined by ", ", in any case; `Undefined` is a name of the enum but no type, and says so.
#[test]
fn every_channel_type_name_of_the_clients_enum_is_read_as_its_bit() {
    use super::channel_config::{ChannelConfigRequest, ChannelTypeSent};
    let channel_type = |sent: Json| {
        let Json::Object(entry) = json!({"NetName": "A", "ChannelType": sent}) else {
            unreachable!()
        };
        ChannelConfigRequest::from_entry(entry)
            .unwrap()
            .channel_type
            .checked()
            .map(|sent| sent.map(|ChannelTypeSent(flags)| flags))
    };
    // The enum as the .NET client declares it: name = bit.
    let declared = [
        ("Analog", 0),
        ("Digital", 1),
        ("VirtualDigital", 2),
        ("Temperature", 3),
        ("Multiplexer", 4),
        ("Resistance", 5),
        ("Counter", 6),
        ("Frequency", 7),
        ("Actuator", 8),
        ("Register", 10),
        ("Current", 11),
        ("Ratiometric", 12),
        ("UART", 13),
        ("SPI", 14),
        ("I2C", 15),
        ("ByteStream", 16),
        ("Socket", 17),
        ("Waveform", 18),
        ("NumericResult", 19),
        ("PseudoDigital", 20),
        ("Image", 21),
        ("Audio", 22),
        ("Video", 23),
        ("Instrument", 24),
        ("NumericResults", 25),
        ("Calibration", 26),
    ];
    for (name, shift) in declared {
        assert_eq!(
            channel_type(json!(name)).unwrap(),
            Some(1u32 << shift),
            "{name}"
        );
        assert_eq!(
            channel_type(json!(name.to_ascii_lowercase())).unwrap(),
            Some(1u32 << shift),
            "{name} in lower case"
        );
        assert_eq!(
            channel_type(json!(1u32 << shift)).unwrap(),
            Some(1u32 << shift)
        );
    }
    assert_eq!(
        channel_type(json!("NumericResult, Waveform")).unwrap(),
        Some((1 << 19) | (1 << 18))
    );
    for undefined in [json!("Undefined"), json!(0)] {
        let message = channel_type(undefined).unwrap_err().message;
        assert!(message.contains("is Undefined, no type"), "{message}");
    }
    let message = channel_type(json!("Hologram")).unwrap_err().message;
    assert!(
        message.contains("names no channel type") && message.contains("Calibration"),
        "{message}"
    );
}

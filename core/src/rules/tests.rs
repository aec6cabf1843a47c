//! The rules core's decisions and its errors, without I/O.

use std::net::IpAddr;

use station_protocol::Value;

use super::*;

const LAB: &str = r#"
default = "deny"

[users]
students = ["student"]
operators = ["operator", "ops-user"]
admins = ["admin"]

[hosts]
lab = ["10.1.0.0/16", "127.0.0.1"]

[channels.everything]
names = ["*"]

[channels.leds]
names = ["0.11.ESH10000355.*"]

[channels.hv]
modules = ["ESH10000662"]

[channels.hv_on]
names = ["0.4.ESH10000662.ON*"]

[channels.hv_outputs]
modules = ["ESH10000662"]
directions = ["out", "inout"]

[channels.door]
names = ["DOOR"]

[[rule]]
name = "everyone-reads-the-cache"
channels = ["everything"]
allow = ["read_cache"]

[[rule]]
name = "students-set-leds"
channels = ["leds"]
users = ["students"]
allow = ["write", "transact", "read_hardware"]

[[rule]]
name = "students-never-hv"
channels = ["hv"]
users = ["students"]
deny = ["read_cache", "read_hardware", "write", "transact", "configure", "load_config"]

[[rule]]
name = "operators-change-under-lease"
channels = ["everything"]
users = ["operators", "admins"]
allow = ["read_hardware", "write", "transact", "configure", "load_config", "save_config"]
lease = true

[[rule]]
name = "hv-on-only-with-the-door-closed"
channels = ["hv_on"]
users = ["operators"]
allow = ["write", "transact"]
value = "True"
interlock = { channel = "Interlock.DOOR_CLOSED", value = "True" }

[[rule]]
name = "operators-lease"
users = ["operators"]
hosts = ["lab"]
allow = ["lease"]
"#;

fn rules() -> Rules {
    Rules::compile(LAB, 7).unwrap()
}

fn subject(name: &str) -> Subject<'_> {
    Subject {
        name: Some(name),
        address: Some("10.1.2.3".parse().unwrap()),
        group: None,
        holds_lease: false,
    }
}

fn channel(name: &str) -> ChannelFacts<'_> {
    ChannelFacts {
        name,
        alias: "",
        direction: Some("out"),
    }
}

const LED: &str = "0.11.ESH10000355.F1";
const ON1: &str = "0.4.ESH10000662.ON1";
const VSET1: &str = "0.4.ESH10000662.VSET1";

#[test]
fn students_set_leds_and_never_touch_hv() {
    let rules = rules();
    let student = rules.principal(&subject("student"));
    let led = rules.decide(
        &student,
        &channel(LED),
        Action::Write,
        Some(&Value::Bool(true)),
    );
    assert!(led.allowed, "{led:?}");
    assert_eq!(&*led.rule, "students-set-leds");
    for action in [Action::Write, Action::ReadCache, Action::Configure] {
        let hv = rules.decide(&student, &channel(VSET1), action, Some(&Value::Float(5.0)));
        assert!(!hv.allowed, "{action}: {hv:?}");
        assert_eq!(
            &*hv.rule, "students-never-hv",
            "deny wins over the cache read allowed to all"
        );
        assert_eq!(hv.reason, Reason::Denied);
        assert!(hv.refusal(action, VSET1).contains("students-never-hv"));
    }
    // Nothing names sampling: the default decides, and says so.
    let sample = rules.decide(&student, &channel(LED), Action::Sample, None);
    assert!(!sample.allowed);
    assert_eq!(&*sample.rule, DEFAULT_RULE);
    assert_eq!(sample.reason, Reason::Default { allowed: false });
}

#[test]
fn operators_need_the_lease_and_the_door_for_hv_on() {
    let rules = rules();
    let without = rules.principal(&subject("operator"));
    let refused = rules.decide(
        &without,
        &channel(VSET1),
        Action::Write,
        Some(&Value::Float(1.0)),
    );
    assert!(!refused.allowed);
    assert_eq!(refused.reason, Reason::LeaseNeeded);
    assert_eq!(&*refused.rule, "operators-change-under-lease");
    let holder = rules.principal(&Subject {
        holds_lease: true,
        ..subject("operator")
    });
    let vset = rules.decide(
        &holder,
        &channel(VSET1),
        Action::Write,
        Some(&Value::Float(1.0)),
    );
    assert!(vset.allowed && vset.interlocks.is_empty(), "{vset:?}");
    let on = rules.decide(
        &holder,
        &channel(ON1),
        Action::Write,
        Some(&Value::Bool(true)),
    );
    assert!(on.allowed, "{on:?}");
    assert_eq!(on.interlocks.len(), 1);
    let interlock = &on.interlocks[0];
    assert_eq!(&*interlock.rule, "hv-on-only-with-the-door-closed");
    assert_eq!(&*interlock.channel, "Interlock.DOOR_CLOSED");
    assert!(interlock.holds(&Value::Bool(true)));
    assert!(!interlock.holds(&Value::Bool(false)));
    // Switching off needs no door.
    let off = rules.decide(
        &holder,
        &channel(ON1),
        Action::Write,
        Some(&Value::Bool(false)),
    );
    assert!(off.allowed && off.interlocks.is_empty(), "{off:?}");
    assert_eq!(
        rules.interlock_channels(),
        vec!["Interlock.DOOR_CLOSED".to_owned()]
    );
}

#[test]
fn host_groups_by_cidr_and_a_front_ends_group() {
    let rules = rules();
    let lab_operator = rules.principal(&subject("operator"));
    let station = ChannelFacts::named("");
    assert!(
        rules
            .decide(&lab_operator, &station, Action::Lease, None)
            .allowed
    );
    let elsewhere = rules.principal(&Subject {
        address: Some("192.168.0.9".parse().unwrap()),
        ..subject("operator")
    });
    let refused = rules.decide(&elsewhere, &station, Action::Lease, None);
    assert!(!refused.allowed);
    assert_eq!(&*refused.rule, DEFAULT_RULE);
    // An IPv4-mapped IPv6 address is its IPv4 address.
    let mapped: IpAddr = "::ffff:10.1.0.1".parse().unwrap();
    let mapped = rules.principal(&Subject {
        address: Some(mapped),
        ..subject("operator")
    });
    assert!(rules.decide(&mapped, &station, Action::Lease, None).allowed);
    // A legacy client: no name, the listener's group.
    let legacy = rules.principal(&Subject {
        name: None,
        address: Some("127.0.0.1".parse().unwrap()),
        group: Some("students"),
        holds_lease: false,
    });
    assert!(
        rules
            .decide(
                &legacy,
                &channel(LED),
                Action::Write,
                Some(&Value::Bool(true))
            )
            .allowed
    );
    assert!(
        !rules
            .decide(
                &legacy,
                &channel(ON1),
                Action::Write,
                Some(&Value::Bool(false))
            )
            .allowed
    );
    // Nobody: only what everyone may.
    let nobody = rules.principal(&Subject {
        name: Some("stranger"),
        address: None,
        group: None,
        holds_lease: true,
    });
    assert!(
        rules
            .decide(&nobody, &channel(LED), Action::ReadCache, None)
            .allowed
    );
    assert!(
        !rules
            .decide(&nobody, &channel(LED), Action::Write, None)
            .allowed
    );
}

#[test]
fn channel_groups_by_alias_module_and_direction() {
    let rules = Rules::compile(
        r#"
[users]
u = ["u"]
[channels.door]
names = ["DOOR*"]
[channels.hv_out]
modules = ["ESH10000662"]
directions = ["out"]
[[rule]]
name = "door-by-alias"
channels = ["door"]
users = ["u"]
allow = ["write"]
[[rule]]
name = "hv-outputs"
channels = ["hv_out"]
users = ["u"]
allow = ["configure"]
"#,
        1,
    )
    .unwrap();
    let u = rules.principal(&subject("u"));
    let aliased = ChannelFacts {
        name: "Interlock.DOOR_CLOSED",
        alias: "DOOR_A",
        direction: Some("in"),
    };
    assert_eq!(
        &*rules.decide(&u, &aliased, Action::Write, None).rule,
        "door-by-alias"
    );
    // The same name with another alias is worked out again, not served from the cache.
    let renamed = ChannelFacts {
        alias: "GATE",
        ..aliased
    };
    assert!(!rules.decide(&u, &renamed, Action::Write, None).allowed);
    let output = ChannelFacts {
        name: VSET1,
        alias: "",
        direction: Some("out"),
    };
    assert!(rules.decide(&u, &output, Action::Configure, None).allowed);
    let input = ChannelFacts {
        direction: Some("in"),
        ..output
    };
    assert!(!rules.decide(&u, &input, Action::Configure, None).allowed);
    let other_module = ChannelFacts {
        name: LED,
        ..output
    };
    assert!(
        !rules
            .decide(&u, &other_module, Action::Configure, None)
            .allowed
    );
}

#[test]
fn a_later_deny_wins_over_an_earlier_allow_and_the_default_can_allow() {
    let rules = Rules::compile(
        r#"
default = "allow"
[channels.all]
names = ["*"]
[[rule]]
name = "allow-all"
channels = ["all"]
allow = ["write"]
[[rule]]
name = "but-not-this"
channels = ["all"]
deny = ["write"]
value = "9"
"#,
        1,
    )
    .unwrap();
    let anyone = rules.principal(&subject("x"));
    assert!(
        rules
            .decide(
                &anyone,
                &channel(LED),
                Action::Write,
                Some(&Value::Integer(1))
            )
            .allowed
    );
    let nine = rules.decide(
        &anyone,
        &channel(LED),
        Action::Write,
        Some(&Value::Integer(9)),
    );
    assert_eq!((nine.allowed, &*nine.rule), (false, "but-not-this"));
    let other = rules.decide(&anyone, &channel(LED), Action::Bus, None);
    assert_eq!((other.allowed, &*other.rule), (true, DEFAULT_RULE));
    assert_eq!(rules.version(), 1);
    assert!(
        Rules::allow_all(3)
            .decide(&anyone, &channel(LED), Action::Write, None)
            .allowed
    );
}

fn error_of(text: &str) -> RulesError {
    Rules::compile(text, 1).expect_err("the file is refused")
}

#[test]
fn mistakes_name_their_line_and_key() {
    let unknown_key = error_of("[channels.a]\nnames = [\"*\"]\nnmaes = [\"x\"]\n");
    assert_eq!(unknown_key.line, 3, "{unknown_key}");
    assert!(unknown_key.to_string().contains("nmaes"), "{unknown_key}");

    let syntax = error_of("[users]\nstudents = [\"a\" \"b\"]\n");
    assert_eq!(syntax.line, 2, "{syntax}");

    let cidr = error_of("[hosts]\nlab = [\"10.0.0.0/33\"]\n");
    assert_eq!((cidr.line, cidr.key.as_str()), (2, "hosts.lab"), "{cidr}");
    assert!(cidr.why.contains("10.0.0.0/33"));

    let glob = error_of("[channels.bad]\nnames = [\"a[\"]\n");
    assert_eq!(
        (glob.line, glob.key.as_str()),
        (2, "channels.bad.names"),
        "{glob}"
    );

    let group = error_of(
        "[channels.all]\nnames = [\"*\"]\n\n[[rule]]\nname = \"r\"\nchannels = [\"al\"]\nallow = [\"write\"]\n",
    );
    assert_eq!(
        (group.line, group.key.as_str()),
        (6, "rule \"r\".channels"),
        "{group}"
    );
    assert!(group.why.contains("\"al\""));

    let action = error_of(
        "[channels.all]\nnames = [\"*\"]\n[[rule]]\nname = \"r\"\nchannels = [\"all\"]\nallow = [\"wirte\"]\n",
    );
    assert_eq!(
        (action.line, action.key.as_str()),
        (6, "rule \"r\".allow"),
        "{action}"
    );
    assert!(action.why.contains("wirte") && action.why.contains("read_cache"));

    let both = error_of(
        "[channels.all]\nnames = [\"*\"]\n[[rule]]\nname = \"r\"\nchannels = [\"all\"]\nallow = [\"write\"]\ndeny = [\"bus\"]\n",
    );
    assert_eq!(both.line, 4, "{both}");

    let twice = error_of(
        "[channels.all]\nnames = [\"*\"]\n[[rule]]\nname = \"r\"\nchannels = [\"all\"]\nallow = [\"write\"]\n[[rule]]\nname = \"r\"\nchannels = [\"all\"]\ndeny = [\"bus\"]\n",
    );
    assert_eq!(
        (twice.line, twice.key.as_str()),
        (8, "rule.name"),
        "{twice}"
    );

    let user = error_of(
        "[channels.all]\nnames = [\"*\"]\n[[rule]]\nname = \"r\"\nchannels = [\"all\"]\nusers = [\"nobody\"]\nallow = [\"write\"]\n",
    );
    assert_eq!(user.line, 6, "{user}");

    let default = error_of("default = \"maybe\"\n");
    assert_eq!(
        (default.line, default.key.as_str()),
        (1, "default"),
        "{default}"
    );

    let empty_group = error_of("[channels.none]\n");
    assert_eq!(empty_group.key, "channels.none", "{empty_group}");
}

#[test]
fn decisions_are_cached_per_channel_and_stay_the_same() {
    let rules = rules();
    let student = rules.principal(&subject("student"));
    let first = rules.decide(&student, &channel(LED), Action::Write, None);
    for _ in 0..3 {
        assert_eq!(
            rules.decide(&student, &channel(LED), Action::Write, None),
            first
        );
    }
}

#[test]
fn a_module_serial_is_the_part_after_the_line_and_slot_numbers_on_the_base_board_too() {
    assert_eq!(channel(ON1).module_serial(), Some("ESH10000662"));
    assert_eq!(
        channel("0.ESH10000023.UART01").module_serial(),
        Some("ESH10000023")
    );
    assert_eq!(channel("Engine.Uptime").module_serial(), None);
    assert_eq!(channel("Interlock.DOOR_CLOSED").module_serial(), None);
    assert_eq!(channel("0.4.5").module_serial(), None);
    let rules = Rules::compile(
        r#"
[channels.base_board]
modules = ["ESH10000023"]
[[rule]]
name = "the-base-boards-buses"
channels = ["base_board"]
allow = ["bus"]
"#,
        1,
    )
    .unwrap();
    let anyone = rules.principal(&subject("anyone"));
    let uart = channel("0.ESH10000023.UART01");
    assert_eq!(
        &*rules.decide(&anyone, &uart, Action::Bus, None).rule,
        "the-base-boards-buses"
    );
}

#[test]
fn globs_modules_and_groups_that_match_no_channel_are_reported() {
    let rules = Rules::compile(
        r#"
[channels.hv]
modules = ["ESH10000662", "ESH99999999"]
[channels.typo]
names = ["0.4.ESH10000662.VSET*", "0.4.ESH1000662.*"]
[channels.hv_inputs_on_the_leds]
names = ["0.11.*"]
modules = ["ESH10000662"]
[channels.everything_in]
directions = ["in"]
[[rule]]
name = "r"
channels = ["hv", "typo", "hv_inputs_on_the_leds", "everything_in"]
allow = ["write"]
"#,
        1,
    )
    .unwrap();
    let table = [channel(ON1), channel(VSET1), channel(LED)];
    let found: Vec<String> = rules
        .unmatched(&table)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [
            "channels.everything_in.directions: \"in\" matches no channel of the station",
            "channels.everything_in: the group matches no channel of the station",
            "channels.hv.modules: \"ESH99999999\" matches no channel of the station",
            "channels.hv_inputs_on_the_leds: the group matches no channel of the station",
            "channels.typo.names: \"0.4.ESH1000662.*\" matches no channel of the station",
        ]
    );
}

#[test]
fn a_file_that_names_safe_stop_nowhere_lets_nobody_press_it_and_says_so() {
    assert!(
        !rules().anyone_may(Action::SafeStop),
        "LAB names it nowhere"
    );
    assert!(rules().anyone_may(Action::Lease));
    let allowing = Rules::compile("default = \"allow\"", 1).unwrap();
    assert!(allowing.anyone_may(Action::SafeStop));
    let example =
        Rules::compile(include_str!("../../../config/access-example-rules.toml"), 1).unwrap();
    assert!(example.anyone_may(Action::SafeStop));
    let operator = example.principal(&subject("operator"));
    let student = example.principal(&subject("student"));
    let station = ChannelFacts::named("");
    assert!(
        example
            .decide(&operator, &station, Action::SafeStop, None)
            .allowed
    );
    assert!(
        !example
            .decide(&student, &station, Action::SafeStop, None)
            .allowed
    );
}

/// A lab of two stations: one rule for st1 only, one for both, the default deny.
const TWO_STATIONS: &str = r#"
default = "deny"
[users]
students = ["student"]
[channels.all]
names = ["*"]

[[rule]]
name = "students-read"
channels = ["all"]
users = ["students"]
allow = ["read_cache"]

[[rule]]
name = "no-writes-on-st1"
channels = ["all"]
users = ["students"]
deny = ["write"]
stations = ["st1"]

[[rule]]
name = "writes-on-st2-and-st3"
channels = ["all"]
users = ["students"]
allow = ["write"]
stations = ["ST2", "st3"]
"#;

#[test]
fn a_rule_naming_stations_is_in_force_only_on_them() {
    let decide = |station: Option<&str>, action: Action| {
        let rules = Rules::compile_for_station(TWO_STATIONS, 1, station).unwrap();
        let who = rules.principal(&subject("student"));
        rules.decide(&who, &channel(LED), action, None)
    };
    // st1: its deny rule; st2: the allow rule naming it (in another letter case); st4: neither,
    // the default.
    let st1 = decide(Some("st1"), Action::Write);
    assert_eq!((st1.allowed, &*st1.rule), (false, "no-writes-on-st1"));
    assert_eq!(st1.reason, Reason::Denied);
    let st2 = decide(Some("st2"), Action::Write);
    assert_eq!((st2.allowed, &*st2.rule), (true, "writes-on-st2-and-st3"));
    let st4 = decide(Some("st4"), Action::Write);
    assert_eq!((st4.allowed, &*st4.rule), (false, DEFAULT_RULE));
    // A rule without stations: on every station.
    for station in ["st1", "st2", "st4"] {
        let read = decide(Some(station), Action::ReadCache);
        assert_eq!(
            (read.allowed, &*read.rule),
            (true, "students-read"),
            "{station}"
        );
    }
    // No station: every rule, as a file without `stations` always was (the deny wins).
    let everywhere = decide(None, Action::Write);
    assert_eq!(
        (everywhere.allowed, &*everywhere.rule),
        (false, "no-writes-on-st1")
    );
    let st2 = Rules::compile_for_station(TWO_STATIONS, 1, Some("st2")).unwrap();
    assert_eq!(st2.rule_count(), 2);
    assert_eq!(st2.station(), Some("st2"));
    assert_eq!(st2.stations_named(), ["ST2", "st1", "st3"]);
    assert_eq!(Rules::compile(TWO_STATIONS, 1).unwrap().rule_count(), 3);
}

#[test]
fn a_rule_naming_only_stations_not_served_is_listed_as_unserved() {
    let rules = Rules::compile_for_station(TWO_STATIONS, 1, Some("st1")).unwrap();
    // A gateway of st1 alone: the rule for st2 and st3 is in force nowhere here.
    let unserved = rules.unserved(&["st1"]);
    assert_eq!(
        unserved,
        [UnservedRule {
            rule: "writes-on-st2-and-st3".into(),
            stations: vec!["ST2".into(), "st3".into()],
        }]
    );
    let said = unserved[0].to_string();
    assert!(
        said.contains("rule \"writes-on-st2-and-st3\".stations")
            && said.contains("\"ST2\", \"st3\"")
            && said.contains("no station this gateway serves"),
        "{said}"
    );
    // One id it serves, in any letter case, is enough; rules without `stations` never are.
    assert!(rules.unserved(&["st1", "St3"]).is_empty());
    assert!(rules.unserved(&["st2".to_owned()]).len() == 1);
    assert_eq!(rules.unserved(&["st2"])[0].rule, "no-writes-on-st1");
    assert_eq!(rules.unserved(&["st9"]).len(), 2);
}

#[test]
fn a_station_that_cannot_be_named_is_a_mistake_of_the_file_whichever_station_reads_it() {
    let file = |stations: &str| {
        format!(
            "[channels.all]\nnames = [\"*\"]\n[[rule]]\nname = \"r\"\nchannels = [\"all\"]\nallow = [\"write\"]\nstations = {stations}\n"
        )
    };
    for station in [None, Some("st1"), Some("st9")] {
        let bad = Rules::compile_for_station(&file("[\"st1\", \"st 2\"]"), 1, station)
            .expect_err("the file is refused");
        assert_eq!(
            (bad.line, bad.key.as_str()),
            (7, "rule \"r\".stations"),
            "{bad}"
        );
        assert!(bad.why.contains("\"st 2\""), "{bad}");
        assert!(bad.to_string().contains("rule \"r\""), "{bad}");
    }
    let long = error_of(&file(&format!("[\"{}\"]", "s".repeat(65))));
    assert!(
        long.why.contains(&"s".repeat(65)) && long.why.contains("64"),
        "{long}"
    );
    let empty_id = error_of(&file("[\"\"]"));
    assert_eq!(empty_id.key, "rule \"r\".stations", "{empty_id}");
    let none = error_of(&file("[]"));
    assert_eq!(
        (none.line, none.key.as_str()),
        (7, "rule \"r\".stations"),
        "{none}"
    );
    assert!(none.why.contains("names no station"), "{none}");
    let not_a_list = error_of(&file("\"st1\""));
    assert_eq!(not_a_list.line, 7, "{not_a_list}");
    // An unknown key is still named, next to `stations`.
    let unknown = error_of(&file("[\"st1\"]\nstaions = [\"st2\"]"));
    assert_eq!(unknown.line, 8, "{unknown}");
    assert!(unknown.to_string().contains("staions"), "{unknown}");
}

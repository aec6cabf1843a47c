//! Unit tests of `[[station]]` configurations: each station a whole config, what is per station
//! and what is the gateway's, and what two stations may not share.

use std::path::PathBuf;

use super::*;

fn lab(text: &str) -> Lab {
    Lab::from_toml(text, "lab.toml").unwrap_or_else(|error| panic!("{error}"))
}

fn refused(text: &str) -> String {
    match Lab::from_toml(text, "lab.toml") {
        Ok(lab) => panic!("accepted: {lab:?}"),
        Err(error) => error.to_string(),
    }
}

const TWO: &str = r#"
[lease]
backend = "memory"
lock_delay_ms = 3000

[[station]]
id = "st1"
url = "tcp://127.0.0.1:7001"
request_timeout_ms = 1500
[station.lease]
safe_state = [{ channel = "ON1", value = "False" }]
[station.legacy]
listen = "127.0.0.1:7101"

[[station]]
id = "st2"
url = "tcp://127.0.0.1:7002"
[station.lease]
lock_delay_ms = 0
[station.history]
channels = ["VSET*"]
"#;

#[test]
fn a_file_with_one_station_table_is_one_station_as_before() {
    let text = "[station]\nurl = \"tcp://127.0.0.1:7001\"\n";
    let parsed = lab(text);
    assert_eq!(parsed.stations.len(), 1);
    let only = &parsed.stations[0];
    assert_eq!(only.id, "station");
    assert_eq!(only.config, Config::from_toml(text, "lab.toml").unwrap());
    assert_eq!(parsed.default_station.as_deref(), Some("station"));
}

#[test]
fn one_station_is_named_by_its_id_when_that_fits_a_path() {
    let parsed = lab("[station]\nurl = \"tcp://h:1\"\nid = \"rig-7\"\n");
    assert_eq!(parsed.stations[0].id, "rig-7");
    // An identity with a space (a model and serial) still names the lease, not the path.
    let parsed = lab("[station]\nurl = \"tcp://h:1\"\nid = \"HVS-3 ESH1\"\n");
    assert_eq!(parsed.stations[0].id, "station");
    assert_eq!(
        parsed.stations[0].config.control_lease_name(),
        "control:station:HVS-3 ESH1"
    );
}

#[test]
fn every_station_table_is_a_whole_config_with_its_own_keys_over_the_gateways() {
    let parsed = lab(TWO);
    let ids: Vec<&str> = parsed.stations.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["st1", "st2"]);
    let st1 = &parsed.station("st1").unwrap().config;
    let st2 = &parsed.station("st2").unwrap().config;
    assert_eq!(st1.station.url, "tcp://127.0.0.1:7001");
    assert_eq!(st2.station.url, "tcp://127.0.0.1:7002");
    assert_eq!(st1.station.request_timeout_ms, 1500);
    assert_eq!(
        st2.station.request_timeout_ms,
        Config::default().station.request_timeout_ms
    );
    // The control lease is named after the station's id.
    assert_eq!(st1.control_lease_name(), "control:station:st1");
    assert_eq!(st2.control_lease_name(), "control:station:st2");
    // Per station: the safe state, the lock-delay, the legacy address, the history channels.
    assert_eq!(st1.lease.safe_state.len(), 1);
    assert!(st2.lease.safe_state.is_empty());
    assert_eq!(st1.lease.lock_delay_ms, Some(3000), "the gateway's");
    assert_eq!(st2.lease.lock_delay_ms, Some(0), "its own");
    assert_eq!(st1.legacy.listen, "127.0.0.1:7101");
    assert_eq!(st2.legacy.listen, "");
    assert_eq!(st2.history.channels, ["VSET*"]);
    assert_eq!(st1.history.channels, Config::default().history.channels);
    // The gateway's for both.
    assert_eq!(st1.lease.backend, "memory");
    assert_eq!(st1.http, st2.http);
    // Several stations and no default_station: /api/... serves none of them.
    assert_eq!(parsed.default_station, None);
    assert!(parsed.station("st3").is_none());
}

#[test]
fn each_stations_configuration_files_are_in_a_folder_of_its_id() {
    let parsed = lab(TWO);
    let base = Config::default().config_files.dir;
    assert_eq!(
        parsed.station("st1").unwrap().config.config_files.dir,
        base.join("st1")
    );
    let parsed = lab(&format!("[config_files]\ndir = \"/srv/cf\"\n{TWO}"));
    assert_eq!(
        parsed.station("st2").unwrap().config.config_files.dir,
        PathBuf::from("/srv/cf/st2")
    );
    let own = TWO.replace(
        "[station.history]",
        "[station.config_files]\ndir = \"/data/two\"\n[station.history]",
    );
    assert_eq!(
        lab(&own).station("st2").unwrap().config.config_files.dir,
        PathBuf::from("/data/two")
    );
}

#[test]
fn default_station_must_name_a_station_here() {
    let parsed = lab(&format!("default_station = \"st2\"\n{TWO}"));
    assert_eq!(parsed.default_station.as_deref(), Some("st2"));
    let error = refused(&format!("default_station = \"st9\"\n{TWO}"));
    assert!(error.contains("default_station"), "{error}");
    assert!(
        error.contains("\"st9\"") && error.contains("st1, st2"),
        "{error}"
    );
    let error = refused("default_station = \"x\"\n[station]\nurl = \"tcp://h:1\"\n");
    assert!(error.contains("the one station is \"station\""), "{error}");
    assert_eq!(
        lab("default_station = \"station\"\n[station]\nurl = \"tcp://h:1\"\n").default_station,
        Some("station".into())
    );
}

#[test]
fn a_station_id_is_letters_digits_dashes_and_underscores_and_names_one_station() {
    for bad in ["st 1", "st/1", "", "é", &"x".repeat(65)] {
        let text = TWO.replace("id = \"st1\"", &format!("id = {bad:?}"));
        let error = refused(&text);
        assert!(error.contains("station.id"), "{bad:?}: {error}");
    }
    let error = refused(&TWO.replace("id = \"st2\"", "id = \"ST1\""));
    assert!(error.contains("\"ST1\" names two stations"), "{error}");
    let error = refused(&TWO.replace("id = \"st2\"\n", ""));
    assert!(
        error.contains("station 2 of [[station]] has no id"),
        "{error}"
    );
    assert_eq!(id_problem("st_1-B"), None);
}

#[test]
fn what_is_the_gateways_cannot_be_set_per_station() {
    let text = TWO.replace(
        "[station.lease]\nlock_delay_ms = 0",
        "[station.lease]\nbackend = \"sqlite:x.db\"",
    );
    let error = refused(&text);
    assert!(error.contains("station st2"), "{error}");
    assert!(
        error.contains("lease.backend is the gateway's, for every station"),
        "{error}"
    );
    let text = TWO.replace(
        "[station.history]\nchannels",
        "[station.history]\narchive = \"postgres://x\"\nchannels",
    );
    assert!(refused(&text).contains("history.archive is the gateway's"));
}

#[test]
fn a_stations_errors_name_the_station_and_the_key() {
    let error = refused(&TWO.replace("request_timeout_ms = 1500", "request_timeout_ms = 0"));
    assert!(error.contains("station st1"), "{error}");
    assert!(error.contains("station.request_timeout_ms"), "{error}");
    let error = refused(&TWO.replace("request_timeout_ms = 1500", "colour = 1"));
    assert!(
        error.contains("station st1") && error.contains("colour"),
        "{error}"
    );
    let error = refused(&TWO.replace("request_timeout_ms = 1500", "request_timeout_ms = \"x\""));
    assert!(
        error.contains("expected a non-negative whole number"),
        "{error}"
    );
}

#[test]
fn two_stations_share_no_control_lease_and_no_legacy_address() {
    let error = refused(&format!(
        "[legacy]\nlisten = \"127.0.0.1:7100\"\n{}",
        TWO.replace("[station.legacy]\nlisten = \"127.0.0.1:7101\"\n", "")
    ));
    assert!(
        error.contains("stations st1 and st2 have one legacy.listen (127.0.0.1:7100)"),
        "{error}"
    );
    let text = TWO.replace(
        "[station.lease]\nlock_delay_ms = 0",
        "[station.lease]\nname = \"control:station:st1\"",
    );
    let error = refused(&text);
    assert!(
        error.contains("have one control lease (control:station:st1)"),
        "{error}"
    );
}

#[test]
fn an_empty_list_of_stations_is_refused() {
    assert!(refused("station = []\n").contains("names no station"));
}

#[test]
fn a_file_that_is_not_toml_is_refused_at_its_line() {
    let error = refused("[station]\nurl = \"tcp://h:1\"\nid = \n");
    assert!(error.starts_with("lab.toml, line 3"), "{error}");
}

#[test]
fn a_stations_own_file_is_named_after_the_gateways_with_its_id() {
    use std::path::Path;
    assert_eq!(
        station_file(Path::new("/var/lib/gw/link-owner.state"), "st1"),
        Path::new("/var/lib/gw/link-owner-st1.state")
    );
    assert_eq!(
        station_file(Path::new("state/owner"), "b-2"),
        Path::new("state/owner-b-2")
    );
}

#[test]
fn an_id_may_be_64_characters_and_no_more() {
    assert_eq!(id_problem(&"a".repeat(MAX_ID_LEN)), None);
    assert!(id_problem(&"a".repeat(MAX_ID_LEN + 1)).is_some());
}

#[test]
fn one_station_table_is_the_default_and_ids_are_in_order() {
    let one = lab("[[station]]\nid = \"only\"\nurl = \"tcp://127.0.0.1:7001\"\n");
    assert_eq!(one.default_station.as_deref(), Some("only"));
    assert_eq!(one.ids(), ["only"]);
    let two = lab(TWO);
    assert_eq!(two.ids(), ["st1", "st2"]);
    assert_eq!(two.default_station, None);
}

#[test]
fn a_one_station_file_still_refuses_an_unknown_top_level_key() {
    let why = refused("bogus = 1\n[station]\nurl = \"tcp://127.0.0.1:7001\"\n");
    assert!(why.contains("bogus"), "{why}");
}

#[test]
fn a_history_archive_is_one_stations_only() {
    let mut one = Config::default();
    one.history.archive = "postgres://db/history".into();
    // One station may keep its archive, as a one-station gateway always could.
    let single = Lab::single(one.clone());
    check_apart(&single.stations).unwrap();
    let mut other = Config::default();
    other.station.id = "two".into();
    other.config_files.dir = PathBuf::from("elsewhere");
    other.lease.name = "control:two".into();
    let both = [
        StationSetup {
            id: "one".into(),
            config: one,
        },
        StationSetup {
            id: "two".into(),
            config: other,
        },
    ];
    let why = check_apart(&both).unwrap_err().to_string();
    assert!(
        why.contains("history.archive") && why.contains("station one"),
        "{why}"
    );
}

//! Tests of reading, parsing and validating configs: the example and production files, errors
//! naming the key and line.

use super::*;

#[test]
fn the_example_config_is_valid_and_says_the_defaults() {
    let example = Config::from_toml(EXAMPLE_CONFIG, "config/gateway.toml").unwrap();
    assert_eq!(example, Config::default());
}

#[test]
fn the_sample_production_config_parses_with_tls_access_and_a_safe_state() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/production.toml");
    // The certificate files need not exist to parse: they are read at start-up.
    let config = Config::from_file(&path).unwrap();
    assert!(config.http.tls.enabled());
    assert!(config.access.keys.iter().any(|k| k.role == Role::Control));
    assert!(config.access.users.iter().any(|u| u.role == Role::Admin));
    assert!(!config.legacy.allow.is_empty());
    assert_eq!(
        config.audit.directory().unwrap(),
        Path::new("/var/lib/station-gateway/audit")
    );
    assert!(config.access.keys.iter().all(|k| !k.name.is_empty()));
    assert!(
        config
            .lease
            .safe_state
            .iter()
            .any(|w| w.channel.ends_with(".ON1") && w.value == "False")
    );
}

#[test]
fn the_keep_alive_timeout_is_its_own_key_checked_by_name() {
    let config = Config::from_toml("[http]\nkeep_alive_timeout_ms = 300\n", "x.toml").unwrap();
    assert_eq!(config.http.keep_alive_timeout_ms, 300);
    assert_eq!(config.http.header_read_timeout_ms, 10_000);
    assert_eq!(Config::default().http.keep_alive_timeout_ms, 120_000);
    for bad in ["0", "3600001"] {
        let error = Config::from_toml(
            &format!("[http]\nkeep_alive_timeout_ms = {bad}\n"),
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("http.keep_alive_timeout_ms"), "{error}");
        assert!(error.contains("1 to 3600000"), "{error}");
    }
}

#[test]
fn tls_needs_both_files_and_access_entries_are_checked() {
    let error = Config::from_toml("[http.tls]\ncert = \"a.pem\"\n", "x.toml").unwrap_err();
    assert!(error.to_string().contains("http.tls.key"), "{error}");
    let error = Config::from_toml(
        "[access]\nkeys = [{ key = \"short\", role = \"read\" }]\n",
        "x.toml",
    )
    .unwrap_err();
    assert!(error.to_string().contains("access.keys"), "{error}");
    let error = Config::from_toml(
        "[access]\nkeys = [{ key = \"0123456789abcdef\", role = \"root\" }]\n",
        "x.toml",
    )
    .unwrap_err();
    assert!(error.to_string().contains("root"), "{error}");
}

#[test]
fn an_unknown_key_is_named_with_its_line() {
    let error =
        Config::from_toml("[station]\nurl = \"tcp://a:1\"\nspeed = 3\n", "x.toml").unwrap_err();
    let text = error.to_string();
    assert!(text.contains("x.toml, line 3"), "{text}");
    assert!(text.contains("speed"), "{text}");
}

#[test]
fn a_value_of_the_wrong_type_names_the_key_and_line() {
    let error = Config::from_toml("[http]\nmax_body_bytes = \"lots\"\n", "x.toml").unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("x.toml, line 2, key http.max_body_bytes"),
        "{text}"
    );
}

#[test]
fn a_value_of_the_wrong_type_says_the_expected_kind_in_words() {
    let error = Config::from_toml("[http]\nmax_body_bytes = \"lots\"\n", "x.toml").unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("expected a non-negative whole number"),
        "{text}"
    );
    assert!(!text.contains("usize"), "{text}");
    let error = Config::from_toml("[legacy]\nwindow = 70000\n", "x.toml").unwrap_err();
    let text = error.to_string();
    assert!(text.contains("up to 65535"), "{text}");
    assert!(!text.contains("u16"), "{text}");
}

#[test]
fn a_missing_config_file_is_one_line_naming_the_file() {
    let path = std::env::temp_dir().join("station-gateway-no-such-config.toml");
    let error = Config::from_file(&path).unwrap_err();
    // As main prints it: the chain on one line, never a backtrace.
    let report = format!("{:#}", anyhow::Error::from(error));
    assert_eq!(
        report,
        format!("cannot read config file {}: no such file", path.display())
    );
}

#[test]
fn a_bad_value_names_the_key() {
    let error = Config::from_toml("[station]\nrequest_timeout_ms = 0\n", "x.toml").unwrap_err();
    assert!(
        error.to_string().contains("station.request_timeout_ms"),
        "{error}"
    );
    let error = Config::from_toml("[station]\nurl = \"ftp://x\"\n", "x.toml").unwrap_err();
    assert!(error.to_string().contains("station.url"), "{error}");
}

#[test]
fn the_longest_processing_is_four_request_timeouts_unless_set_and_never_below_one() {
    let config = Config::from_toml("[station]\nrequest_timeout_ms = 1000\n", "x.toml").unwrap();
    assert_eq!(config.max_processing(), Duration::from_millis(4000));
    let text = "[station]\nrequest_timeout_ms = 1000\nmax_processing_ms = 2500\n";
    let config = Config::from_toml(text, "x.toml").unwrap();
    assert_eq!(config.max_processing(), Duration::from_millis(2500));
    let text = "[station]\nrequest_timeout_ms = 1000\nmax_processing_ms = 999\n";
    let error = Config::from_toml(text, "x.toml").unwrap_err();
    assert!(
        error.to_string().contains("station.max_processing_ms"),
        "{error}"
    );
}

#[test]
fn event_ranges_take_names_and_globs_and_refuse_a_bad_pattern_or_range() {
    let config = Config::from_toml(
        "[events.ranges]\n\"0.4.ESH10000662.VMON*\" = [0, 3000]\n\"A.B\" = [-1.5, 1.5]\n",
        "x.toml",
    )
    .unwrap();
    assert_eq!(config.events.ranges["A.B"], [-1.5, 1.5]);
    for (text, named) in [
        ("\"A[\" = [0, 1]", "\"A[\" is not a name or glob pattern"),
        ("\"A\" = [1, 1]", "two different numbers"),
        ("\"A\" = [0, inf]", "two different numbers"),
    ] {
        let error = Config::from_toml(&format!("[events.ranges]\n{text}\n"), "x.toml").unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("events.ranges") && message.contains(named),
            "{text}: {message}"
        );
    }
}

#[test]
fn the_lock_delay_is_the_longest_processing_unless_set_and_at_most_an_hour() {
    let config = Config::from_toml("[station]\nrequest_timeout_ms = 1000\n", "x.toml").unwrap();
    assert_eq!(config.lock_delay(), Duration::from_millis(4000));
    let config = Config::from_toml("[lease]\nlock_delay_ms = 0\n", "x.toml").unwrap();
    assert_eq!(config.lock_delay(), Duration::ZERO);
    let config = Config::from_toml("[lease]\nlock_delay_ms = 1500\n", "x.toml").unwrap();
    assert_eq!(config.lock_delay(), Duration::from_millis(1500));
    let error = Config::from_toml("[lease]\nlock_delay_ms = 3600001\n", "x.toml").unwrap_err();
    assert!(error.to_string().contains("lease.lock_delay_ms"), "{error}");
}

#[test]
fn the_safe_state_tolerance_is_a_number_at_least_zero() {
    let config = Config::from_toml("", "x.toml").unwrap();
    assert_eq!(config.lease.safe_state_tolerance, 0.001);
    let config = Config::from_toml("[lease]\nsafe_state_tolerance = 0.5\n", "x.toml").unwrap();
    assert_eq!(config.lease.safe_state_tolerance, 0.5);
    for bad in ["-0.1", "nan", "inf"] {
        let text = format!("[lease]\nsafe_state_tolerance = {bad}\n");
        let error = Config::from_toml(&text, "x.toml").unwrap_err();
        assert!(
            error.to_string().contains("lease.safe_state_tolerance"),
            "{bad}: {error}"
        );
    }
}

#[test]
fn a_link_owner_timing_that_breaks_a_rule_is_refused_naming_the_keys() {
    let slow_store = "[lease]\nlink_owner_ttl_ms = 3000\nlink_owner_store_timeout_ms = 2000\n";
    let why = Config::from_toml(slow_store, "test.toml")
        .unwrap_err()
        .to_string();
    assert!(
        why.contains("lease.link_owner_ttl_ms")
            && why.contains("lease.link_owner_store_timeout_ms")
            && why.contains("lease.link_owner_renew_ms"),
        "{why}"
    );
    let short_delay = "[lease]\nlink_owner_lock_delay_ms = 100\n";
    let why = Config::from_toml(short_delay, "test.toml")
        .unwrap_err()
        .to_string();
    assert!(
        why.contains("lease.link_owner_lock_delay_ms") && why.contains("station.max_processing_ms"),
        "{why}"
    );
    let standby = "[ha]\nmode = \"standby\"\n[lease]\nbackend = \"sqlite:/tmp/x.db\"\n";
    let why = Config::from_toml(standby, "test.toml")
        .unwrap_err()
        .to_string();
    assert!(why.contains("station.id"), "{why}");
    let ok = "[ha]\nmode = \"standby\"\n[station]\nid = \"HVS-3 ESH1234\"\n[lease]\nbackend = \"sqlite:/tmp/x.db\"\n";
    let config = Config::from_toml(ok, "test.toml").unwrap();
    assert_eq!(config.control_lease_name(), "control:station:HVS-3 ESH1234");
    assert_eq!(config.link_owner_key(), "control:station:hvs-3 esh1234");
}

/// `station.id` in another case or spacing is the same station to the
/// link-owner lease; `lease.name` or the URL name it as they are.
#[test]
fn the_link_owner_lease_compares_station_ids_after_normalising_case_and_spaces() {
    let with_id = |id: &str| {
        let mut config = Config::default();
        config.station.id = id.to_owned();
        config
    };
    assert_eq!(
        with_id("HVS-3 ESH1234").link_owner_key(),
        with_id("  hvs-3   esh1234 ").link_owner_key()
    );
    assert_ne!(
        with_id("HVS-3 ESH1234").control_lease_name(),
        with_id("hvs-3 esh1234").control_lease_name(),
        "the control lease keeps the name it was given (a lease kept in the store is found again)"
    );
    let mut named = with_id("HVS-3 ESH1234");
    named.lease.name = "Bench 3".into();
    assert_eq!(named.link_owner_key(), "Bench 3");
    assert_eq!(
        Config::default().link_owner_key(),
        Config::default().control_lease_name()
    );
}

#[test]
fn http_threads_are_one_per_core_at_zero_as_set_otherwise_and_at_most_256() {
    let auto = Config::from_toml("[http]\nthreads = 0\n", "x.toml").unwrap();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(auto.http.connection_threads(), cores);
    let one = Config::from_toml("[http]\nthreads = 1\n", "x.toml").unwrap();
    assert_eq!(one.http.connection_threads(), 1);
    let most = Config::from_toml("[http]\nthreads = 256\n", "x.toml").unwrap();
    assert_eq!(most.http.connection_threads(), 256);
    let error = Config::from_toml("[http]\nthreads = 257\n", "x.toml").unwrap_err();
    assert!(
        error.to_string().contains("http.threads")
            && error.to_string().contains("0 (one per core) to 256"),
        "{error}"
    );
}

#[test]
fn allowed_hosts_and_origins_are_checked_naming_the_key_and_the_entry() {
    let config = Config::from_toml(
        "[http]\nallowed_hosts = [\"gw.lab\", \"*.bench.lab\"]\nallowed_origins = [\"https://dash.lab\", \"http://10.0.0.7:8080\"]\n",
        "x.toml",
    )
    .unwrap();
    assert_eq!(config.http.allowed_hosts, ["gw.lab", "*.bench.lab"]);
    assert!(Config::from_toml("[http]\nallowed_hosts = [\"*\"]\n", "x.toml").is_ok());
    for (toml, key, entry) in [
        (
            "allowed_hosts = [\"gw.lab:5000\"]",
            "http.allowed_hosts",
            "gw.lab:5000",
        ),
        (
            "allowed_hosts = [\"gw/lab\"]",
            "http.allowed_hosts",
            "gw/lab",
        ),
        ("allowed_origins = [\"*\"]", "http.allowed_origins", "\"*\""),
        (
            "allowed_origins = [\"null\"]",
            "http.allowed_origins",
            "null",
        ),
        (
            "allowed_origins = [\"dash.lab\"]",
            "http.allowed_origins",
            "dash.lab",
        ),
        (
            "allowed_origins = [\"https://dash.lab/\"]",
            "http.allowed_origins",
            "dash.lab/",
        ),
        (
            "allowed_origins = [\"ftp://dash.lab\"]",
            "http.allowed_origins",
            "ftp://",
        ),
    ] {
        let error = Config::from_toml(&format!("[http]\n{toml}\n"), "x.toml")
            .unwrap_err()
            .to_string();
        assert!(error.contains(key), "{toml}: {error}");
        assert!(error.contains(entry), "{toml}: {error}");
    }
}

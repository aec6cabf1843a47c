//! Unit tests of which station a request's path is for.

use std::borrow::Cow;

use super::*;

fn two(default: Option<&str>, prefix: &str) -> StationPaths {
    StationPaths::new(vec!["st1".into(), "st2".into()], default, prefix)
}

fn station(index: usize, path: &str) -> StationRoute<'_> {
    StationRoute::Station {
        index,
        path: Cow::Borrowed(path),
    }
}

#[test]
fn a_stations_path_is_its_own_with_the_station_segment_taken_out() {
    let paths = two(None, "");
    assert_eq!(
        paths.route("/stations/st2/api/lease"),
        station(1, "/api/lease")
    );
    assert_eq!(
        paths.route("/stations/st1/api/values/get"),
        station(0, "/api/values/get")
    );
    assert_eq!(paths.route("/stations/st1"), station(0, "/"));
    assert_eq!(paths.route("/stations/st1/"), station(0, "/"));
    assert_eq!(
        paths.route("/stations/st3/api/lease"),
        StationRoute::UnknownStation("st3")
    );
    // Ids are matched as written: they are paths.
    assert_eq!(
        paths.route("/stations/ST1/api/lease"),
        StationRoute::UnknownStation("ST1")
    );
}

#[test]
fn under_a_prefix_the_station_segment_follows_it_and_the_prefix_stays() {
    let paths = two(None, "/gw/");
    assert_eq!(
        paths.route("/gw/stations/st1/api/lease"),
        station(0, "/gw/api/lease")
    );
    assert_eq!(paths.route("/gw/v1/stations"), StationRoute::Lab);
    assert_eq!(paths.route("/gw"), StationRoute::Lab, "the status page");
    // Outside the prefix, and no default: nobody's.
    assert_eq!(
        paths.route("/stations/st1/api/lease"),
        StationRoute::NoDefault
    );
}

#[test]
fn other_paths_are_the_default_stations_or_refused_naming_the_stations() {
    let paths = two(Some("st2"), "");
    assert_eq!(paths.route("/api/lease"), station(1, "/api/lease"));
    assert_eq!(paths.route("/v1/leases/x"), station(1, "/v1/leases/x"));
    let paths = two(None, "");
    let refused = paths.route("/api/lease");
    assert_eq!(refused, StationRoute::NoDefault);
    assert_eq!(
        paths.not_found(&refused),
        "this gateway serves several stations (st1, st2) and none is the default (default_station); ask one by its id, e.g. /stations/st1/api/..."
    );
    assert_eq!(
        paths.not_found(&StationRoute::UnknownStation("st9")),
        "no station \"st9\" here; the stations are st1, st2; ask one by its id, e.g. /stations/st1/api/..."
    );
    // A default that names no station is none.
    assert_eq!(
        two(Some("st9"), "").route("/api/lease"),
        StationRoute::NoDefault
    );
}

#[test]
fn the_labs_own_paths_are_the_whole_gateways_only_with_several_stations() {
    let paths = two(Some("st1"), "");
    for path in [
        "/v1/stations",
        "/metrics",
        "/healthz",
        "/readyz",
        "/",
        "/index.html",
    ] {
        assert_eq!(paths.route(path), StationRoute::Lab, "{path}");
    }
    assert_eq!(paths.route("/v1/stationsx"), station(0, "/v1/stationsx"));
    let one = StationPaths::new(vec!["station".into()], Some("station"), "");
    assert!(!one.several());
    for path in ["/metrics", "/", "/api/lease", "/v1/stations"] {
        assert_eq!(one.route(path), station(0, path), "{path}");
    }
    assert_eq!(
        one.route("/stations/station/api/lease"),
        station(0, "/api/lease")
    );
}

#[test]
fn the_ids_the_default_and_the_prefix_are_as_configured() {
    let paths = two(Some("st2"), "/gw/");
    assert_eq!(paths.ids(), ["st1", "st2"]);
    assert_eq!(paths.default_index(), Some(1));
    assert_eq!(paths.prefix(), "/gw");
    assert_eq!(two(Some("st1"), "").default_index(), Some(0));
    assert_eq!(two(None, "").default_index(), None);
    assert_eq!(two(Some("nope"), "").prefix(), "");
}

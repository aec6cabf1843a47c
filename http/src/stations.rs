//! Which station a request is for, in a gateway of several: `/stations/{id}/...`
//! (below `http.path_prefix`) names one, and the rest of the path is that station's as if the
//! gateway were its alone, so the unchanged clients work with a base URL such as
//! `http://host:5000/stations/st1`. The lab's own endpoints (`/v1/stations`, `/metrics`,
//! `/healthz`, `/readyz`, the status page) are the whole gateway's. Any other path is the
//! default station's: the only one, or `default_station`; with several and none named default
//! it is refused with the stations' ids.
//!
//! Pure: the path in, the decision out, no allocation unless a station's path is rewritten.

use std::borrow::Cow;

/// The path a request came with, kept in its extensions when its station's segment was cut
/// (`/stations/st2/api/...` served as `/api/...`): its audit and access lines show the path as
/// its client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentPath(pub String);

/// Paths (below the prefix) that are the whole gateway's once it serves several stations.
const LAB_PATHS: [&str; 10] = [
    "/v1/stations",
    "/openapi.json",
    "/v1/safe-stop",
    "/v1/stations/events",
    "/metrics",
    "/healthz",
    "/readyz",
    "",
    "/",
    "/index.html",
];

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StationRoute<'a> {
    /// To the station at `index`, with `path` its own (the station segment taken out).
    Station { index: usize, path: Cow<'a, str> },
    /// To the whole gateway (the lab's view, metrics, health, the status page).
    Lab,
    /// `/stations/{id}/...` with an id no station has.
    UnknownStation(&'a str),
    /// A station's path with no station named, and no default station to take it.
    NoDefault,
}

/// The stations' ids in paths, the default one, and the prefix every path is under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StationPaths {
    ids: Vec<String>,
    default: Option<usize>,
    /// `http.path_prefix` without its trailing `/` (empty: none).
    prefix: String,
}

impl StationPaths {
    /// `ids` in order; `default` one of them (`None`: no default); `prefix` as configured.
    pub fn new(ids: Vec<String>, default: Option<&str>, prefix: &str) -> StationPaths {
        let default = default.and_then(|name| ids.iter().position(|id| id == name));
        StationPaths {
            ids,
            default,
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    /// The stations' ids, in order.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The index of the default station, if there is one.
    pub fn default_index(&self) -> Option<usize> {
        self.default
    }

    /// `http.path_prefix` without its trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether there is more than one station (only then are the lab's paths its own).
    pub fn several(&self) -> bool {
        self.ids.len() > 1
    }

    /// Where a request for `path` goes.
    pub fn route<'a>(&self, path: &'a str) -> StationRoute<'a> {
        let Some(below) = path.strip_prefix(self.prefix.as_str()) else {
            // Outside the prefix: the default station answers it (its 404), as one gateway did.
            return self.default_route(path);
        };
        if let Some(rest) = below.strip_prefix("/stations/") {
            let (id, tail) = match rest.find('/') {
                Some(at) => (&rest[..at], &rest[at..]),
                None => (rest, "/"),
            };
            return match self.ids.iter().position(|known| known == id) {
                Some(index) => StationRoute::Station {
                    index,
                    path: Cow::Owned(format!("{}{tail}", self.prefix)),
                },
                None => StationRoute::UnknownStation(id),
            };
        }
        if self.several() && LAB_PATHS.contains(&below) {
            return StationRoute::Lab;
        }
        self.default_route(path)
    }

    fn default_route<'a>(&self, path: &'a str) -> StationRoute<'a> {
        match self.default {
            Some(index) => StationRoute::Station {
                index,
                path: Cow::Borrowed(path),
            },
            None => StationRoute::NoDefault,
        }
    }

    /// The 404's words for a path no station takes: which stations there are, and how to ask
    /// one.
    pub fn not_found(&self, route: &StationRoute<'_>) -> String {
        let ids = self.ids.join(", ");
        let how = format!(
            "ask one by its id, e.g. {}/stations/{}/api/...",
            self.prefix,
            self.ids.first().map_or("ID", String::as_str)
        );
        match route {
            StationRoute::UnknownStation(id) => {
                format!("no station {id:?} here; the stations are {ids}; {how}")
            }
            _ => format!(
                "this gateway serves several stations ({ids}) and none is the default (default_station); {how}"
            ),
        }
    }
}

#[cfg(test)]
mod tests;

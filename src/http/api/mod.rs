//! The endpoint table: one declaration per REST endpoint (method, path, role, lease need,
//! metric label, handler), from which routing (404, 405), access control, lease admission,
//! the metrics labels and the check against `docs/openapi.json` are all derived. Handlers
//! live one module per area. Adding an endpoint is one [`Endpoint`] here and one handler.

mod application;
mod audit;
mod call;
mod channel_config;
mod channels;
mod comm;
mod config_files;
mod events;
mod lease;
mod modules;
mod numeric;
mod resources;
mod unserved;

use std::future::Future;
use std::pin::Pin;

use hyper::Method;

use super::body::JsonBody;
use crate::config::Role;
use crate::lease::Access;

pub(crate) use call::{Answer, Call, Handler};
pub(crate) use unserved::Unserved;
use unserved::*;

/// What an endpoint needs of the control lease; enforced for every request before its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseNeed {
    /// Changes nothing on the station: open to everyone.
    Open,
    /// Reads from the hardware.
    ForcedRead,
    /// Cached reads when the body asks for a `MaxAgeMs` above 0, else forced reads.
    ByMaxAge,
    /// Changes to the station, fenced again at the link.
    Change,
}

impl LeaseNeed {
    /// The access the lease admission is asked for, given the request's body.
    pub fn access(self, body: &JsonBody) -> Access {
        match self {
            LeaseNeed::Open => Access::Open,
            LeaseNeed::ForcedRead => Access::ForcedRead,
            LeaseNeed::Change => Access::Change,
            LeaseNeed::ByMaxAge => match body.optional_u64("MaxAgeMs") {
                Ok(Some(max_age_ms)) if max_age_ms > 0 => Access::CachedRead,
                _ => Access::ForcedRead,
            },
        }
    }
}

/// One REST endpoint below `api/`.
pub(crate) struct Endpoint {
    pub(crate) method: Method,
    /// The path below `api/`; a `{id}` segment matches any one non-empty segment.
    pub(crate) path: &'static str,
    /// The role needed while access control is on.
    pub(crate) role: Role,
    pub(crate) lease: LeaseNeed,
    /// The label of its requests in metrics.
    pub(crate) label: &'static str,
    pub(crate) handler: Handler,
    /// Why it answers 501, for a documented WebApi endpoint this gateway does not serve.
    pub(crate) unserved: Option<Unserved>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label)
    }
}

/// Boxes an `async fn(Call<'_>) -> Answer` into a [`Handler`].
macro_rules! handler {
    ($f:path) => {{
        fn boxed(call: Call<'_>) -> Pin<Box<dyn Future<Output = Answer> + Send + '_>> {
            Box::pin($f(call))
        }
        boxed as Handler
    }};
}

/// `endpoint!(METHOD "path/{id}", Role, LeaseNeed, area::handler)`: one [`Endpoint`], its
/// metric label made from its method and path.
macro_rules! endpoint {
    ($method:ident $path:literal, $role:ident, $lease:ident, $handler:path) => {
        Endpoint {
            method: Method::$method,
            path: $path,
            role: Role::$role,
            lease: LeaseNeed::$lease,
            label: concat!(stringify!($method), " api/", $path),
            handler: handler!($handler),
            unserved: None,
        }
    };
}

/// `unserved!(METHOD "path", WHY)`: a documented WebApi endpoint answered with 501 and the
/// reason `WHY` (`unserved.rs`), open to every reader since it changes nothing.
macro_rules! unserved {
    ($method:ident $path:literal, $why:expr) => {
        Endpoint {
            method: Method::$method,
            path: $path,
            role: Role::Read,
            lease: LeaseNeed::Open,
            label: concat!(stringify!($method), " api/", $path),
            handler: handler!(unserved::answer),
            unserved: Some($why),
        }
    };
}

/// Every REST endpoint of the documented WebApi (the reference clients' `docs/api/*.md`), served
/// or answered with 501 and why. Their position is their metrics slot after the operations'.
pub(crate) static ENDPOINTS: &[Endpoint] = &[
    endpoint!(GET "capabilities", Read, Open, application::capabilities),
    endpoint!(GET "connection/status", Read, Open, application::connection_status),
    endpoint!(GET "resources/names", Read, Open, resources::names),
    endpoint!(POST "resources/value/get", Read, ForcedRead, resources::value_get),
    endpoint!(POST "resources/value/set", Control, Change, resources::value_set),
    endpoint!(POST "resources/values/get", Read, ByMaxAge, resources::values_get),
    endpoint!(POST "resources/values/set", Control, Change, resources::values_set),
    endpoint!(POST "resources/transact", Control, Change, resources::transact),
    endpoint!(GET "channels", Read, Open, channels::list),
    endpoint!(POST "channels/channel", Read, Open, channels::lookup),
    endpoint!(POST "channels/channel/configure", Control, Change, channel_config::configure_one),
    endpoint!(POST "channels/configure", Control, Change, channel_config::configure_many),
    endpoint!(GET "modules", Read, Open, modules::list),
    endpoint!(GET "modules/loaded", Read, Open, modules::list),
    endpoint!(GET "modules/physical-system", Read, Open, modules::physical_system),
    endpoint!(GET "modules/apps", Read, Open, modules::apps),
    endpoint!(GET "modules/apps/licensed", Read, Open, modules::apps),
    endpoint!(GET "application/name", Read, Open, application::name),
    endpoint!(GET "application/identification", Read, Open, application::identification),
    endpoint!(GET "application/status", Read, Open, application::status),
    endpoint!(GET "application/log", Read, Open, application::log),
    endpoint!(POST "application/reset", Control, Change, application::reset),
    endpoint!(GET "application/config/list", Read, Open, config_files::list),
    endpoint!(GET "application/config/loaded", Read, Open, config_files::loaded),
    endpoint!(POST "application/config/load", Control, Change, config_files::load),
    endpoint!(POST "application/config/save", Control, ForcedRead, config_files::save),
    endpoint!(GET "application/config/download/{id}", Read, Open, config_files::download),
    endpoint!(POST "application/config/upload", Control, Open, config_files::upload),
    endpoint!(DELETE "application/config/{id}", Control, Open, config_files::delete),
    endpoint!(GET "events", Read, Open, events::open_stream),
    endpoint!(POST "subscriptions", Read, Open, events::subscribe),
    endpoint!(PUT "subscriptions/{id}", Read, Open, events::update),
    endpoint!(DELETE "subscriptions/{id}", Read, Open, events::unsubscribe),
    endpoint!(GET "lease", Read, Open, lease::status),
    endpoint!(POST "lease", Control, Open, lease::acquire),
    endpoint!(DELETE "lease", Admin, Open, lease::break_lease),
    endpoint!(PUT "lease/{id}", Control, Open, lease::renew),
    endpoint!(DELETE "lease/{id}", Control, Open, lease::release),
    endpoint!(GET "audit/log", Admin, Open, audit::log),
    // What a station behind the byte protocol does not have.
    unserved!(POST "comm/socket", SOCKET),
    unserved!(GET "channels/encoded", ENCODED),
    unserved!(POST "channels/configure/encoded", ENCODED),
    unserved!(POST "modules/load", MODULE_LOADING),
    unserved!(POST "modules/unload", MODULE_LOADING),
    unserved!(POST "modules/configure", MODULE_LOADING),
    unserved!(GET "instruments", INSTRUMENTS),
    unserved!(GET "calibration/channels", CALIBRATION),
    unserved!(GET "calibration/table", CALIBRATION),
    unserved!(POST "calibration/table", CALIBRATION),
    unserved!(GET "media", MEDIA),
    unserved!(GET "media/{id}", MEDIA),
    unserved!(POST "media/upload", MEDIA),
    unserved!(DELETE "media/{id}", MEDIA),
    unserved!(GET "files", FILES),
    unserved!(GET "files/{id}", FILES),
    unserved!(DELETE "files/{id}", FILES),
    unserved!(GET "files/{id}/content", FILES),
    unserved!(PUT "files/{id}/content", FILES),
    unserved!(POST "files/{id}/folder", FILES),
    unserved!(POST "files/{id}/move", FILES),
    unserved!(GET "system/firmware", FIRMWARE),
    unserved!(GET "system/firmware/releases", FIRMWARE),
    unserved!(PUT "system/firmware/source", FIRMWARE),
    unserved!(GET "system/firmware/update", FIRMWARE),
    unserved!(POST "system/firmware/update", FIRMWARE),
    unserved!(GET "system/firmware/update/log", FIRMWARE),
    unserved!(POST "system/firmware/packages", FIRMWARE),
    unserved!(DELETE "system/firmware/packages/{id}", FIRMWARE),
    unserved!(GET "system/services", SYSTEM),
    unserved!(POST "system/services/{id}/{id}", SYSTEM),
    unserved!(POST "system/reboot", SYSTEM),
    unserved!(GET "system/clock", SYSTEM),
    unserved!(PUT "system/clock", SYSTEM),
    unserved!(GET "system/boot", SYSTEM),
    unserved!(PUT "system/boot", SYSTEM),
    unserved!(PUT "system/boot/startup", SYSTEM),
    endpoint!(GET "numeric-results/channels", Read, Open, numeric::channels),
    endpoint!(GET "numeric-results/targets", Read, Open, numeric::targets),
    endpoint!(POST "numeric-results/acquire", Control, Change, numeric::acquire),
    endpoint!(POST "numeric-results/measure", Control, Change, numeric::measure),
    endpoint!(GET "numeric-results/result/{id}", Read, Open, numeric::result),
    endpoint!(POST "comm/i2c", Control, Change, comm::i2c),
    endpoint!(POST "comm/uart", Control, Change, comm::uart),
    endpoint!(POST "comm/spi", Control, Change, comm::spi),
];

/// Endpoints whose body is not one JSON object (a list, a file upload): their handlers read
/// `Call::raw` themselves.
pub(crate) const RAW_BODY_LABELS: &[&str] = &[
    "POST api/channels/channel/configure",
    "POST api/channels/configure",
    "POST api/application/config/upload",
];

/// The metric label of `POST api/lease`, whose 409s count as refusals of a held lease.
pub(crate) const LEASE_ACQUIRE_LABEL: &str = "POST api/lease";
/// The metric label of `DELETE api/lease`, the admin break, which the admin token opens.
pub(crate) const LEASE_BREAK_LABEL: &str = "DELETE api/lease";

/// Why no endpoint answers a method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotRouted {
    /// No endpoint has this path: 404.
    NoSuchPath,
    /// The path exists, with other methods: 405.
    WrongMethod,
}

/// The `{id}` when `path` has the shape of `template`.
fn matches<'p>(template: &str, path: &'p str) -> Option<&'p str> {
    let mut id = "";
    let mut wanted = template.split('/');
    let mut given = path.split('/');
    loop {
        match (wanted.next(), given.next()) {
            (None, None) => return Some(id),
            (Some("{id}"), Some(segment)) if !segment.is_empty() => id = segment,
            (Some(literal), Some(segment)) if literal == segment => {}
            _ => return None,
        }
    }
}

/// The endpoint (and its position) for a method and a path below `api/`, with the path's `{id}`.
pub(crate) fn find<'p>(
    method: &Method,
    path: &'p str,
) -> Result<(usize, &'static Endpoint, &'p str), NotRouted> {
    let mut path_known = false;
    for (position, endpoint) in ENDPOINTS.iter().enumerate() {
        if let Some(id) = matches(endpoint.path, path) {
            if endpoint.method == *method {
                return Ok((position, endpoint, id));
            }
            path_known = true;
        }
    }
    Err(if path_known {
        NotRouted::WrongMethod
    } else {
        NotRouted::NoSuchPath
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_to_their_endpoint_with_the_id_and_known_paths_refuse_other_methods() {
        let (_, endpoint, id) = find(&Method::PUT, "lease/abc").unwrap();
        assert_eq!((endpoint.label, id), ("PUT api/lease/{id}", "abc"));
        let (_, endpoint, id) = find(&Method::DELETE, "subscriptions/s1").unwrap();
        assert_eq!(
            (endpoint.label, id),
            ("DELETE api/subscriptions/{id}", "s1")
        );
        let (_, endpoint, _) = find(&Method::DELETE, "lease").unwrap();
        assert_eq!(endpoint.role, Role::Admin);
        assert_eq!(
            find(&Method::GET, "lease/abc").unwrap_err(),
            NotRouted::WrongMethod
        );
        assert_eq!(
            find(&Method::HEAD, "capabilities").unwrap_err(),
            NotRouted::WrongMethod
        );
        assert_eq!(
            find(&Method::PUT, "lease").unwrap_err(),
            NotRouted::WrongMethod
        );
        for unknown in [
            "lease/a/b",
            "lease/",
            "subscriptions/",
            "Capabilities",
            "",
            "nope",
        ] {
            assert_eq!(
                find(&Method::GET, unknown).unwrap_err(),
                NotRouted::NoSuchPath,
                "{unknown}"
            );
        }
    }

    #[test]
    fn every_endpoint_is_reached_by_its_own_method_and_path() {
        for (position, endpoint) in ENDPOINTS.iter().enumerate() {
            let path = endpoint.path.replace("{id}", "x1");
            let (found, _, _) = find(&endpoint.method, &path).unwrap();
            assert_eq!(found, position, "{endpoint:?}");
            assert_eq!(
                endpoint.label,
                format!("{} api/{}", endpoint.method, endpoint.path)
            );
        }
        assert!(ENDPOINTS.iter().any(|e| e.label == LEASE_ACQUIRE_LABEL));
    }

    /// `docs/openapi.json` lists exactly the table's endpoints (path parameters by any name).
    #[test]
    fn the_openapi_document_lists_every_endpoint_and_no_other() {
        let doc: serde_json::Value =
            serde_json::from_str(super::super::openapi::OPENAPI_JSON).unwrap();
        let mut documented: Vec<String> = Vec::new();
        for (path, operations) in doc["paths"].as_object().unwrap() {
            let Some(below_api) = path.strip_prefix("/api/") else {
                continue;
            };
            let template: Vec<&str> = below_api
                .split('/')
                .map(|segment| {
                    if segment.starts_with('{') {
                        "{id}"
                    } else {
                        segment
                    }
                })
                .collect();
            let methods = operations.as_object().unwrap().keys();
            for method in
                methods.filter(|key| ["get", "post", "put", "delete"].contains(&key.as_str()))
            {
                documented.push(format!(
                    "{} api/{}",
                    method.to_uppercase(),
                    template.join("/")
                ));
            }
        }
        let mut table: Vec<String> = ENDPOINTS.iter().map(|e| e.label.to_owned()).collect();
        documented.sort();
        table.sort();
        assert_eq!(table, documented);
    }

    #[test]
    fn lease_needs_follow_the_max_age_of_the_body() {
        let cached = JsonBody::parse(br#"{"maxagems": 5}"#).unwrap();
        let forced = JsonBody::parse(br#"{"MaxAgeMs": 0}"#).unwrap();
        let none = JsonBody::parse(b"").unwrap();
        assert_eq!(LeaseNeed::ByMaxAge.access(&cached), Access::CachedRead);
        assert_eq!(LeaseNeed::ByMaxAge.access(&forced), Access::ForcedRead);
        assert_eq!(LeaseNeed::ByMaxAge.access(&none), Access::ForcedRead);
        assert_eq!(LeaseNeed::Change.access(&cached), Access::Change);
        assert_eq!(LeaseNeed::ForcedRead.access(&none), Access::ForcedRead);
        assert_eq!(LeaseNeed::Open.access(&cached), Access::Open);
    }
}

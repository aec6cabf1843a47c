//! The route table: one row per route of the gateway, in metrics-slot order. The operations
//! (`/healthz`, `/readyz`, `/metrics`, the status page), named leases (`v1/...`) and one
//! declaration per REST endpoint (method, path, role, lease need, body kind, audit class,
//! authority, metric label, handler and the request type it takes), from which routing (404,
//! 405), access control, lease admission, how the body is read and typed, the audit trail's
//! class, the metrics labels and the check against `docs/openapi.json` are all derived.
//! Handlers live one module per area. Adding an endpoint is one row here and one handler.

mod access_explain;
mod application;
mod audit;
mod call;
mod channel_config;
mod channels;
mod comm;
mod config_files;
mod events;
mod history;
mod lease;
mod modules;
mod numeric;
mod resources;
mod route;
pub(crate) mod safe_stop;
mod unserved;

use foldhash::{HashMap, HashMapExt};
use std::sync::LazyLock;

use hyper::Method;

use crate::allow::Allowed;
use crate::body::JsonBody;
use crate::config::Role;
use crate::error::ApiError;
use crate::requests::NoBody;
use crate::requests::access::AccessExplainRequest;
use crate::requests::channels::ChannelLookupRequest;
use crate::requests::comm::BusTransactionRequest;
use crate::requests::config_files::ConfigFileRequest;
use crate::requests::events::{SubscribeRequest, SubscriptionBody};
use crate::requests::lease::{LeaseAcquireRequest, LeaseRenewRequest};
use crate::requests::numeric::{NumericAcquireRequest, NumericMeasureRequest};
use crate::requests::resources::{
    ResourceNameRequest, ResourceValueRequest, ResourceValuesRequest, ResourceValuesSetRequest,
};
use crate::requests::safe_stop::SafeStopRequest;

pub(crate) use call::{Admit, Answering, Call, Handler};
pub(crate) use route::{AskedFrom, AuditClass, Authority, BodyKind, Endpoint, Route};
pub use route::{LeaseNeed, Operation};
use unserved::*;

/// A [`Handler`] from an `async fn(Call<'_>, SomeRequest) -> Answer` (`handler => SomeRequest`):
/// the body typed once as `SomeRequest`, then the function's future, boxed; from an `async
/// fn(Call<'_>) -> Answer` alone, a body of [`NoBody`](crate::requests::NoBody).
macro_rules! handler {
    ($f:path => $request:ty) => {{
        fn typed<'a>(body: JsonBody, admit: &mut dyn Admit<'a>) -> Result<Answering<'a>, ApiError> {
            let (call, request) = call::typed::<$request>(body, admit)?;
            Ok(Box::pin($f(call, request)))
        }
        typed as Handler
    }};
    ($f:path) => {{
        fn untyped<'a>(
            body: JsonBody,
            admit: &mut dyn Admit<'a>,
        ) -> Result<Answering<'a>, ApiError> {
            let (call, NoBody {}) = call::typed::<NoBody>(body, admit)?;
            Ok(Box::pin($f(call)))
        }
        untyped as Handler
    }};
}

/// The given value, else the default: `or_default!(DEFAULT $(, GIVEN)?)`.
macro_rules! or_default {
    ($default:expr) => {
        $default
    };
    ($default:expr, $given:expr) => {
        $given
    };
}

/// `endpoint!(METHOD "path/{id}", Role, LeaseNeed, area::handler => Request)`: one REST
/// [`Endpoint`], its metric label made from its method and path, its body JSON typed as
/// `Request` (none named: [`NoBody`]), audited as a change when it changes the station, opened
/// by credentials with its role. A row says otherwise with `, body: JsonRaw` or `, body:
/// Multipart`, `, audit: Change`, `, asked: area::asked_of`, `, authority:
/// AdminTokenOrCredentials` (in this order).
macro_rules! endpoint {
    ($method:ident $path:literal, $role:ident, $lease:ident, $handler:path $(=> $request:ty)?
        $(, body: $body:ident)? $(, audit: $audit:ident)? $(, asked: $asked:path)?
        $(, authority: $authority:ident)?) => {
        Route::Api(Endpoint {
            method: Method::$method,
            path: $path,
            role: Role::$role,
            authority: or_default!(Authority::Credentials $(, Authority::$authority)?),
            lease: LeaseNeed::$lease,
            body: or_default!(BodyKind::Json $(, BodyKind::$body)?),
            audit: or_default!(AuditClass::of(LeaseNeed::$lease) $(, AuditClass::$audit)?),
            asked: or_default!(route::asked_in_body $(, $asked)?),
            label: concat!(stringify!($method), " api/", $path),
            handler: handler!($handler $(=> $request)?),
            unserved: None,
        })
    };
}

/// `unserved!(METHOD "path", WHY)`: a documented WebApi endpoint answered with 404 (what a
/// byte-protocol station cannot offer) or 501 (not yet served) and the reason `WHY`
/// (`unserved.rs`), open to every reader since it changes nothing; its body (a
/// file upload, a multipart form) is read, not judged.
macro_rules! unserved {
    ($method:ident $path:literal, $why:expr) => {
        Route::Api(Endpoint {
            method: Method::$method,
            path: $path,
            role: Role::Read,
            authority: Authority::Credentials,
            lease: LeaseNeed::Open,
            body: BodyKind::Raw,
            audit: AuditClass::Request,
            asked: route::asked_in_body,
            label: concat!(stringify!($method), " api/", $path),
            handler: handler!(unserved::answer),
            unserved: Some($why),
        })
    };
}

/// `v1!(METHOD "/v1/path", Role, LeaseNeed, area::handler => Request, audit: Class)`: an
/// endpoint beside `api/` at its own path below `http.path_prefix`, its body JSON typed as
/// `Request` (none named: [`NoBody`]), opened by credentials with its role.
macro_rules! v1 {
    ($method:ident $path:literal, $role:ident, $lease:ident, $handler:path $(=> $request:ty)?,
        audit: $audit:ident) => {
        Route::V1(Endpoint {
            method: Method::$method,
            path: $path,
            role: Role::$role,
            authority: Authority::Credentials,
            lease: LeaseNeed::$lease,
            body: BodyKind::Json,
            audit: AuditClass::$audit,
            asked: route::asked_in_body,
            label: concat!(stringify!($method), " ", $path),
            handler: handler!($handler $(=> $request)?),
            unserved: None,
        })
    };
}

/// `operation!("GET /label", Operation, "/path" | ..., role)`: an operations endpoint beside
/// `api/`; `role` is `Some(Role::...)` or `None` (open to anyone).
macro_rules! operation {
    ($label:literal, $operation:ident, [$($path:literal),+], $role:expr) => {
        Route::Operation {
            label: $label,
            paths: &[$($path),+],
            operation: Operation::$operation,
            role: $role,
        }
    };
}

/// Every route: the operations, named leases, then every REST endpoint of the documented WebApi
/// (the reference clients' `docs/api/*.md`), served or answered with 404 and why. A row's
/// position is its metrics slot after `unmatched` ([`slot`]).
pub(crate) static ROUTES: &[Route] = &[
    operation!("GET /healthz", Healthz, ["/healthz"], None),
    operation!("GET /readyz", Readyz, ["/readyz"], None),
    operation!("GET /metrics", Metrics, ["/metrics"], Some(Role::Read)),
    operation!(
        "GET /",
        StatusPage,
        ["", "/", "/index.html"],
        Some(Role::Read)
    ),
    operation!(
        "GET /status.json",
        StatusJson,
        ["/status.json"],
        Some(Role::Read)
    ),
    Route::NamedLeases {
        label: "v1/leases and v1/semaphores",
    },
    v1!(POST "/v1/safe-stop", Control, Open, safe_stop::press => SafeStopRequest, audit: Change),
    v1!(POST "/v1/access/explain", Read, Open, access_explain::explain => AccessExplainRequest, audit: Request),
    v1!(GET "/v1/history", Read, Open, history::query, audit: Request),
    endpoint!(GET "capabilities", Read, Open, application::capabilities),
    endpoint!(GET "connection/status", Read, Open, application::connection_status),
    endpoint!(GET "resources/names", Read, Open, resources::names),
    endpoint!(POST "resources/value/get", Read, ForcedRead, resources::value_get => ResourceNameRequest),
    endpoint!(POST "resources/value/set", Control, Change, resources::value_set => ResourceValueRequest),
    endpoint!(POST "resources/values/get", Read, ByMaxAge, resources::values_get => ResourceValuesRequest),
    endpoint!(POST "resources/values/set", Control, Change, resources::values_set => ResourceValuesSetRequest),
    endpoint!(POST "resources/transact", Control, Change, resources::transact => ResourceValueRequest),
    endpoint!(GET "channels", Read, Open, channels::list),
    endpoint!(POST "channels/channel", Read, Open, channels::lookup => ChannelLookupRequest),
    endpoint!(POST "channels/channel/configure", Control, Change, channel_config::configure_one, body: JsonRaw),
    endpoint!(POST "channels/configure", Control, Change, channel_config::configure_many, body: JsonRaw),
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
    endpoint!(POST "application/config/load", Control, Change, config_files::load => ConfigFileRequest),
    endpoint!(POST "application/config/save", Control, ForcedRead, config_files::save => ConfigFileRequest),
    endpoint!(GET "application/config/download/{id}", Read, Open, config_files::download),
    // Replacing or deleting the file the holder is about to load is a change: the lease's.
    endpoint!(POST "application/config/upload", Control, Change, config_files::upload, body: Multipart, asked: config_files::asked_upload),
    endpoint!(DELETE "application/config/{id}", Control, Change, config_files::delete, asked: config_files::asked_delete),
    endpoint!(GET "events", Read, Open, events::open_stream),
    endpoint!(POST "subscriptions", Read, Open, events::subscribe => SubscribeRequest),
    endpoint!(PUT "subscriptions/{id}", Read, Open, events::update => SubscriptionBody),
    endpoint!(DELETE "subscriptions/{id}", Read, Open, events::unsubscribe),
    endpoint!(GET "lease", Read, Open, lease::status),
    endpoint!(POST "lease", Control, Open, lease::acquire => LeaseAcquireRequest, audit: Change),
    endpoint!(DELETE "lease", Admin, Open, lease::break_lease, audit: Change, authority: AdminTokenOrCredentials),
    endpoint!(PUT "lease/{id}", Control, Open, lease::renew => LeaseRenewRequest, audit: Change),
    endpoint!(DELETE "lease/{id}", Control, Open, lease::release, audit: Change),
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
    endpoint!(POST "numeric-results/acquire", Control, Change, numeric::acquire => NumericAcquireRequest),
    endpoint!(POST "numeric-results/measure", Control, Change, numeric::measure => NumericMeasureRequest),
    endpoint!(GET "numeric-results/result/{id}", Read, Open, numeric::result),
    endpoint!(POST "comm/i2c", Control, Change, comm::i2c => BusTransactionRequest),
    endpoint!(POST "comm/uart", Control, Change, comm::uart => BusTransactionRequest),
    endpoint!(POST "comm/spi", Control, Change, comm::spi => BusTransactionRequest),
];

/// The metric label of `POST api/lease`, whose 409s count as refusals of a held lease.
pub(crate) const LEASE_ACQUIRE_LABEL: &str = "POST api/lease";

/// The metrics slot of requests that matched no route.
pub const UNMATCHED_SLOT: usize = 0;

/// The metrics slot of the route at `position` in [`ROUTES`]: after `unmatched`.
pub fn slot(position: usize) -> usize {
    1 + position
}

/// Every metrics label, in slot order.
pub fn metric_labels() -> Vec<&'static str> {
    let mut labels = vec!["unmatched"];
    labels.extend(ROUTES.iter().map(Route::label));
    labels
}

/// The slot of `POST api/lease`, whose 409s count as refusals of a held lease.
pub fn lease_acquire_slot() -> Option<usize> {
    ROUTES
        .iter()
        .position(|route| route.label() == LEASE_ACQUIRE_LABEL)
        .map(slot)
}

/// Every REST endpoint, in table order.
pub(crate) fn endpoints() -> impl Iterator<Item = &'static Endpoint> {
    ROUTES.iter().filter_map(Route::endpoint)
}

/// A route found for a request: its position in [`ROUTES`], the row, and the `{id}` of its path.
pub(crate) type Found<'p> = (usize, &'static Route, &'p str);

/// The route table indexed once, so a request is routed by a hash lookup rather than by
/// comparing its path with every row.
struct RouteIndex {
    /// `below_prefix` paths of the operations and the endpoints beside `api/`: the first row.
    operations: HashMap<&'static str, usize>,
    /// REST paths without `{id}`: their rows, in table order.
    exact: HashMap<&'static str, Vec<usize>>,
    /// The rows of REST paths with `{id}`, in table order.
    templated: Vec<usize>,
}

static INDEX: LazyLock<RouteIndex> = LazyLock::new(|| {
    let mut index = RouteIndex {
        operations: HashMap::new(),
        exact: HashMap::new(),
        templated: Vec::new(),
    };
    for (position, route) in ROUTES.iter().enumerate() {
        match route {
            Route::Operation { paths, .. } => {
                for path in paths.iter() {
                    index.operations.entry(path).or_insert(position);
                }
            }
            Route::V1(endpoint) => {
                index.operations.entry(endpoint.path).or_insert(position);
            }
            Route::Api(endpoint) if endpoint.path.split('/').any(|s| s == "{id}") => {
                index.templated.push(position);
            }
            Route::Api(endpoint) => index.exact.entry(endpoint.path).or_default().push(position),
            Route::NamedLeases { .. } => {}
        }
    }
    index
});

/// The operations endpoint, or the endpoint beside `api/` (`/v1/safe-stop`), at `below_prefix`
/// (the path after `http.path_prefix`), any method.
pub(crate) fn find_operation(below_prefix: &str) -> Option<Found<'static>> {
    let position = *INDEX.operations.get(below_prefix)?;
    Some((position, &ROUTES[position], ""))
}

/// The named leases' row.
pub(crate) fn named_leases() -> Found<'static> {
    ROUTES
        .iter()
        .enumerate()
        .find(|(_, route)| matches!(route, Route::NamedLeases { .. }))
        .map(|(position, route)| (position, route, ""))
        .expect("the route table has a row for named leases")
}

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

/// The REST endpoint's row (and its position) for a method and a path below `api/`, with the
/// path's `{id}`: the first row in table order whose method and path match.
pub(crate) fn find<'p>(method: &Method, path: &'p str) -> Result<Found<'p>, NotRouted> {
    let index = &*INDEX;
    let mut path_known = false;
    let mut best: Option<(usize, &'p str)> = None;
    for &position in index.exact.get(path).into_iter().flatten() {
        path_known = true;
        if ROUTES[position]
            .endpoint()
            .is_some_and(|e| e.method == *method)
        {
            best = Some((position, ""));
            break;
        }
    }
    for &position in &index.templated {
        if best.is_some_and(|(found, _)| found < position) {
            break;
        }
        let Some(endpoint) = ROUTES[position].endpoint() else {
            continue;
        };
        if let Some(id) = matches(endpoint.path, path) {
            path_known = true;
            if endpoint.method == *method {
                best = Some((position, id));
                break;
            }
        }
    }
    match best {
        Some((position, id)) => Ok((position, &ROUTES[position], id)),
        None if path_known => Err(NotRouted::WrongMethod),
        None => Err(NotRouted::NoSuchPath),
    }
}

/// The methods that have a row for `path` below `api/` (every row whose path it has the shape
/// of): what a 405's `Allow` names. Looked up only for a 405, never on a routed request.
pub(crate) fn allowed(path: &str) -> Allowed {
    let index = &*INDEX;
    let exact = index.exact.get(path).into_iter().flatten();
    exact
        .chain(index.templated.iter())
        .filter_map(|&position| ROUTES[position].endpoint())
        .filter(|endpoint| matches(endpoint.path, path).is_some())
        .fold(Allowed::NONE, |set, endpoint| set.with(&endpoint.method))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::JsonBody;
    use crate::lease::Access;

    /// The endpoint a method and path route to, with the path's `{id}`.
    fn endpoint_at(method: Method, path: &str) -> (&'static Endpoint, &str) {
        let (_, route, id) = find(&method, path).unwrap();
        (route.endpoint().unwrap(), id)
    }

    #[test]
    fn paths_route_to_their_endpoint_with_the_id_and_known_paths_refuse_other_methods() {
        let (endpoint, id) = endpoint_at(Method::PUT, "lease/abc");
        assert_eq!((endpoint.label, id), ("PUT api/lease/{id}", "abc"));
        let (endpoint, id) = endpoint_at(Method::DELETE, "subscriptions/s1");
        assert_eq!(
            (endpoint.label, id),
            ("DELETE api/subscriptions/{id}", "s1")
        );
        let (endpoint, _) = endpoint_at(Method::DELETE, "lease");
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
        for (position, route) in ROUTES.iter().enumerate() {
            let Some(endpoint) = route.endpoint() else {
                continue;
            };
            let path = endpoint.path.replace("{id}", "x1");
            let (found, _, _) = find(&endpoint.method, &path).unwrap();
            assert_eq!(found, position, "{endpoint:?}");
            assert_eq!(
                endpoint.label,
                format!("{} api/{}", endpoint.method, endpoint.path)
            );
        }
        assert!(endpoints().any(|e| e.label == LEASE_ACQUIRE_LABEL));
        let labels = metric_labels();
        for (at, label) in labels.iter().enumerate() {
            assert_eq!(labels.iter().position(|l| l == label), Some(at), "{label}");
        }
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
        let mut table: Vec<String> = endpoints().map(|e| e.label.to_owned()).collect();
        documented.sort();
        table.sort();
        assert_eq!(table, documented);
        // What is not served is documented with the status it answers, and no other.
        for endpoint in endpoints() {
            let Some(unserved) = endpoint.unserved else {
                continue;
            };
            let status = crate::error::http_status(unserved.error(endpoint.label).kind);
            let (method, path) = endpoint.label.split_once(' ').unwrap();
            let operation = doc["paths"]
                .as_object()
                .unwrap()
                .iter()
                .find(|(documented, _)| {
                    let template: Vec<&str> = documented
                        .trim_start_matches('/')
                        .split('/')
                        .map(|s| if s.starts_with('{') { "{id}" } else { s })
                        .collect();
                    template.join("/") == path
                })
                .map(|(_, operations)| &operations[method.to_lowercase()])
                .unwrap();
            let responses = operation["responses"].as_object().unwrap();
            assert!(
                responses.contains_key(status.as_str()),
                "{}: documents {:?}, answers {status}",
                endpoint.label,
                responses.keys().collect::<Vec<_>>()
            );
            assert!(
                !responses.contains_key("501") || status.as_u16() == 501,
                "{}",
                endpoint.label
            );
        }
    }

    /// Every operation `docs/openapi.json` documents has a 405 whose `Allow` lists what its
    /// path has, as the gateway answers it: below `api/` the table's rows for the path, beside
    /// it the `/v1/` row's method, the named leases' methods, GET and HEAD for the document.
    #[test]
    fn the_openapi_document_gives_every_operation_a_405_with_its_paths_allow() {
        let doc: serde_json::Value =
            serde_json::from_str(super::super::openapi::OPENAPI_JSON).unwrap();
        let mut checked = 0;
        for (path, operations) in doc["paths"].as_object().unwrap() {
            // A path with its parameters as the gateway would be sent them.
            let concrete: String = path
                .split('/')
                .map(|s| if s.starts_with('{') { "x1" } else { s })
                .collect::<Vec<_>>()
                .join("/");
            let allow = if let Some(below_api) = concrete.strip_prefix("/api/") {
                allowed(below_api)
            } else if concrete == "/openapi.json" {
                Allowed::GET_AND_HEAD
            } else if let Some((_, Route::V1(endpoint), _)) = find_operation(&concrete) {
                Allowed::NONE.with(&endpoint.method)
            } else if concrete.starts_with("/v1/leases/") || concrete.starts_with("/v1/semaphores/")
            {
                crate::named_leases::methods()
            } else {
                panic!("{path}: documented, but no route of the gateway's");
            };
            assert!(!allow.is_empty(), "{path}");
            let operations = operations.as_object().unwrap().iter();
            for (method, operation) in operations.filter(|(key, _)| *key != "parameters") {
                let refused = &operation["responses"]["405"];
                assert_eq!(
                    refused["headers"]["Allow"]["schema"]["enum"],
                    serde_json::json!([allow.listed()]),
                    "{method} {path}: its 405 {refused}"
                );
                assert_eq!(
                    refused["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/Error",
                    "{method} {path}"
                );
                checked += 1;
            }
        }
        assert!(checked > 80, "only {checked} operations");
    }

    /// `docs/openapi.json` says what a browser's requests may get: 421 on every operation (a
    /// host the gateway is not known by), 403 on every one a page of another site may not
    /// send, 415 on every one that reads a body of a type, as the table's rows decide.
    #[test]
    fn the_openapi_document_tells_the_browser_refusals_where_they_apply() {
        let doc: serde_json::Value =
            serde_json::from_str(super::super::openapi::OPENAPI_JSON).unwrap();
        let template = |path: &str| -> String {
            path.split('/')
                .map(|s| if s.starts_with('{') { "{id}" } else { s })
                .collect::<Vec<_>>()
                .join("/")
        };
        let mut checked = 0;
        for (path, operations) in doc["paths"].as_object().unwrap() {
            for (method, operation) in operations.as_object().unwrap() {
                if !["get", "post", "put", "delete"].contains(&method.as_str()) {
                    continue;
                }
                let method: Method = method.to_uppercase().parse().unwrap();
                let responses = &operation["responses"];
                assert!(responses.get("421").is_some(), "{method} {path}: no 421");
                let route = match path.strip_prefix("/api/") {
                    Some(below) => find(&method, &template(below))
                        .map(|(_, route, _)| route)
                        .ok(),
                    None if path.starts_with("/v1/leases/")
                        || path.starts_with("/v1/semaphores/") =>
                    {
                        Some(named_leases().1)
                    }
                    None => find_operation(path).map(|(_, route, _)| route),
                };
                let Some(route) = route else {
                    assert_eq!(path, "/openapi.json");
                    continue;
                };
                let documents = |status: &str| {
                    responses
                        .get(status)
                        .and_then(|r| r["description"].as_str())
                        .unwrap_or_default()
                        .to_owned()
                };
                assert_eq!(
                    documents("403").contains("http.allowed_origins"),
                    route.can_change(&method),
                    "{method} {path}: {}",
                    documents("403")
                );
                let expected = match route {
                    Route::Api(endpoint) | Route::V1(endpoint) => {
                        endpoint.body.media_type().filter(|_| {
                            matches!(endpoint.method, Method::POST | Method::PUT)
                                && operation.get("requestBody").is_some()
                        })
                    }
                    Route::NamedLeases { .. } => matches!(method, Method::POST | Method::PUT)
                        .then_some(crate::body::media_type::MediaType::Json),
                    Route::Operation { .. } => None,
                };
                match expected {
                    Some(media_type) => assert!(
                        documents("415").contains(media_type.essence()),
                        "{method} {path}: its 415"
                    ),
                    None => assert!(responses.get("415").is_none(), "{method} {path}"),
                }
                checked += 1;
            }
        }
        assert!(checked > 80, "only {checked} operations");
    }

    #[test]
    fn a_paths_allow_is_every_row_it_has_the_shape_of() {
        assert_eq!(allowed("lease").listed(), "GET, POST, DELETE");
        assert_eq!(allowed("lease/abc").listed(), "PUT, DELETE");
        assert_eq!(allowed("capabilities").listed(), "GET");
        // A file called "list" is a file too.
        assert_eq!(allowed("application/config/list").listed(), "GET, DELETE");
        assert!(allowed("nope").is_empty());
    }

    /// What a web page of another site may not send: every change of the station, the lease's
    /// own (acquire, renew, release, break), the safe stop, the configuration files (upload,
    /// save, delete), the hardware reads (a read may consume what it reads), named leases
    /// other than their status; everything else (reads of what the gateway holds, channel
    /// lookups, subscriptions, the operations) it may.
    #[test]
    fn the_rows_say_which_requests_can_change_something() {
        let guarded: Vec<&str> = ROUTES
            .iter()
            .filter_map(|route| match route {
                Route::Api(endpoint) | Route::V1(endpoint) => {
                    route.can_change(&endpoint.method).then_some(endpoint.label)
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            guarded,
            [
                "POST /v1/safe-stop",
                "POST api/resources/value/get",
                "POST api/resources/value/set",
                "POST api/resources/values/get",
                "POST api/resources/values/set",
                "POST api/resources/transact",
                "POST api/channels/channel/configure",
                "POST api/channels/configure",
                "POST api/application/reset",
                "POST api/application/config/load",
                "POST api/application/config/save",
                "POST api/application/config/upload",
                "DELETE api/application/config/{id}",
                "POST api/lease",
                "DELETE api/lease",
                "PUT api/lease/{id}",
                "DELETE api/lease/{id}",
                "POST api/numeric-results/acquire",
                "POST api/numeric-results/measure",
                "POST api/comm/i2c",
                "POST api/comm/uart",
                "POST api/comm/spi",
            ]
        );
        for endpoint in endpoints().filter(|e| e.audit == AuditClass::Change) {
            assert!(guarded.contains(&endpoint.label), "{endpoint:?}");
        }
        let (_, named, _) = named_leases();
        for (method, guarded) in [
            (Method::GET, false),
            (Method::HEAD, false),
            (Method::POST, true),
            (Method::PUT, true),
            (Method::DELETE, true),
        ] {
            assert_eq!(named.can_change(&method), guarded, "{method}");
        }
        let (_, status_page, _) = find_operation("/").unwrap();
        assert!(!status_page.can_change(&Method::POST));
    }

    #[test]
    fn lease_needs_follow_the_max_age_of_the_body() {
        use crate::requests::RequestBody;
        let cached = |text: &str| {
            JsonBody::parse(text.as_bytes())
                .unwrap()
                .typed::<ResourceValuesRequest>()
                .unwrap()
                .cached()
        };
        let asks_cached = cached(r#"{"Names": ["A"], "maxagems": 5}"#);
        assert_eq!(LeaseNeed::ByMaxAge.access(asks_cached), Access::CachedRead);
        let forced = cached(r#"{"Names": ["A"], "MaxAgeMs": 0}"#);
        assert_eq!(LeaseNeed::ByMaxAge.access(forced), Access::ForcedRead);
        assert_eq!(LeaseNeed::ByMaxAge.access(cached("{}")), Access::ForcedRead);
        // A maximum age the handler refuses asks for nothing cached; bad names do not hide one.
        assert!(!cached(r#"{"Names": ["A"], "MaxAgeMs": "5"}"#));
        assert!(cached(r#"{"Names": 5, "MaxAgeMs": 5}"#));
        assert_eq!(LeaseNeed::Change.access(true), Access::Change);
        assert_eq!(LeaseNeed::ForcedRead.access(false), Access::ForcedRead);
        assert_eq!(LeaseNeed::Open.access(true), Access::Open);
    }

    /// The facts that used to be decided beside the table: which bodies are raw, which
    /// requests are audited as changes, which endpoint the admin token opens.
    #[test]
    fn body_kind_audit_class_and_authority_are_the_rows_own() {
        let read_by_handler: Vec<(&str, BodyKind)> = endpoints()
            .filter(|e| e.body != BodyKind::Json && e.unserved.is_none())
            .map(|e| (e.label, e.body))
            .collect();
        assert_eq!(
            read_by_handler,
            [
                ("POST api/channels/channel/configure", BodyKind::JsonRaw),
                ("POST api/channels/configure", BodyKind::JsonRaw),
                ("POST api/application/config/upload", BodyKind::Multipart),
            ]
        );
        for endpoint in endpoints() {
            // A configuration file's upload and delete change the files a load applies: they
            // are changes, the lease's.
            if matches!(
                endpoint.label,
                "POST api/application/config/upload" | "DELETE api/application/config/{id}"
            ) {
                assert_eq!(endpoint.lease, LeaseNeed::Change, "{endpoint:?}");
            }
            let was_change = endpoint.lease == LeaseNeed::Change
                || (endpoint.method != Method::GET && endpoint.path.starts_with("lease"));
            assert_eq!(
                endpoint.audit == AuditClass::Change,
                was_change,
                "{endpoint:?}"
            );
            assert_ne!(endpoint.audit, AuditClass::Unaudited, "{endpoint:?}");
            if endpoint.unserved.is_some() {
                assert_eq!(endpoint.body, BodyKind::Raw, "{endpoint:?}");
            }
        }
        let token_opens: Vec<&str> = endpoints()
            .filter(|e| e.authority == Authority::AdminTokenOrCredentials)
            .map(|e| e.label)
            .collect();
        assert_eq!(token_opens, ["DELETE api/lease"]);
        for route in ROUTES {
            match route {
                Route::Operation { .. } => assert_eq!(route.audit(), AuditClass::Unaudited),
                Route::NamedLeases { .. } => {
                    assert_eq!(route.audit(), AuditClass::Request);
                    assert_eq!(route.needed_role(&Method::HEAD), Some(Role::Read));
                    assert_eq!(route.needed_role(&Method::POST), Some(Role::Control));
                }
                Route::Api(endpoint) => {
                    assert_eq!(route.needed_role(&Method::GET), Some(endpoint.role))
                }
                // Beside `api/`: the safe stop, anyone with control, audited as a change; the
                // value history and the access rules' explanation, anyone with read.
                Route::V1(endpoint) => {
                    assert_eq!(route.authority(), Authority::Credentials);
                    match endpoint.label {
                        "POST /v1/safe-stop" => {
                            assert_eq!(route.needed_role(&Method::POST), Some(Role::Control));
                            assert_eq!(route.audit(), AuditClass::Change);
                        }
                        "GET /v1/history" => {
                            assert_eq!(route.needed_role(&Method::GET), Some(Role::Read));
                            assert_eq!(route.audit(), AuditClass::Request);
                        }
                        "POST /v1/access/explain" => {
                            assert_eq!(route.needed_role(&Method::POST), Some(Role::Read));
                            assert_eq!(route.audit(), AuditClass::Request);
                        }
                        other => panic!("an unexpected /v1/ row {other}"),
                    }
                }
            }
        }
        let (_, safe_stop, _) = find_operation("/v1/safe-stop").unwrap();
        assert!(matches!(safe_stop, Route::V1(_)));
        let (_, healthz, _) = find_operation("/healthz").unwrap();
        assert_eq!(healthz.needed_role(&Method::GET), None);
        let (_, metrics, _) = find_operation("/metrics").unwrap();
        assert_eq!(metrics.needed_role(&Method::GET), Some(Role::Read));
    }
}

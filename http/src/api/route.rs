//! The rows of the route table (`api/mod.rs`) and the facts each row carries: who may make the
//! request ([`Authority`] and the role), what the control lease must admit ([`LeaseNeed`]), how
//! its body is read ([`BodyKind`]) and what the audit trail keeps of it ([`AuditClass`]). The
//! request entry (`routes.rs`) reads these facts; it decides none of them by path or label.

use hyper::Method;
use hyper::header::HeaderMap;

use super::call::Handler;
use super::unserved::Unserved;
use crate::body::media_type::MediaType;
use crate::config::Role;
use crate::lease::Access;

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
    /// The access the lease admission is asked for, given whether the request's typed body
    /// asks for cached values ([`RequestBody::cached`](crate::requests::RequestBody::cached)).
    pub fn access(self, cached: bool) -> Access {
        match self {
            LeaseNeed::Open => Access::Open,
            LeaseNeed::ForcedRead => Access::ForcedRead,
            LeaseNeed::Change => Access::Change,
            LeaseNeed::ByMaxAge if cached => Access::CachedRead,
            LeaseNeed::ByMaxAge => Access::ForcedRead,
        }
    }
}

/// How a POST's or PUT's body is read before the handler, and the type it must be sent as
/// (415 otherwise: `body/media_type.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// One JSON object, typed as its handler's request (case-insensitively: `body/typed.rs`);
    /// anything else is a 400.
    Json,
    /// JSON the handler reads itself from `Call::raw` (a channel's configuration, or a list
    /// of them).
    JsonRaw,
    /// A file upload as `multipart/form-data`, read by the handler from `Call::raw`.
    Multipart,
    /// Not judged: an unserved endpoint's file or form. The handler reads `Call::raw`.
    Raw,
}

impl BodyKind {
    /// The type a body must be sent as; `None`: any.
    pub(crate) fn media_type(self) -> Option<MediaType> {
        match self {
            BodyKind::Json | BodyKind::JsonRaw => Some(MediaType::Json),
            BodyKind::Multipart => Some(MediaType::Multipart),
            BodyKind::Raw => None,
        }
    }

    /// Whether its JSON object is parsed before the handler, to be typed as its request.
    pub(crate) fn parsed_before(self) -> bool {
        self == BodyKind::Json
    }
}

/// What the audit trail keeps of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuditClass {
    /// Nothing: operations (`/healthz`, `/metrics`, ...).
    Unaudited,
    /// Its request line.
    Request,
    /// Its request line with the change's fields: caller, lease, outcome, what was asked. The
    /// station's changes, and the lease's own (acquire, renew, release, break).
    Change,
}

impl AuditClass {
    /// The class an endpoint has unless its row says otherwise: a change of the station is
    /// audited as a change.
    pub(crate) const fn of(lease: LeaseNeed) -> AuditClass {
        match lease {
            LeaseNeed::Change => AuditClass::Change,
            LeaseNeed::Open | LeaseNeed::ForcedRead | LeaseNeed::ByMaxAge => AuditClass::Request,
        }
    }
}

/// What a change's audit line says was asked beyond what its typed body tells
/// ([`RequestBody::asked`](crate::requests::RequestBody::asked)): from the `{id}` of its path or its raw body (a configuration file's
/// name). `None`: nothing more.
pub(crate) type AskedOf = fn(AskedFrom<'_>) -> Option<String>;

/// What an [`AskedOf`] reads of a request.
pub(crate) struct AskedFrom<'a> {
    pub(crate) id: &'a str,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) raw: &'a [u8],
}

/// The [`AskedOf`] of every endpoint whose row names none: its typed body tells it all.
pub(crate) fn asked_in_body(_: AskedFrom<'_>) -> Option<String> {
    None
}

/// What grants an endpoint's role while access control is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Authority {
    /// An API key or a user with the role.
    Credentials,
    /// The lease's admin token is its own authority (whatever key or user comes with it: a
    /// client with default headers), else credentials with the role. The admin break.
    AdminTokenOrCredentials,
}

/// One REST endpoint below `api/`.
pub(crate) struct Endpoint {
    pub(crate) method: Method,
    /// The path below `api/`; a `{id}` segment matches any one non-empty segment.
    pub(crate) path: &'static str,
    /// The role needed while access control is on.
    pub(crate) role: Role,
    pub(crate) authority: Authority,
    pub(crate) lease: LeaseNeed,
    pub(crate) body: BodyKind,
    pub(crate) audit: AuditClass,
    /// What its audit line says was asked beyond its JSON body (a change's).
    pub(crate) asked: AskedOf,
    /// The label of its requests in metrics.
    pub(crate) label: &'static str,
    pub(crate) handler: Handler,
    /// Why it is not served (404 or 501 saying so), for a documented WebApi endpoint this gateway does not serve.
    pub(crate) unserved: Option<Unserved>,
}

impl Endpoint {
    /// Whether a standby serves it: only the event stream and its subscriptions (a stream
    /// opened on a standby hears the `connection` event when it takes the station over; its
    /// reads fail as with any link that is down). Everything else is the owner's.
    pub(crate) fn served_on_standby(&self) -> bool {
        self.path == "events" || self.path.starts_with("subscriptions")
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label)
    }
}

/// The endpoints beside `api/`, answered by `http/ops.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// The process is alive.
    Healthz,
    /// The station link is up.
    Readyz,
    Metrics,
    StatusPage,
    StatusJson,
}

/// One row of the route table. Its position (after the `unmatched` slot) is its metrics slot.
#[derive(Debug)]
pub(crate) enum Route {
    /// An operations endpoint at `paths` below `http.path_prefix`, any method (`ops.rs` answers
    /// 405 to all but GET and HEAD); never audited.
    Operation {
        label: &'static str,
        paths: &'static [&'static str],
        operation: Operation,
        /// The role needed while access control is on; `None`: open to anyone (health checks).
        role: Option<Role>,
    },
    /// Named leases and semaphores for lab scripts, `v1/leases/...` and `v1/semaphores/...`
    /// (`named_leases.rs`): GET and HEAD with the read role, the rest with control; audited
    /// as requests.
    NamedLeases { label: &'static str },
    /// A REST endpoint below `api/`.
    Api(Endpoint),
    /// An endpoint beside `api/` at its own path below `http.path_prefix` (`/v1/safe-stop`),
    /// read, authorized, admitted and audited like a REST one; other methods are 405.
    V1(Endpoint),
}

impl Route {
    /// The label of its requests in metrics.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Route::Operation { label, .. } | Route::NamedLeases { label } => label,
            Route::Api(endpoint) | Route::V1(endpoint) => endpoint.label,
        }
    }

    /// The role a request with `method` needs while access control is on; `None`: open.
    pub(crate) fn needed_role(&self, method: &Method) -> Option<Role> {
        match self {
            Route::Operation { role, .. } => *role,
            Route::NamedLeases { .. } => Some(match *method {
                Method::GET | Method::HEAD => Role::Read,
                _ => Role::Control,
            }),
            Route::Api(endpoint) | Route::V1(endpoint) => Some(endpoint.role),
        }
    }

    pub(crate) fn authority(&self) -> Authority {
        match self {
            Route::Api(endpoint) | Route::V1(endpoint) => endpoint.authority,
            Route::Operation { .. } | Route::NamedLeases { .. } => Authority::Credentials,
        }
    }

    /// Whether a request of this row with `method` can change something: the station (a
    /// change, or a read of the hardware, which may consume what it reads), the lease (acquire,
    /// renew, release, break), a safe stop, a configuration file (an upload, a save, a
    /// delete: the control role), a named lease. A web page of another site may not send one
    /// (`browser.rs`); a GET, the operations and the reads that touch nothing it may.
    pub(crate) fn can_change(&self, method: &Method) -> bool {
        if matches!(*method, Method::GET | Method::HEAD) {
            return false;
        }
        match self {
            Route::Operation { .. } => false,
            Route::NamedLeases { .. } => true,
            Route::Api(endpoint) | Route::V1(endpoint) => {
                endpoint.audit == AuditClass::Change
                    || endpoint.lease != LeaseNeed::Open
                    || endpoint.role >= Role::Control
            }
        }
    }

    pub(crate) fn audit(&self) -> AuditClass {
        match self {
            Route::Operation { .. } => AuditClass::Unaudited,
            Route::NamedLeases { .. } => AuditClass::Request,
            Route::Api(endpoint) | Route::V1(endpoint) => endpoint.audit,
        }
    }

    /// Its endpoint, for a REST row.
    pub(crate) fn endpoint(&self) -> Option<&Endpoint> {
        match self {
            Route::Api(endpoint) => Some(endpoint),
            Route::Operation { .. } | Route::NamedLeases { .. } | Route::V1(_) => None,
        }
    }
}

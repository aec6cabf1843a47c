//! The request entry: every HTTP request comes in here, is matched against the route table
//! (`api/mod.rs`: the operations `/healthz`, `/metrics`, ..., named leases, the REST
//! endpoints), passes the browser's check (a change from a page of another site is refused:
//! `browser.rs`), access control, its body's reading and the lease admission in one place as
//! its row says, and goes to its endpoint's handler. The body is typed once, as the row's
//! handler takes it, right after it is read; what the typed body asks (`asked=`, a cached read)
//! comes back to the admission here ([`Admit`]).

use std::time::Instant;

use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Response, Version};

use super::allow::Allowed;
use super::api::{self, Admit, AskedFrom, AuditClass, Authority, Call, Endpoint, NotRouted, Route};
use super::audit_trail::{self, Noted};
use super::body::{JsonBody, media_type, read_body};
use super::browser::{self, RequestSite};
use super::lease_endpoints::{LEASE_FENCE_HEADER, presented_lease_id, set_fence_header};
use super::ops;
use super::reply::{Body, error_response};
use super::requests::RequestBody;
use crate::audit::Outcome;
use crate::config::Role;
use crate::error::ApiError;
use crate::gateway::Gateway;
use tracing::info;

pub use crate::server::Peers;

/// What `handle` learnt of a request before routing it, each looked up once.
#[derive(Clone, Copy)]
struct RequestFacts<'a> {
    peers: Peers,
    /// Its `X-Lease-Id` ([`presented_lease_id`]).
    presented: Option<&'a str>,
    /// Its path as logged, lease ids hidden.
    audit_path: &'a str,
    started: Instant,
    /// Where its browser says it comes from.
    site: RequestSite,
}

/// Answers one request; never fails: every error becomes a JSON error answer.
///
/// The request comes as its head and its body: the head lives in this future for the whole
/// request, and everything after borrows from it (the presented lease id, the logged path,
/// the handler's headers) rather than copying it (a request's future is moved and boxed
/// whole, so every byte of it costs).
///
/// An async block rather than an `async fn`: an `async fn`'s future keeps its arguments twice,
/// as passed and as moved into its body (224 bytes of head more to move and box).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its head twice in its state"
)]
pub fn handle(
    gateway: &Gateway,
    head: Parts,
    body: Incoming,
    peers: Peers,
    site: RequestSite,
) -> impl Future<Output = Response<Body>> + Send + '_ {
    async move {
        let peer = peers.remote;
        // The API's own description, public like the contract it describes.
        let prefix = &gateway.config.http.path_prefix;
        if let Some(doc) = super::openapi::answer(prefix, &head.method, head.uri.path())
            && browser::malformed_host(&head).is_none()
        {
            return doc;
        }
        let started = Instant::now();
        let (method, log_access) = (&head.method, ops::access_log_enabled());
        let presented = presented_lease_id(&head.headers);
        // Lease ids hidden: the audit trail is readable by admins, a lease id is its holder's. The
        // access line shows the same path: redacted once for both. The path as the client sent
        // it (a lab's `/stations/{id}/...` with its station's segment).
        let sent_path = head.extensions.get::<super::stations::SentPath>();
        let audit_path =
            super::redact::loggable_path(sent_path.map_or(head.uri.path(), |sent| &sent.0));
        let mut noted = Noted::default();
        let mut response = match route_and_answer(
            gateway,
            &head,
            body,
            RequestFacts {
                peers,
                presented,
                audit_path: &audit_path,
                started,
                site,
            },
            &mut noted,
        )
        .await
        {
            Ok(response) => response,
            Err(error) => error_response(&error),
        };
        let slot = noted.slot.unwrap_or(api::UNMATCHED_SLOT);
        // The holder's responses carry the fence its requests are admitted under.
        if let Some(fence) = gateway.lease.fence_of(presented)
            && !response.headers().contains_key(LEASE_FENCE_HEADER)
        {
            set_fence_header(&mut response, fence);
        }
        if let Some(timed_out) = super::body::timed_out() {
            gateway.log_span.in_scope(|| {
                info!(
                    %peer,
                    method = %method,
                    path = %audit_path,
                    "HTTP: answered 408 and closing the connection: {}",
                    timed_out.message()
                )
            });
        }
        ops::finish(
            gateway,
            slot,
            method,
            log_access.then_some(&*audit_path),
            peer,
            started,
            &mut response,
        );
        // A change's line is on disk before its answer leaves (a change to the station wrote its
        // own, from its own task).
        let outcome = match super::reply::error_kind(&response) {
            Some(kind) => Outcome::of_error(kind),
            None if response.status().is_success() => Outcome::Applied,
            None => Outcome::Refused,
        };
        let change = audit_trail::write_line(
            gateway,
            noted,
            method,
            &audit_path,
            peer,
            started,
            response.status(),
            outcome,
        );
        if let Some(change) = change {
            change.record(gateway).await;
        }
        response
    }
}

/// Routes the request and answers it (an async block, as [`handle`]).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice in its state"
)]
fn route_and_answer<'a>(
    gateway: &'a Gateway,
    parts: &'a Parts,
    body: Incoming,
    facts: RequestFacts<'a>,
    noted: &'a mut Noted,
) -> impl Future<Output = Result<Response<Body>, ApiError>> + Send + 'a {
    async move {
        // `facts` is read where used: copies of its fields would be kept beside it.
        let path = parts.uri.path();
        let prefix = gateway.config.http.path_prefix.trim_end_matches('/');
        let below_prefix = path.strip_prefix(prefix);
        let below_api = below_prefix
            .and_then(|rest| rest.strip_prefix("/api/"))
            .map(|rest| rest.trim_end_matches('/'));
        // Every api/ request is in the audit trail, a 404 or 405 too.
        noted.audited = below_api.is_some();
        if let Some(refusal) = browser::malformed_host(parts) {
            return Err(refusal);
        }
        // Health, readiness, metrics and the status page live beside api/, and so do named leases
        // and semaphores for lab scripts (`v1/leases`, `v1/semaphores`).
        let (position, route, id) = match (below_prefix.and_then(api::find_operation), below_api) {
            (Some(found), _) => found,
            _ if super::named_leases::is_named_lease_path(gateway, path) => api::named_leases(),
            (None, Some(below_api)) => match api::find(&parts.method, below_api) {
                Ok(found) => found,
                Err(NotRouted::WrongMethod) => {
                    return Err(ApiError::method_not_allowed(
                        format!("{} is not allowed on {path}", parts.method),
                        api::allowed(below_api),
                    ));
                }
                Err(NotRouted::NoSuchPath) => {
                    return Err(ApiError::not_found(format!(
                        "no such endpoint: {} {path}",
                        parts.method
                    )));
                }
            },
            (None, None) => {
                return Err(ApiError::not_found(format!(
                    "no such endpoint: {} {path}",
                    parts.method
                )));
            }
        };
        noted.slot = Some(api::slot(position));
        noted.audited |= route.audit() != AuditClass::Unaudited;
        noted.change = route.audit() == AuditClass::Change;
        // A page of another site changes nothing: refused before access control (a browser
        // sends cached Basic credentials with it) and before the body is read.
        if facts.site == RequestSite::Elsewhere && route.can_change(&parts.method) {
            if noted.change {
                noted.caller = gateway.access.caller(&parts.headers);
            }
            return Err(browser::cross_site_refusal(parts, gateway.tls.is_some()));
        }
        let needed = route.needed_role(&parts.method);
        // The one place access control is checked: before the body is read and before the lease
        // admission. 401 without valid credentials, 403 for a role too low.
        let granted = match route.authority() {
            // The admin token is its own authority for the break, whatever key comes with it.
            Authority::AdminTokenOrCredentials
                if super::lease_endpoints::admin_token_presented(gateway, &parts.headers) =>
            {
                Some(Role::Admin)
            }
            _ => {
                if noted.change {
                    noted.caller = gateway.access.caller(&parts.headers);
                }
                gateway.access.authorize(&parts.headers, needed)?
            }
        };
        if noted.change && noted.caller.is_none() && granted.is_some() {
            // The admin token's break: its own authority.
            noted.caller = Some("admin token".into());
        }
        let endpoint = match route {
            Route::Operation { operation, .. } => {
                let viewer = crate::access_rules::Who {
                    name: gateway.access.caller(&parts.headers),
                    address: Some(facts.peers.remote.ip()),
                    group: None,
                    holds_lease: false,
                };
                return ops::answer(gateway, *operation, &parts.method, &viewer);
            }
            Route::NamedLeases { .. } => {
                // Boxed: inline, its state would make every request's future larger.
                return Ok(Box::pin(super::named_leases::handle(gateway, parts, body)).await);
            }
            Route::Api(endpoint) => endpoint,
            Route::V1(endpoint) if endpoint.method == parts.method => endpoint,
            Route::V1(endpoint) => {
                return Err(ApiError::method_not_allowed(
                    format!("{} is not allowed on {path}", parts.method),
                    Allowed::NONE.with(&endpoint.method),
                ));
            }
        };
        // A standby serves no request of the owner's: 503 naming the owner and its address.
        if let Some(why) = gateway.ha.standing_by()
            && !endpoint.served_on_standby()
        {
            return Err(ApiError::standing_by(why));
        }
        // A change asks first whether this process owns the station's link now (a link standing
        // by on the station's identity does not): 503 naming who serves it.
        if endpoint.lease == api::LeaseNeed::Change {
            gateway.owns_link()?;
        }
        let (json, raw) = if matches!(endpoint.method, Method::POST | Method::PUT) {
            let bytes = read_body(body, gateway.config.http.max_body_bytes).await?;
            if let Some(expected) = endpoint.body.media_type() {
                media_type::check(&parts.headers, expected, &bytes, endpoint.label)?;
            }
            // A body that is not a JSON object (a list, an upload, an unserved endpoint's form) is
            // its handler's to read.
            if endpoint.body.parsed_before() {
                (JsonBody::from_bytes(bytes.clone())?, bytes)
            } else {
                (JsonBody::empty(), bytes)
            }
        } else {
            (JsonBody::empty(), bytes::Bytes::new())
        };
        // Typed once, as the row's handler takes it; what it asks is told back to `Admission`
        // before the handler's future is made. In a block of its own: kept to the end of the
        // request, the admission would be kept in its future.
        let answering = {
            let mut admission = Admission {
                gateway,
                endpoint,
                parts,
                facts,
                noted,
                id,
                raw,
                granted,
            };
            (endpoint.handler)(json, &mut admission)?
        };
        answering.await
    }
}

/// What the request entry needs of a routed request to admit it once its body is typed
/// ([`Admit`]): the lease admission and the change's notes for the audit trail, in one place.
struct Admission<'a, 'n> {
    gateway: &'a Gateway,
    endpoint: &'static Endpoint,
    parts: &'a Parts,
    facts: RequestFacts<'a>,
    noted: &'n mut Noted,
    id: &'a str,
    raw: bytes::Bytes,
    granted: Option<Role>,
}

impl<'a> Admit<'a> for Admission<'a, '_> {
    fn admit(&mut self, body: Option<&dyn RequestBody>) -> Result<Call<'a>, ApiError> {
        let Admission {
            gateway,
            endpoint,
            parts,
            facts,
            ref mut noted,
            id,
            ref mut raw,
            granted,
        } = *self;
        if noted.change {
            noted.asked = body.and_then(|body| body.asked()).or_else(|| {
                (endpoint.asked)(AskedFrom {
                    id,
                    headers: &parts.headers,
                    raw,
                })
            });
        }
        // The one place the control lease is enforced: 423 for a non-holder's changes and forced
        // reads, and for changes a send guard that fences them again at the link. A body that
        // does not type asks for nothing cached.
        let cached = body.is_some_and(|body| body.cached());
        let admitted = gateway
            .lease
            .admit(endpoint.lease.access(cached), facts.presented)?;
        if noted.change {
            noted.admitted(gateway, facts.presented, admitted.fence);
        }
        // A change to the station writes its own line, from its own task: what it needs of the
        // request is its origin.
        let origin = (endpoint.lease == api::LeaseNeed::Change).then(|| {
            Box::new(noted.origin(
                &parts.method,
                facts.audit_path,
                facts.peers.remote,
                facts.started,
            ))
        });
        Ok(Call {
            gateway,
            label: endpoint.label,
            unserved: endpoint.unserved,
            local: facts.peers.local,
            raw: std::mem::take(raw),
            admitted,
            peer: facts.peers.remote,
            // HTTP/2 resets a stream whose client went: its request is dropped, and its
            // connection's socket may be gone first.
            socket: facts
                .peers
                .socket
                .filter(|_| parts.version < Version::HTTP_2),
            id,
            headers: &parts.headers,
            query: parts.uri.query(),
            authority: parts.uri.authority().map(|a| a.as_str()),
            presented: facts.presented,
            granted,
            origin,
        })
    }
}

//! What a handler gets and gives: its [`Call`], its typed request and its [`Answer`]; how a
//! row's handler types its body before the lease admission ([`typed`]); and the checks several
//! areas share.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use hyper::Response;
use hyper::header::HeaderMap;

use serde::de::DeserializeOwned;

use crate::body::JsonBody;
use crate::config::Role;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::lease::Admitted;
use crate::link::ChannelTable;
use crate::reply::{Body, json_response};
use crate::requests::RequestBody;
use crate::station::{Change, ChangeAnswer, ChangeOrigin, ChangeReport, ChangeWhat};

/// Everything a handler may use of its request, admitted by access control and the lease.
pub(crate) struct Call<'a> {
    pub(crate) gateway: &'a Gateway,
    /// The metric label of the endpoint the request was routed to (`GET api/files`).
    pub(crate) label: &'static str,
    /// Why that endpoint is not served (404 or 501 saying so), for an unserved one.
    pub(crate) unserved: Option<super::unserved::Unserved>,
    /// The body's bytes as they came (empty for GET and DELETE); the endpoints whose row says
    /// `BodyKind::JsonRaw`, `Multipart` or `Raw` read their body from here (a JSON body is
    /// handed to the handler typed, beside its `Call`).
    pub(crate) raw: bytes::Bytes,
    /// What the lease admission decided (for changes: the send guard).
    pub(crate) admitted: Admitted,
    pub(crate) peer: SocketAddr,
    /// The connection's socket ([`crate::peer_end`]).
    pub(crate) socket: Option<std::os::fd::RawFd>,
    /// The gateway's address the request came in on.
    pub(crate) local: Option<SocketAddr>,
    /// The `{id}` of the path, empty when the path has none.
    pub(crate) id: &'a str,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) query: Option<&'a str>,
    /// The authority of the request's URI (HTTP/2's `:authority`, where `Host` may be absent).
    pub(crate) authority: Option<&'a str>,
    /// The `X-Lease-Id` the request carried.
    pub(crate) presented: Option<&'a str>,
    /// The role access control granted; `None` while access control is off.
    pub(crate) granted: Option<Role>,
    /// Who asks, for the audit line of a change to the station (endpoints whose lease need is
    /// `Change`). Boxed: only changes have one, and every request's future holds a `Call`.
    pub(crate) origin: Option<Box<ChangeOrigin>>,
}

impl Call<'_> {
    /// [`Call::who`] while access rules are on: the hot read path pays nothing without them.
    pub(crate) fn who_if_rules(&self) -> Option<crate::access_rules::Who> {
        self.gateway
            .station
            .access_rules()
            .enabled()
            .then(|| self.who())
    }
    /// Who asks, for the access rules: the key's or user's name, the address, whether this
    /// request comes from the lease's holder.
    pub(crate) fn who(&self) -> crate::access_rules::Who {
        crate::access_rules::Who {
            name: self.gateway.access.caller(self.headers),
            address: Some(self.peer.ip()),
            group: None,
            holds_lease: self.admitted.fence.is_some(),
        }
    }

    /// Submits `what` as this request's change: run by the station service to its end on a
    /// task of its own, its audit line written there, whatever becomes of this request.
    pub(crate) async fn change(&self, what: ChangeWhat) -> Result<ChangeReport, ApiError> {
        let change = Change {
            what,
            origin: self.change_origin()?,
            admitted: self.admitted.clone(),
        };
        Ok(self.gateway.station.change(change).await?)
    }

    /// The origin of this request's change, made by the request entry for every endpoint
    /// whose lease need is `Change` (`audit_trail::Noted::origin`); any other endpoint asking
    /// for one is a gateway bug, answered as such, never a change without its audit line.
    pub(crate) fn change_origin(&self) -> Result<ChangeOrigin, ApiError> {
        self.origin.as_deref().cloned().ok_or_else(|| {
            ApiError::internal(format!(
                "{} is not a change endpoint, yet asked to change the station (a gateway bug)",
                self.label
            ))
        })
    }
}

/// A handler's answer.
pub(crate) type Answer = Result<Response<Body>, ApiError>;

/// A handler's future, boxed: inline, the largest handler's state would make every request's
/// future larger.
pub(crate) type Answering<'a> = Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

/// A row's handler, made by `handler!` from an `async fn(Call<'_>, SomeRequest) -> Answer` (or
/// one of a `Call` alone, whose body is [`NoBody`](crate::requests::NoBody)): it types the
/// request's body as its request ([`typed`]), has the request entry admit it, and returns the
/// handler's future.
pub(crate) type Handler =
    for<'a> fn(JsonBody, &mut dyn Admit<'a>) -> Result<Answering<'a>, ApiError>;

/// The request entry's side of a handler (`routes.rs`): the lease admission and the audit
/// trail's notes, told what the typed body asks, then the [`Call`]. Called once a request.
pub(crate) trait Admit<'a> {
    /// Admits the request (423 when the lease refuses it), given its typed body (`None`: a body
    /// that does not type, refused after the admission as it always was) and makes its `Call`.
    fn admit(&mut self, body: Option<&dyn RequestBody>) -> Result<Call<'a>, ApiError>;
}

/// The body typed once as `T` (the one place a handler's request is typed), the request
/// admitted with what the typed body asks, then the handler's `Call` and request. A body that
/// does not type is refused (400 naming the field) after the admission, as when each handler
/// typed its own body: a non-holder's change with a bad body is still a 423.
pub(crate) fn typed<'a, T: RequestBody + DeserializeOwned>(
    body: JsonBody,
    admit: &mut dyn Admit<'a>,
) -> Result<(Call<'a>, T), ApiError> {
    let typed = body.typed::<T>();
    drop(body);
    let call = admit.admit(typed.as_ref().ok().map(|typed| typed as &dyn RequestBody))?;
    Ok((call, typed?))
}

/// The station's answer to a change, of the kind `pick` expects; the link's failure as its
/// error answer.
pub(crate) fn answered<T>(
    report: ChangeReport,
    pick: fn(ChangeAnswer) -> Option<T>,
) -> Result<T, ApiError> {
    pick(report.answer?).ok_or_else(|| {
        ApiError::internal(
            "the station service answered another kind of change than was asked (a gateway bug)",
        )
    })
}

/// `200` with a JSON document.
pub(crate) fn ok(value: serde_json::Value) -> Answer {
    Ok(json_response(&value))
}

/// The channel list, or 503 when the station has never been reached.
pub(crate) fn known_channels(gateway: &Gateway) -> Result<Arc<ChannelTable>, ApiError> {
    Ok(reached_now(gateway)?.channels.clone())
}

/// [`known_channels`]' station info, to look at without keeping it: the read path's way, which
/// writes nothing the other worker threads share.
pub(crate) fn reached_now(
    gateway: &Gateway,
) -> Result<arc_swap::Guard<Arc<crate::link::StationInfo>>, ApiError> {
    gateway
        .station
        .reached_now()
        .map_err(|not_reached| ApiError::station_not_reached(not_reached.to_string()))
}

/// 503 for what only a station that said hello can tell.
pub(crate) fn not_yet_connected() -> ApiError {
    ApiError::station_not_reached(
        "station disconnected: the gateway has not reached the station yet",
    )
}

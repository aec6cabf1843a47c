//! `api/lease...`: the control lease's endpoints, hooked into the table; their bodies live in
//! `http/lease.rs`.

use serde_json::json;

use super::call::{Answer, Call, ok};
use crate::config::Role;
use crate::lease_endpoints as handlers;
use crate::requests::lease::{LeaseAcquireRequest, LeaseRenewRequest};

/// `GET api/lease`: who holds it.
pub(super) async fn status(call: Call<'_>) -> Answer {
    ok(handlers::status(call.gateway))
}

/// `POST api/lease[?waitMs=N]`: take (or re-take) it.
pub(super) async fn acquire(call: Call<'_>, request: LeaseAcquireRequest) -> Answer {
    // The access rules' `lease` right, decided by the station service like every other.
    call.gateway
        .station
        .may_take_lease(&call.who())
        .map_err(|refusal| {
            crate::error::ApiError::from(crate::link::LinkError::Refused(
                crate::link::GuardRefusal::from(refusal),
            ))
        })?;
    let client_ended = crate::peer_end::ended(call.socket);
    handlers::acquire(
        call.gateway,
        request,
        call.query,
        call.presented,
        client_ended,
    )
    .await
}

/// `PUT api/lease/{id}`: renew it.
pub(super) async fn renew(call: Call<'_>, request: LeaseRenewRequest) -> Answer {
    handlers::renew(call.gateway, call.id, request).await
}

/// `DELETE api/lease/{id}`: release it.
pub(super) async fn release(call: Call<'_>) -> Answer {
    // A lease's end is the link owner's to carry out: asked first.
    call.gateway.owns_link()?;
    ok(handlers::release(call.gateway, call.id).await?)
}

/// `DELETE api/lease`: the admin break. An admin's credentials are the authority to break the
/// lease; without them, the bearer admin token.
pub(super) async fn break_lease(call: Call<'_>) -> Answer {
    call.gateway.owns_link()?;
    if call.granted == Some(Role::Admin) {
        return ok(json!({ "broken": call.gateway.lease.break_lease(call.peer).await? }));
    }
    ok(handlers::break_lease(call.gateway, call.headers, call.peer).await?)
}

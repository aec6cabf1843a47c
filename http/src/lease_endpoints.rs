//! The control lease's endpoints (contract, "The control lease"): `GET lease`, `POST lease`,
//! `PUT lease/{id}`, `DELETE lease/{id}`, and the admin break `DELETE lease`.
//!
//! Admission of every other request is in `routes.rs`; the lease itself in `crate::lease`.

use std::net::SocketAddr;
use std::time::Duration;

use hyper::Response;
use hyper::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value as Json, json};
use subtle::ConstantTimeEq;
use tracing::warn;

use super::reply::{Body, json_response};
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::lease::{DEFAULT_TTL, LeaseError, MAX_WAIT};
use crate::requests::lease::{LeaseAcquireRequest, LeaseRenewRequest};

/// The header a holder sends with every request.
pub const LEASE_ID_HEADER: HeaderName = HeaderName::from_static("x-lease-id");
/// The header on the holder's responses: the fence its requests are admitted under.
pub const LEASE_FENCE_HEADER: HeaderName = HeaderName::from_static("x-lease-fence");

/// The `X-Lease-Id` a request carries.
///
/// A header that is present but blank or not text is still a lease id, one that is never the
/// live lease: a change carrying it is refused as "lease ended", not let through as if it
/// carried none.
pub fn presented_lease_id(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(LEASE_ID_HEADER)?;
    match value.to_str().map(str::trim) {
        Ok(id) if !id.is_empty() => Some(id),
        _ => Some(NOT_A_LEASE_ID),
    }
}

/// What a blank or non-text `X-Lease-Id` counts as: no lease id ever looks like it.
const NOT_A_LEASE_ID: &str = "(not a lease id)";

/// Puts `X-Lease-Fence: fence` on a response.
pub fn set_fence_header(response: &mut Response<Body>, fence: u64) {
    response
        .headers_mut()
        .insert(LEASE_FENCE_HEADER, HeaderValue::from(fence));
}

/// `GET lease`: who holds it; never the id.
pub fn status(gateway: &Gateway) -> Json {
    json!(gateway.lease.view())
}

/// `POST lease[?waitMs=N]` with `{Owner, TtlMs?}`; a wait in line ends when `client_ended`
/// does (the client closed its side: nothing is taken for it).
pub async fn acquire(
    gateway: &Gateway,
    request: LeaseAcquireRequest,
    query: Option<&str>,
    presented: Option<&str>,
    client_ended: impl Future<Output = ()>,
) -> Result<Response<Body>, ApiError> {
    let (owner, ttl) = request.owner_and_ttl()?;
    let ttl = ttl.unwrap_or(DEFAULT_TTL);
    let wait = wait(query)?;
    // A lease is for changing the station: a station whose link stands by because another
    // gateway (or another station of this one) serves it, and which has never read its ledger,
    // grants none now, and says who serves it; one asked to wait waits in line (it is served
    // once this gateway serves the station and knows what it is owed).
    if wait.is_zero() && gateway.lease.station_served().is_none() {
        gateway.owns_link()?;
    }
    let answer = gateway
        .lease
        .acquire_unless(owner, ttl, presented, wait, client_ended)
        .await?;
    let mut response = json_response(&json!(answer));
    set_fence_header(&mut response, answer.fence);
    Ok(response)
}

/// `PUT lease/{id}` with `{TtlMs?}`.
pub async fn renew(
    gateway: &Gateway,
    id: &str,
    request: LeaseRenewRequest,
) -> Result<Response<Body>, ApiError> {
    let answer = gateway.lease.renew(id, request.ttl()?).await?;
    let mut response = json_response(&json!(answer));
    set_fence_header(&mut response, answer.fence);
    Ok(response)
}

/// `DELETE lease/{id}`.
pub async fn release(gateway: &Gateway, id: &str) -> Result<Json, ApiError> {
    gateway.lease.release(id).await?;
    Ok(json!({}))
}

/// Whether the request carries `Authorization: Bearer <lease.admin_token>` (compared in
/// constant time); never while the admin break is off.
///
/// The token is its own authority for the admin break, whatever API key or user comes with
/// it: `routes.rs` asks this before access control, so a control key sent alongside (a client
/// with default headers) does not turn the break into a 403.
pub fn admin_token_presented(gateway: &Gateway, headers: &HeaderMap) -> bool {
    let expected = gateway.config.lease.admin_token.as_bytes();
    if expected.is_empty() {
        return false;
    }
    let presented = headers
        .get_all(AUTHORIZATION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .filter_map(|value| value.trim().strip_prefix("Bearer "))
        .map(str::trim);
    let mut found = false;
    for token in presented {
        found |= bool::from(token.as_bytes().ct_eq(expected));
    }
    found
}

/// `DELETE lease` with `Authorization: Bearer <lease.admin_token>`: ends whoever holds it.
pub async fn break_lease(
    gateway: &Gateway,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Json, ApiError> {
    if gateway.config.lease.admin_token.is_empty() {
        return Err(LeaseError::AdminBreakOff.into());
    }
    if !admin_token_presented(gateway, headers) {
        warn!(%peer, "refused an admin break of the control lease from {peer}: missing or wrong token");
        return Err(LeaseError::AdminTokenWrong.into());
    }
    let broken = gateway.lease.break_lease(peer).await?;
    Ok(json!({ "broken": broken }))
}

/// `waitMs` from the query (any letter case); none is no wait.
fn wait(query: Option<&str>) -> Result<Duration, LeaseError> {
    let Some(query) = query else {
        return Ok(Duration::ZERO);
    };
    let Some(text) = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.eq_ignore_ascii_case("waitMs"))
        .map(|(_, value)| value)
    else {
        return Ok(Duration::ZERO);
    };
    let wait = text
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| LeaseError::BadWait(text.to_owned()))?;
    if wait > MAX_WAIT {
        return Err(LeaseError::BadWait(text.to_owned()));
    }
    Ok(wait)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_blank_or_non_text_lease_id_is_presented_and_never_a_lease() {
        let mut headers = HeaderMap::new();
        assert_eq!(presented_lease_id(&headers), None);
        headers.insert(LEASE_ID_HEADER, HeaderValue::from_static("  abc  "));
        assert_eq!(presented_lease_id(&headers), Some("abc"));
        headers.insert(LEASE_ID_HEADER, HeaderValue::from_static("   "));
        assert_eq!(presented_lease_id(&headers), Some(NOT_A_LEASE_ID));
        headers.insert(
            LEASE_ID_HEADER,
            HeaderValue::from_bytes(&[0xFF, 0xFE]).unwrap(),
        );
        assert_eq!(presented_lease_id(&headers), Some(NOT_A_LEASE_ID));
    }

    use super::*;
    use crate::body::JsonBody;
    use crate::lease::MIN_TTL;

    /// `TtlMs`, when given, in range.
    fn ttl(body: &JsonBody) -> Result<Option<Duration>, ApiError> {
        body.typed::<LeaseRenewRequest>()?.ttl()
    }

    #[test]
    fn wait_comes_from_the_query_in_range() {
        assert_eq!(wait(None).unwrap(), Duration::ZERO);
        assert_eq!(
            wait(Some("x=1&WAITMS=250")).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(wait(Some("waitMs=60000")).unwrap(), MAX_WAIT);
        assert!(
            wait(Some("waitMs=60001"))
                .unwrap_err()
                .to_string()
                .contains("waitMs")
        );
        assert!(wait(Some("waitMs=-1")).is_err());
    }

    #[test]
    fn ttl_must_be_one_second_to_ten_minutes() {
        let body = |text: &str| JsonBody::parse(text.as_bytes()).unwrap();
        assert_eq!(ttl(&body("{}")).unwrap(), None);
        assert_eq!(ttl(&body(r#"{"ttlMs": 1000}"#)).unwrap(), Some(MIN_TTL));
        for bad in ["999", "600001", "0"] {
            let error = ttl(&body(&format!(r#"{{"TtlMs": {bad}}}"#))).unwrap_err();
            assert_eq!(error.kind, crate::error::ErrorKind::BadRequest);
            assert!(error.message.contains("TtlMs"), "{}", error.message);
        }
    }
}

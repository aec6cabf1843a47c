//! The OpenAPI 3 document of the whole API (`docs/openapi.json`), served at `/openapi.json`.

use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Response};

use super::allow::Allowed;
use super::reply::{Body, error_response};
use crate::error::ApiError;

/// The document, compiled in so the gateway always serves the one that matches its code.
pub const OPENAPI_JSON: &str = include_str!("../../docs/openapi.json");

/// The answer for `GET {prefix}/openapi.json` (405 naming GET and HEAD for another method);
/// `None` for any other path.
pub fn answer(prefix: &str, method: &Method, path: &str) -> Option<Response<Body>> {
    let rest = path.strip_prefix(prefix.trim_end_matches('/'))?;
    if rest != "/openapi.json" {
        return None;
    }
    if method != Method::GET && method != Method::HEAD {
        return Some(error_response(&ApiError::method_not_allowed(
            format!("{method} is not allowed on {path}; use GET"),
            Allowed::GET_AND_HEAD,
        )));
    }
    let mut response = Response::new(Body::whole(Bytes::from_static(OPENAPI_JSON.as_bytes())));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_is_openapi_3_json_and_lists_the_contract() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI_JSON).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        for path in [
            "/api/resources/value/set",
            "/api/lease/{leaseId}",
            "/api/events",
        ] {
            assert!(doc["paths"][path].is_object(), "{path} missing");
        }
    }

    #[test]
    fn only_the_exact_path_is_answered_and_only_get_served() {
        assert!(answer("", &Method::GET, "/openapi.json").is_some());
        assert!(answer("/p/", &Method::GET, "/p/openapi.json").is_some());
        assert!(answer("", &Method::GET, "/api/openapi.json").is_none());
        let refused = answer("", &Method::POST, "/openapi.json").unwrap();
        assert_eq!(refused.status(), 405);
        assert_eq!(refused.headers()["allow"], "GET, HEAD");
    }
}

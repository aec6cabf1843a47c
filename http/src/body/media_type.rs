//! JSON endpoints take JSON: a request body must be of the type its endpoint reads, as its
//! `Content-Type` says (parameters such as `charset` allowed, any case), else 415 naming the
//! type to send. A browser page of another site can send `text/plain`, a form or a multipart
//! upload without asking first; the reference clients send `application/json` (and the upload
//! as `multipart/form-data`), so only they get through. A request without a body needs no
//! type.

use hyper::header::{CONTENT_TYPE, HeaderMap};

use crate::error::{ApiError, ErrorKind};

/// The type of body an endpoint reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaType {
    /// `application/json`.
    Json,
    /// `multipart/form-data` (a file upload).
    Multipart,
}

impl MediaType {
    pub fn essence(self) -> &'static str {
        match self {
            MediaType::Json => "application/json",
            MediaType::Multipart => "multipart/form-data",
        }
    }
}

/// `Ok` when `body` is empty or its `Content-Type` is `expected`; else the 415 naming the type
/// to send (`what`: the endpoint, as its answer names it).
pub fn check(
    headers: &HeaderMap,
    expected: MediaType,
    body: &[u8],
    what: &str,
) -> Result<(), ApiError> {
    if body.is_empty() {
        return Ok(());
    }
    let sent = headers.get(CONTENT_TYPE).map(|value| value.as_bytes());
    if sent.is_some_and(|sent| is(sent, expected)) {
        return Ok(());
    }
    let said = match sent {
        Some(sent) => format!("this one says {}", String::from_utf8_lossy(sent)),
        None => "this one has no Content-Type".to_owned(),
    };
    let how = match expected {
        MediaType::Json => {
            "; with curl: --json '{...}', or -H 'Content-Type: application/json' -d '{...}'"
        }
        MediaType::Multipart => " with one file part (curl: -F 'file=@NAME.cfg')",
    };
    Err(ApiError::new(
        ErrorKind::UnsupportedMediaType,
        format!(
            "{what} takes its body as Content-Type: {} ({said}){how}",
            expected.essence()
        ),
    ))
}

/// Whether a `Content-Type` value is `expected`: its type and subtype before any parameter,
/// in any case, white space around them ignored.
fn is(content_type: &[u8], expected: MediaType) -> bool {
    let essence = match content_type.iter().position(|&b| b == b';') {
        Some(at) => &content_type[..at],
        None => content_type,
    };
    essence
        .trim_ascii()
        .eq_ignore_ascii_case(expected.essence().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn with(content_type: Option<&'static str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn json_is_taken_with_parameters_in_any_case_and_nothing_else_with_a_body() {
        for taken in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            " application/json ;charset=\"UTF-8\"",
        ] {
            assert!(
                check(&with(Some(taken)), MediaType::Json, b"{}", "x").is_ok(),
                "{taken}"
            );
        }
        for refused in [
            Some("text/plain"),
            Some("text/plain;charset=UTF-8"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonp"),
            Some("application/json-seq"),
            None,
        ] {
            let error =
                check(&with(refused), MediaType::Json, b"{}", "POST api/lease").unwrap_err();
            assert_eq!(error.status(), 415, "{refused:?}");
            assert!(
                error.message.contains("POST api/lease"),
                "{}",
                error.message
            );
            assert!(
                error.message.contains("application/json"),
                "{}",
                error.message
            );
        }
        // Nothing to judge without a body.
        assert!(check(&with(Some("text/plain")), MediaType::Json, b"", "x").is_ok());
        assert!(check(&with(None), MediaType::Json, b"", "x").is_ok());
    }

    #[test]
    fn an_upload_is_multipart_as_the_clients_send_it() {
        // Python: `boundary=HEX`; .NET: the boundary quoted.
        for taken in [
            "multipart/form-data; boundary=0f3a",
            "multipart/form-data; boundary=\"5c1e\"",
        ] {
            assert!(check(&with(Some(taken)), MediaType::Multipart, b"--", "x").is_ok());
        }
        let error = check(
            &with(Some("application/json")),
            MediaType::Multipart,
            b"{}",
            "x",
        )
        .unwrap_err();
        assert!(
            error.message.contains("multipart/form-data"),
            "{}",
            error.message
        );
        assert!(
            error.message.contains("says application/json"),
            "{}",
            error.message
        );
    }
}

//! Request bodies: read with a size limit, parsed as JSON, and fields bound by name
//! case-insensitively (`Name` and `name` alike), with errors that name the field.

use http_body_util::{BodyExt, Limited};
use hyper::StatusCode;
use hyper::body::{Body as _, Incoming};
use serde_json::{Map, Value as Json};

use crate::error::ApiError;

/// Reads the whole body, refusing one over `limit` bytes with 413.
pub async fn read_body(body: Incoming, limit: usize) -> Result<bytes::Bytes, ApiError> {
    // A declared Content-Length over the limit is refused at once, not after waiting for
    // bytes that may never come.
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large(limit)),
        Err(error) => Err(ApiError::bad_request(format!(
            "the request body could not be read: {error}"
        ))),
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is over the {limit}-byte limit"),
    )
}

/// A JSON object body with case-insensitive field access.
#[derive(Debug)]
pub struct JsonBody(Map<String, Json>);

impl JsonBody {
    /// Parses `bytes` as a JSON object; an empty body is an empty object.
    pub fn parse(bytes: &[u8]) -> Result<JsonBody, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonBody(Map::new()));
        }
        match serde_json::from_slice::<Json>(bytes) {
            Ok(Json::Object(map)) => Ok(JsonBody(map)),
            Ok(_) => Err(ApiError::bad_request(
                "the request body must be a JSON object",
            )),
            Err(error) => Err(ApiError::bad_request(format!(
                "the request body is not valid JSON: {error}"
            ))),
        }
    }

    /// The field called `name`, in any letter case.
    pub fn get(&self, name: &str) -> Option<&Json> {
        self.0
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
            .filter(|v| !v.is_null())
    }

    pub fn required(&self, name: &str) -> Result<&Json, ApiError> {
        self.get(name)
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} is missing")))
    }

    pub fn string(&self, name: &str) -> Result<&str, ApiError> {
        self.required(name)?
            .as_str()
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} must be a string")))
    }

    /// A value in the station's text format; numbers and booleans are taken as their text.
    pub fn value_text(&self, name: &str) -> Result<String, ApiError> {
        value_text(self.required(name)?, name)
    }

    pub fn optional_u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(value) => value
                .as_u64()
                .or_else(|| {
                    value
                        .as_f64()
                        .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 9e15)
                        .map(|f| f as u64)
                })
                .map(Some)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "the field {name} must be a whole number of 0 or more"
                    ))
                }),
        }
    }

    pub fn string_list(&self, name: &str) -> Result<Vec<String>, ApiError> {
        let wrong =
            || ApiError::bad_request(format!("the field {name} must be an array of strings"));
        self.required(name)?
            .as_array()
            .ok_or_else(wrong)?
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or_else(wrong))
            .collect()
    }

    pub fn object(&self, name: &str) -> Result<&Map<String, Json>, ApiError> {
        self.required(name)?
            .as_object()
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} must be an object")))
    }
}

/// A JSON value as station value text: strings as they are, numbers and booleans as text.
pub fn value_text(value: &Json, field: &str) -> Result<String, ApiError> {
    match value {
        Json::String(text) => Ok(text.clone()),
        Json::Number(number) => Ok(number.to_string()),
        Json::Bool(true) => Ok("True".into()),
        Json::Bool(false) => Ok("False".into()),
        _ => Err(ApiError::bad_request(format!(
            "the field {field} must be a string such as \"5\" or \"True\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_bind_in_any_case() {
        let body = JsonBody::parse(br#"{"name": "A", "MAXAGEMS": 5}"#).unwrap();
        assert_eq!(body.string("Name").unwrap(), "A");
        assert_eq!(body.optional_u64("MaxAgeMs").unwrap(), Some(5));
    }

    #[test]
    fn errors_name_the_field() {
        let body = JsonBody::parse(br#"{"Names": "A", "MaxAgeMs": -1}"#).unwrap();
        assert!(
            body.string_list("Names")
                .unwrap_err()
                .message
                .contains("Names")
        );
        assert!(
            body.optional_u64("MaxAgeMs")
                .unwrap_err()
                .message
                .contains("MaxAgeMs")
        );
        assert!(
            body.string("Value")
                .unwrap_err()
                .message
                .contains("Value is missing")
        );
        assert!(JsonBody::parse(b"[1]").is_err());
        assert!(
            JsonBody::parse(b"{")
                .unwrap_err()
                .message
                .contains("not valid JSON")
        );
    }
}

//! `POST /v1/safe-stop {Reason}`: why the station is being safe-stopped, never blank.

use serde::Deserialize;

use crate::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SafeStopRequest {
    pub reason: String,
}

impl SafeStopRequest {
    /// The reason, trimmed.
    pub fn reason(self) -> Result<String, ApiError> {
        let reason = self.reason.trim();
        if reason.is_empty() {
            return Err(ApiError::bad_request(
                "the field Reason must not be blank: say why the station is being safe-stopped",
            ));
        }
        Ok(reason.to_owned())
    }
}

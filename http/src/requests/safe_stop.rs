//! `POST /v1/safe-stop {Reason}`: why the station is being safe-stopped, never blank, printable.

use serde::Deserialize;

use super::RequestBody;
use crate::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SafeStopRequest {
    pub reason: String,
}

impl RequestBody for SafeStopRequest {}

impl SafeStopRequest {
    /// The reason, trimmed; never blank, and printable text (it is echoed back in the answer,
    /// the lease's end and the audit trail).
    pub fn reason(self) -> Result<String, ApiError> {
        let reason = self.reason.trim();
        if reason.is_empty() {
            return Err(ApiError::bad_request(
                "the field Reason must not be blank: say why the station is being safe-stopped",
            ));
        }
        super::refuse_control_characters("Reason", reason)?;
        Ok(reason.to_owned())
    }
}

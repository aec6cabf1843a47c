//! `POST api/application/config/load` and `.../save {FileName}`: the station configuration
//! file to apply or to write (its name checked by the configuration files' store).

use serde::Deserialize;

use super::{RequestBody, asked_text};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ConfigFileRequest {
    pub file_name: String,
}

impl RequestBody for ConfigFileRequest {
    /// `file=bench3.cfg`.
    fn asked(&self) -> Option<String> {
        asked_text(&[format!("file={}", self.file_name)])
    }
}

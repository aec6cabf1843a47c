//! `POST api/application/config/load` and `.../save {FileName}`: the station configuration
//! file to apply or to write (its name checked by the configuration files' store).

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ConfigFileRequest {
    pub file_name: String,
}

//! `POST api/channels/channel`: the clients' `ChannelLookupRequest {NetName?, Alias?}`, read
//! after the channel list is known (a station never reached is 503 before the body is judged).

use serde::Deserialize;

use super::RequestBody;
use crate::body::Deferred;
use crate::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ChannelLookupRequest {
    pub net_name: Deferred<Option<String>>,
    pub alias: Deferred<Option<String>>,
}

impl RequestBody for ChannelLookupRequest {}

impl ChannelLookupRequest {
    /// The net name and the alias asked for, at least one of them.
    pub fn asked(self) -> Result<(Option<String>, Option<String>), ApiError> {
        let net_name = self.net_name.checked()?;
        let alias = self.alias.checked()?;
        if net_name.is_none() && alias.is_none() {
            return Err(ApiError::bad_request("give the field NetName or Alias"));
        }
        Ok((net_name, alias))
    }
}

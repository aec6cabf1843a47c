//! `POST /v1/access/explain {Action, Key? or User?, Address?, Value?, Channel?,
//! HoldsLease?}`: what the access rules would decide. Each field is read in the order the
//! explanation checks it (who may ask comes between the identity and the rest).

use serde::Deserialize;

use super::{Flag, RequestBody};
use crate::body::Deferred;
use crate::error::ApiError;
use crate::rules::Action;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AccessExplainRequest {
    pub action: String,
    pub key: Deferred<Option<String>>,
    pub user: Deferred<Option<String>>,
    pub address: Deferred<Option<String>>,
    pub value: Deferred<Option<String>>,
    pub channel: Deferred<Option<String>>,
    /// Anything but `true` or `false` counts as absent.
    pub holds_lease: Deferred<Option<Flag>>,
}

impl RequestBody for AccessExplainRequest {}

impl AccessExplainRequest {
    /// The action, by its word in the rules.
    pub fn action(&self) -> Result<Action, ApiError> {
        Action::from_word(&self.action).ok_or_else(|| {
            let known: Vec<&str> = Action::ALL.iter().map(|a| a.word()).collect();
            ApiError::bad_request(format!(
                "the field Action: \"{}\" is not an action; the actions: {}",
                self.action,
                known.join(", ")
            ))
        })
    }

    /// The channel asked about: required unless the action is station-wide (then `""`).
    pub fn channel(channel: Deferred<Option<String>>, action: Action) -> Result<String, ApiError> {
        match channel.checked()? {
            Some(channel) => Ok(channel),
            None if action.station_wide() => Ok(String::new()),
            None => Err(ApiError::bad_request("the field Channel is missing")),
        }
    }

    /// Whether the caller is taken to hold the lease: yes unless the body says no.
    pub fn holds_lease(holds_lease: Deferred<Option<Flag>>) -> bool {
        holds_lease
            .checked()
            .ok()
            .flatten()
            .is_none_or(|Flag(holds)| holds)
    }
}

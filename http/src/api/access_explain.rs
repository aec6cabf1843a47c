//! `POST /v1/access/explain {"Key" or "User", "Address", "Channel", "Action"}`: what the access
//! rules in force decide for that caller, address, channel and action, and the rule that
//! decided (with the interlocks an allowed change still needs), what of the rules matches no
//! channel of the station, and which rules name only stations this gateway does not serve. Explaining another identity than one's own takes the admin role.

use std::net::IpAddr;

use hyper::header::{HeaderMap, HeaderValue};
use serde_json::{Value as Json, json};
use station_protocol::Value;

use super::call::{Answer, Call, known_channels, ok};
use crate::body::Deferred;
use crate::config::Role;
use crate::credentials::API_KEY_HEADER;
use crate::error::ApiError;
use crate::requests::access::AccessExplainRequest;
use crate::rules::Reason;

/// Who the body names: the key's name (never the key), or the user.
fn named(
    call: &Call<'_>,
    key: Deferred<Option<String>>,
    user: Deferred<Option<String>>,
) -> Result<Option<String>, ApiError> {
    match (key.checked()?.as_deref(), user.checked()?) {
        (Some(_), Some(_)) => Err(ApiError::bad_request("give Key or User, not both")),
        (Some(key), None) => {
            let mut headers = HeaderMap::new();
            let value = HeaderValue::from_str(key)
                .map_err(|_| ApiError::bad_request("the field Key is not a valid API key"))?;
            headers.insert(API_KEY_HEADER, value);
            call.gateway
                .access
                .caller(&headers)
                .map(Some)
                .ok_or_else(|| ApiError::bad_request("the field Key names no configured API key"))
        }
        (None, Some(user)) => {
            crate::requests::refuse_control_characters("User", &user)?;
            Ok(Some(user.to_owned()))
        }
        (None, None) => Ok(call.gateway.access.caller(call.headers)),
    }
}

/// `POST /v1/access/explain`.
pub(super) async fn explain(call: Call<'_>, asked: AccessExplainRequest) -> Answer {
    let action = asked.action()?;
    let name = named(&call, asked.key, asked.user)?;
    let own = call.gateway.access.caller(call.headers);
    if call.gateway.access.enabled() && name != own && call.granted < Some(Role::Admin) {
        return Err(ApiError::forbidden(
            "explaining another key's or user's rights takes the admin role; leave Key and User out to explain your own",
        ));
    }
    let address: IpAddr = match asked.address.checked()?.as_deref() {
        None => call.peer.ip(),
        Some(text) => text.trim().parse().map_err(|_| {
            ApiError::bad_request(format!(
                "the field Address: \"{text}\" is not an IP address"
            ))
        })?,
    };
    let written = asked.value.checked()?.map(Value::String);
    let channel_asked = AccessExplainRequest::channel(asked.channel, action)?;
    let Some(rules) = call.gateway.station.access_rules().current() else {
        return ok(json!({
            "allowed": true,
            "rule": Json::Null,
            "rulesVersion": 0,
            "message": "no access rules file is configured ([access] rules): the key's or user's role alone decides",
        }));
    };
    let table = known_channels(call.gateway)?;
    // A channel by its full name, or by its alias.
    let channel = table
        .get(&channel_asked)
        .or_else(|| {
            table
                .channels
                .iter()
                .find(|c| !c.alias.is_empty() && c.alias == channel_asked)
        })
        .map(|c| c.name.clone())
        .unwrap_or(channel_asked);
    let facts = crate::station::channel_facts(&table, &channel);
    let unmatched: Vec<String> = crate::access_rules::unmatched(&rules, &table)
        .iter()
        .map(ToString::to_string)
        .collect();
    let who = crate::access_rules::Who {
        name,
        address: Some(address),
        group: None,
        holds_lease: AccessExplainRequest::holds_lease(asked.holds_lease),
    };
    let principal = rules.principal(&who.subject());
    let decision = rules.decide(&principal, &facts, action, written.as_ref());
    let reason = match &decision.reason {
        Reason::Allowed => "allowed",
        Reason::Denied => "denied",
        Reason::Default { .. } => "default",
        Reason::LeaseNeeded => "lease needed",
    };
    let interlocks: Vec<Json> = decision
        .interlocks
        .iter()
        .map(|i| json!({"rule": &*i.rule, "channel": &*i.channel, "value": &*i.value}))
        .collect();
    ok(json!({
        "allowed": decision.allowed,
        "rule": &*decision.rule,
        "reason": reason,
        "channel": channel,
        "action": action.word(),
        "user": who.name,
        "address": address.to_string(),
        "interlocks": interlocks,
        "rulesVersion": rules.version(),
        "message": decision.refusal(action, &channel),
        // What of the rules matches no channel of this station (a mistyped serial or glob):
        // a rule naming it does nothing here.
        "unmatched": unmatched,
        // Rules whose `stations` name no station this gateway serves: in force nowhere here.
        "rulesForOtherStations": call.gateway.station.access_rules().unserved_said(),
    }))
}

//! The audit trail's HTTP side: what the request entry notes of a request while routing it
//! (is it a change, who is the caller, which lease admitted it, what it asked), and the line
//! written once it is answered — for a change, on disk before the answer leaves.

use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use hyper::{Method, StatusCode};
use tracing::error;

use super::body::{JsonBody, value_text};
use crate::audit::{ChangeFields, Outcome, RequestLine};
use crate::gateway::Gateway;
use crate::station::{ChangeOrigin, FrontEnd};

/// The longest `asked=` field; longer ones end in `...`.
const MOST_ASKED_CHARS: usize = 400;

/// What routing learned of a request for its audit line.
#[derive(Debug, Default)]
pub struct Noted {
    /// The request's metric slot, once routed.
    pub slot: Option<usize>,
    /// The origin handed to the handler of a change to the station: once a change took it,
    /// the change writes the line. Boxed: only changes have one.
    pub origin: Option<Box<ChangeOrigin>>,
    /// Under `api/`, or a named lease (the operations endpoints, `/healthz`, `/metrics`, the
    /// status page, are not audited).
    pub audited: bool,
    /// It changes (or tries to change) the station or the control lease.
    pub change: bool,
    pub caller: Option<String>,
    pub lease: Option<(String, u64)>,
    pub asked: Option<String>,
}

impl Noted {
    /// The lease the request was admitted under, named by owner and fence (never its id).
    pub fn admitted(&mut self, gateway: &Gateway, presented: Option<&str>, fence: Option<u64>) {
        if let Some(fence) = fence {
            self.lease = gateway
                .lease
                .holder_of(presented)
                .filter(|(_, f)| *f == fence)
                .or_else(|| Some(("?".into(), fence)));
        }
    }
}

impl Noted {
    /// The origin of a change to the station this request may submit; kept here too, so that
    /// the request writes no line of its own once the change took it.
    pub fn origin(
        &mut self,
        method: &Method,
        path: &str,
        peer: SocketAddr,
        started: Instant,
    ) -> ChangeOrigin {
        let front = FrontEnd::Http {
            method: method.as_str().to_owned(),
            path: path.to_owned(),
        };
        let mut origin = ChangeOrigin::new(front, peer, started);
        origin.caller = self.caller.clone();
        origin.lease = self.lease.clone();
        origin.asked = self.asked.clone();
        self.origin = Some(Box::new(origin.clone()));
        origin
    }
}

/// The fields of the bus and numeric bodies a change's `asked=` names, and how.
const ASKED_FIELDS: [(&str, &str); 10] = [
    ("DeviceName", "device"),
    ("Action", "action"),
    ("Address", "address"),
    ("DataToSend", "data"),
    ("NumberOfBytesToReceive", "receive"),
    ("Channel", "channel"),
    ("ChannelNetName", "channel"),
    ("Target", "target"),
    ("TargetNetName", "target"),
    ("Samples", "samples"),
];

/// What a change asked for, e.g. `VSET1=100`, `A=1,B=2`, `file=bench3.cfg`,
/// `device=…I2C09,action=Send,address=50,data=6401`, `channel=…,target=…,samples=50`; never a
/// lease id or credential (those never travel in these bodies).
pub fn asked(body: &JsonBody) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    if let (Some(name), Some(value)) = (body.get("Name"), body.get("Value")) {
        let name = name
            .as_str()
            .map_or_else(|| name.to_string(), str::to_owned);
        let value = value_text(value, "Value").unwrap_or_else(|_| value.to_string());
        parts.push(format!("{name}={value}"));
    }
    if let Some(resources) = body.get("Resources").and_then(|r| r.as_object()) {
        for (name, value) in resources {
            let value = value_text(value, name).unwrap_or_else(|_| value.to_string());
            parts.push(format!("{name}={value}"));
        }
    }
    for (field, key) in [("NetName", "netname"), ("Alias", "alias")] {
        if let Some(name) = body.get(field).and_then(|n| n.as_str()) {
            parts.push(format!("{key}={name}"));
        }
    }
    if let Some(file) = body.get("FileName").and_then(|f| f.as_str()) {
        parts.push(format!("file={file}"));
    }
    if let Some(owner) = body.get("Owner").and_then(|o| o.as_str()) {
        parts.push(format!("owner={owner}"));
    }
    // A bus transaction (`comm/i2c|uart|spi`) and a numeric acquisition or measurement.
    for (field, key) in ASKED_FIELDS {
        if let Some(value) = body.get(field).filter(|v| !v.is_null()) {
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            parts.push(format!("{key}={value}"));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let mut joined = parts.join(",");
    if joined.chars().count() > MOST_ASKED_CHARS {
        joined = joined.chars().take(MOST_ASKED_CHARS).collect::<String>() + "...";
    }
    Some(joined)
}

/// Writes the request's line: any other's than a change's queued at once; a change's rendered
/// and returned, to be recorded on disk before its answer leaves ([`ChangeLine::record`]);
/// none when a change to the station took the request's origin (it wrote its own line, with
/// its typed outcome). `outcome` is the request's own, from its error's kind.
///
/// Not async itself: only a change waits, and a read's future would otherwise carry what a
/// change's record needs (every byte of a request's future is moved and boxed).
#[allow(clippy::too_many_arguments)]
pub fn write_line(
    gateway: &Gateway,
    noted: Noted,
    method: &Method,
    path: &str,
    peer: SocketAddr,
    started: Instant,
    status: StatusCode,
    outcome: Outcome,
) -> Option<ChangeLine> {
    if !noted.audited
        || noted
            .origin
            .as_deref()
            .is_some_and(ChangeOrigin::line_taken)
    {
        return None;
    }
    let line = RequestLine {
        at: SystemTime::now(),
        ip: Some(peer.ip()),
        method: method.as_str(),
        path,
        status: Some(status.as_u16()),
        duration: Some(started.elapsed()),
    };
    if !noted.change {
        gateway.audit.note_with(|out| line.render_into(out, None));
        return None;
    }
    let fields = ChangeFields {
        caller: noted.caller,
        lease: noted.lease,
        outcome: Some(outcome),
        asked: noted.asked,
        ..ChangeFields::default()
    };
    Some(ChangeLine {
        line: line.render(Some(&fields)),
        what: format!("{method} {path} from {peer}"),
    })
}

/// A change's audit line, rendered, to be recorded before the change's answer leaves.
#[must_use = "a change's line is recorded only when awaited"]
pub struct ChangeLine {
    line: String,
    /// The change as the error says it when its line cannot be written: `METHOD path from peer`.
    what: String,
}

impl ChangeLine {
    /// Records the line on disk (synced).
    pub async fn record(self, gateway: &Gateway) {
        // Boxed: the record's future is large, and only changes wait for it.
        if let Err(why) = Box::pin(gateway.audit.record(self.line)).await {
            // The change happened (or not) as answered; only its record failed: say so loudly.
            gateway.log_span.in_scope(|| {
                error!(
                    "{why}; the change {} is answered without its audit line",
                    self.what
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked_of(body: &str) -> Option<String> {
        asked(&JsonBody::parse(body.as_bytes()).unwrap())
    }

    #[test]
    fn bus_and_numeric_bodies_say_what_was_asked() {
        assert_eq!(
            asked_of(r#"{"DeviceName": "I2C09", "Address": "50", "Action": "Send", "DataToSend": "6401"}"#)
                .as_deref(),
            Some("device=I2C09,action=Send,address=50,data=6401")
        );
        assert_eq!(
            asked_of(r#"{"DeviceName": "UART01", "Action": 2, "NumberOfBytesToReceive": 8}"#)
                .as_deref(),
            Some("device=UART01,action=2,receive=8")
        );
        assert_eq!(
            asked_of(
                r#"{"ChannelNetName": "NR", "TargetNetName": "ADC01", "Samples": 50, "Usl": null}"#
            )
            .as_deref(),
            Some("channel=NR,target=ADC01,samples=50")
        );
        assert_eq!(asked_of("{}"), None);
    }
}

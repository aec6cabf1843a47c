//! The audit trail's HTTP side: what the request entry notes of a request while routing it
//! (is it a change, who is the caller, which lease admitted it, what it asked), and the line
//! written once it is answered — for a change, on disk before the answer leaves.

use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use hyper::{Method, StatusCode};
use tracing::error;

use crate::audit::{ChangeFields, Outcome, RequestLine};
use crate::gateway::Gateway;
use crate::station::{ChangeOrigin, FrontEnd};

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
    /// What a change asked for: from its typed body (`requests::RequestBody::asked`), else
    /// from its path or raw body (its row's `AskedOf`).
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
    use crate::body::JsonBody;
    use crate::requests::RequestBody;
    use crate::requests::comm::BusTransactionRequest;
    use crate::requests::config_files::ConfigFileRequest;
    use crate::requests::lease::LeaseAcquireRequest;
    use crate::requests::numeric::{NumericAcquireRequest, NumericMeasureRequest};
    use crate::requests::resources::{ResourceValueRequest, ResourceValuesSetRequest};

    /// What a change's audit line says was asked, from its body typed as `T`.
    fn asked_of<T: RequestBody + serde::de::DeserializeOwned>(body: &str) -> Option<String> {
        JsonBody::parse(body.as_bytes())
            .unwrap()
            .typed::<T>()
            .unwrap()
            .asked()
    }

    #[test]
    fn bus_and_numeric_bodies_say_what_was_asked_as_sent() {
        assert_eq!(
            asked_of::<BusTransactionRequest>(
                r#"{"DeviceName": "I2C09", "Address": "50", "Action": "Send", "DataToSend": "6401"}"#
            )
            .as_deref(),
            Some("device=I2C09,action=Send,address=50,data=6401")
        );
        assert_eq!(
            asked_of::<BusTransactionRequest>(
                r#"{"DeviceName": "UART01", "Action": 2, "NumberOfBytesToReceive": 8}"#
            )
            .as_deref(),
            Some("device=UART01,action=2,receive=8")
        );
        // As sent, whatever the type makes of it, a value it refuses too.
        assert_eq!(
            asked_of::<BusTransactionRequest>(
                r#"{"deviceName": "I2C09", "Address": 80, "DataToSend": "ab0Z", "Action": null}"#
            )
            .as_deref(),
            Some("device=I2C09,address=80,data=ab0Z")
        );
        assert_eq!(
            asked_of::<NumericMeasureRequest>(
                r#"{"ChannelNetName": "NR", "TargetNetName": "ADC01", "Samples": 50, "Usl": null}"#
            )
            .as_deref(),
            Some("channel=NR,target=ADC01,samples=50")
        );
        assert_eq!(
            asked_of::<NumericAcquireRequest>(
                r#"{"Channel": 5, "Target": "ADC01", "Samples": 50.0}"#
            )
            .as_deref(),
            Some("channel=5,target=ADC01,samples=50.0")
        );
        // A body refused for its fields still says what it asked.
        assert_eq!(
            asked_of::<NumericMeasureRequest>(
                r#"{"ReducedSet": "no", "ChannelNetName": "NR", "Samples": "x"}"#
            )
            .as_deref(),
            Some("channel=NR,samples=x")
        );
        assert_eq!(asked_of::<NumericAcquireRequest>("{}"), None);
        assert_eq!(asked_of::<BusTransactionRequest>("{}"), None);
    }

    #[test]
    fn writes_files_and_leases_say_what_was_asked() {
        assert_eq!(
            asked_of::<ResourceValueRequest>(r#"{"Name": "VSET1", "Value": 100}"#).as_deref(),
            Some("VSET1=100")
        );
        assert_eq!(
            asked_of::<ResourceValueRequest>(r#"{"name": "ON1", "value": true}"#).as_deref(),
            Some("ON1=True")
        );
        // Refused (not a name, not a value): as sent; half of it: nothing.
        assert_eq!(
            asked_of::<ResourceValueRequest>(r#"{"Name": 5, "Value": {"x": 1}}"#).as_deref(),
            Some(r#"5={"x":1}"#)
        );
        assert_eq!(
            asked_of::<ResourceValueRequest>(r#"{"Name": "VSET1"}"#),
            None
        );
        // Sorted by name, each value as the station's text, or as sent when it is not one.
        assert_eq!(
            asked_of::<ResourceValuesSetRequest>(
                r#"{"Resources": {"B": 2.5, "A": "x", "C": false, "D": [1], "E": null}}"#
            )
            .as_deref(),
            Some("A=x,B=2.5,C=False,D=[1],E=null")
        );
        assert_eq!(
            asked_of::<ResourceValuesSetRequest>(r#"{"Resources": {}}"#),
            None
        );
        assert_eq!(
            asked_of::<ConfigFileRequest>(r#"{"FileName": "bench3.cfg"}"#).as_deref(),
            Some("file=bench3.cfg")
        );
        assert_eq!(
            asked_of::<LeaseAcquireRequest>(r#"{"Owner": " bench 3 ", "TtlMs": "x"}"#).as_deref(),
            Some("owner= bench 3 ")
        );
        assert_eq!(asked_of::<LeaseAcquireRequest>(r#"{"Owner": 3}"#), None);
        let long = format!(r#"{{"Name": "VSET1", "Value": "{}"}}"#, "9".repeat(500));
        let asked = asked_of::<ResourceValueRequest>(&long).unwrap();
        assert_eq!(asked.chars().count(), 403);
        assert!(asked.starts_with("VSET1=99") && asked.ends_with("9..."));
    }
}

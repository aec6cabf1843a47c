//! `api/modules...`: the station's modules as the contract describes them.

use std::net::{IpAddr, Ipv6Addr};

use hyper::header::HOST;
use serde_json::{Value as Json, json};

use super::call::{Answer, Call, not_yet_connected, ok};
use crate::netinfo;

/// `GET api/modules` and `GET api/modules/loaded`.
pub(super) async fn list(call: Call<'_>) -> Answer {
    let info = call.gateway.station.info();
    info.hello.as_ref().ok_or_else(not_yet_connected)?;
    ok(Json::Array(
        info.modules
            .iter()
            .map(|m| {
                json!({
                    "name": m.name,
                    "enabled": true,
                    "className": "StationModule",
                    "assemblyPath": "",
                    "namespace": "",
                    "imageName": m.product_id,
                    "initialData": {
                        "index": m.index,
                        "productID": m.product_id,
                        "revision": m.revision,
                        "serialNumber": m.serial,
                    },
                })
            })
            .collect(),
    ))
}

/// `GET api/modules/physical-system`: the station's modules and firmware, under the name and
/// network identity clients reach it by: the host name the request was addressed to (a
/// configured `[http] host_name` overrides) and the gateway's addresses and MAC on the interface
/// that accepted the connection.
pub(super) async fn physical_system(call: Call<'_>) -> Answer {
    let info = call.gateway.station.info();
    let hello = info.hello.as_ref().ok_or_else(not_yet_connected)?;
    let modules: Vec<Json> = info
        .modules
        .iter()
        .map(|m| {
            json!({
                "index": m.index,
                "name": m.name,
                "productID": m.product_id,
                // The .NET client binds a byte (`PhysicalModuleDto.Revision` in
                // `WebApiClient/Models/PhysicalSystemDto.cs`); the station's own number is sent
                // as it is.
                "revision": m.revision,
                "serialNumber": m.serial,
            })
        })
        .collect();
    let configured = &call.gateway.config.http.host_name;
    let host = if configured.is_empty() {
        let host = call.headers.get(HOST).and_then(|h| h.to_str().ok());
        host.or(call.authority)
            .and_then(addressed_host)
            .unwrap_or_default()
    } else {
        configured.clone()
    };
    let interfaces = netinfo::interfaces();
    let accepting = call
        .local
        .and_then(|local| netinfo::interface_of(&interfaces, local.ip()));
    let (ipv4, ipv6, mac) = match accepting {
        Some(interface) => (
            interface.ipv4.first().map(ToString::to_string),
            preferred_ipv6(&interface.ipv6).map(|a| a.to_string()),
            interface.mac.clone(),
        ),
        None => (None, None, String::new()),
    };
    // The local address itself where the OS tables did not name its interface.
    let local_ip = call.local.map(|l| l.ip());
    let ipv4 = ipv4.or_else(|| local_ip.filter(IpAddr::is_ipv4).map(|ip| ip.to_string()));
    let ipv6 = ipv6.or_else(|| local_ip.filter(IpAddr::is_ipv6).map(|ip| ip.to_string()));
    let network_interfaces: serde_json::Map<String, Json> = interfaces
        .values()
        .filter_map(|i| {
            let address = i
                .ipv4
                .first()
                .map(ToString::to_string)
                .or_else(|| preferred_ipv6(&i.ipv6).map(|a| a.to_string()))?;
            Some((i.name.clone(), Json::String(address)))
        })
        .collect();
    ok(json!({
        "host": host,
        "ethIpV4": ipv4.unwrap_or_default(),
        "ethIpV6": ipv6.unwrap_or_default(),
        "firmware": hello.firmware,
        "mac": mac,
        "modules": modules,
        "networkInterfaces": network_interfaces,
    }))
}

/// `GET api/modules/apps` and `GET api/modules/apps/licensed`: a station behind the byte
/// protocol runs no licensed applications, so both lists are empty (never 404, which clients
/// read as "no such station WebApi").
pub(super) async fn apps(_call: Call<'_>) -> Answer {
    ok(Json::Array(Vec::new()))
}

/// The host name a request was addressed to, from its `Host` (or URI authority): without
/// port, brackets or `.local`.
fn addressed_host(host: &str) -> Option<String> {
    let host = host.trim();
    let name = if let Some(bracketed) = host.strip_prefix('[') {
        bracketed.split(']').next()?
    } else {
        host.rsplit_once(':').map_or(host, |(name, _port)| name)
    };
    let name = name.trim_end_matches('.');
    let lower = name.to_ascii_lowercase();
    let name = match lower.strip_suffix(".local") {
        Some(stripped) => &name[..stripped.len()],
        None => name,
    };
    (!name.is_empty()).then(|| name.to_owned())
}

/// A global or unique-local address before a link-local one.
fn preferred_ipv6(addresses: &[Ipv6Addr]) -> Option<&Ipv6Addr> {
    addresses
        .iter()
        .find(|a| !a.is_unicast_link_local())
        .or_else(|| addresses.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_the_name_addressed_without_port_or_local() {
        let host = addressed_host;
        assert_eq!(host("station3.local:5000").as_deref(), Some("station3"));
        assert_eq!(host("Station3.LOCAL").as_deref(), Some("Station3"));
        assert_eq!(
            host("lab-gw.example.com:80").as_deref(),
            Some("lab-gw.example.com")
        );
        assert_eq!(host("127.0.0.1:41234").as_deref(), Some("127.0.0.1"));
        assert_eq!(host("[::1]:5000").as_deref(), Some("::1"));
        assert_eq!(host(":5000"), None);
        assert_eq!(host(""), None);
    }
}

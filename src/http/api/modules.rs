//! `api/modules...`: the station's modules as the contract describes them.

use serde_json::{Value as Json, json};

use super::call::{Answer, Call, not_yet_connected, ok};

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

/// `GET api/modules/physical-system`.
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
                "revision": m.revision,
                "serialNumber": m.serial,
            })
        })
        .collect();
    ok(json!({
        "host": hello.station,
        "ethIpV4": "",
        "ethIpV6": "",
        "firmware": hello.firmware,
        "mac": "",
        "modules": modules,
        "networkInterfaces": {},
    }))
}

//! The gateway host's network identity, read from the OS (Linux `/sys/class/net` and
//! `/proc/net`, no extra dependency): each interface's MAC and addresses, and which interface
//! holds a given local address. `api/modules/physical-system` reports it, as a station reports
//! its own.
//! Read per request; nothing is kept.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One network interface: its name, MAC and addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// `aa:bb:cc:dd:ee:ff`; empty where the OS gives none.
    pub mac: String,
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
}

/// Every interface the OS lists, by name; empty where `/sys` and `/proc` cannot be read.
pub fn interfaces() -> BTreeMap<String, Interface> {
    let mut found: BTreeMap<String, Interface> = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/sys/class/net") {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let mac = std::fs::read_to_string(entry.path().join("address"))
                .map(|text| text.trim().to_owned())
                .unwrap_or_default();
            found.insert(
                name.clone(),
                Interface {
                    name,
                    mac,
                    ..Interface::default()
                },
            );
        }
    }
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    for (name, address) in ipv6_addresses(&read("/proc/net/if_inet6")) {
        found.entry(name.clone()).or_default().ipv6.push(address);
    }
    let routes = ipv4_routes(&read("/proc/net/route"));
    for address in local_ipv4(&read("/proc/net/fib_trie")) {
        if let Some(name) = ipv4_interface(&routes, address) {
            found.entry(name.clone()).or_default().ipv4.push(address);
        }
    }
    for (name, interface) in found.iter_mut() {
        interface.name = name.clone();
        interface.ipv4.sort();
        interface.ipv4.dedup();
    }
    found
}

/// The interface that holds `local` (the address a connection was accepted on).
pub fn interface_of(interfaces: &BTreeMap<String, Interface>, local: IpAddr) -> Option<&Interface> {
    let local = match local {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(local),
        v4 => v4,
    };
    interfaces.values().find(|i| match local {
        IpAddr::V4(v4) => i.ipv4.contains(&v4),
        IpAddr::V6(v6) => i.ipv6.contains(&v6),
    })
}

/// `/proc/net/if_inet6`: `address index prefix scope flags name`, the address as 32 hex digits.
fn ipv6_addresses(text: &str) -> Vec<(String, Ipv6Addr)> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (hex, name) = (fields.first()?, fields.get(5)?);
            let bits = u128::from_str_radix(hex, 16)
                .ok()
                .filter(|_| hex.len() == 32)?;
            Some(((*name).to_owned(), Ipv6Addr::from(bits)))
        })
        .collect()
}

/// A directly connected IPv4 route: the interface, the network and its mask.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    interface: String,
    network: u32,
    mask: u32,
}

/// `/proc/net/route`'s routes without a gateway (the networks an interface is on). The kernel
/// writes each address as the hex of its network-order bytes read as a native `u32`.
fn ipv4_routes(text: &str) -> Vec<Route> {
    let hex = |field: &str| u32::from_str_radix(field, 16).ok().map(u32::from_be);
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (network, gateway, mask) = (
                hex(fields.get(1)?)?,
                hex(fields.get(2)?)?,
                hex(fields.get(7)?)?,
            );
            (gateway == 0 && mask != 0).then(|| Route {
                interface: fields[0].to_owned(),
                network,
                mask,
            })
        })
        .collect()
}

/// `/proc/net/fib_trie`: the addresses marked `/32 host LOCAL` (the host's own).
fn local_ipv4(text: &str) -> Vec<Ipv4Addr> {
    let mut last: Option<Ipv4Addr> = None;
    let mut found = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(address) = trimmed.strip_prefix("|-- ") {
            last = address.trim().parse().ok();
        } else if trimmed.starts_with("/32 host LOCAL")
            && let Some(address) = last
            && !found.contains(&address)
        {
            found.push(address);
        }
    }
    found
}

/// The interface whose network holds `address` (longest prefix); `lo` for 127.0.0.0/8.
fn ipv4_interface(routes: &[Route], address: Ipv4Addr) -> Option<String> {
    if address.is_loopback() {
        return Some("lo".into());
    }
    let bits = u32::from(address);
    routes
        .iter()
        .filter(|r| bits & r.mask == r.network & r.mask)
        .max_by_key(|r| r.mask.count_ones())
        .map(|r| r.interface.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth0\t00000000\t010011AC\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";

    const FIB_TRIE: &str = "Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 172.17.0.0/16 2 0 2
        |-- 172.17.0.0
           /16 link UNICAST
        |-- 172.17.0.5
           /32 host LOCAL
Local:
  +-- 127.0.0.0/8 2 0 2
     |-- 127.0.0.1
        /32 host LOCAL
     |-- 172.17.0.5
        /32 host LOCAL
";

    #[test]
    fn proc_files_give_each_address_its_interface() {
        let routes = ipv4_routes(ROUTE);
        assert_eq!(
            routes,
            vec![Route {
                interface: "eth0".into(),
                network: u32::from(Ipv4Addr::new(172, 17, 0, 0)),
                mask: 0xffff_0000,
            }]
        );
        let local = local_ipv4(FIB_TRIE);
        assert_eq!(local, [Ipv4Addr::new(172, 17, 0, 5), Ipv4Addr::LOCALHOST]);
        assert_eq!(ipv4_interface(&routes, local[0]).as_deref(), Some("eth0"));
        assert_eq!(ipv4_interface(&routes, local[1]).as_deref(), Some("lo"));
        assert_eq!(ipv4_interface(&routes, Ipv4Addr::new(10, 0, 0, 1)), None);
        let v6 = ipv6_addresses("00000000000000000000000000000001 01 80 10 80       lo\n");
        assert_eq!(v6, [("lo".to_owned(), Ipv6Addr::LOCALHOST)]);
    }

    #[test]
    fn the_accepting_interface_is_found_by_its_address() {
        let mut all = BTreeMap::new();
        all.insert(
            "lo".to_owned(),
            Interface {
                name: "lo".into(),
                mac: "00:00:00:00:00:00".into(),
                ipv4: vec![Ipv4Addr::LOCALHOST],
                ipv6: vec![Ipv6Addr::LOCALHOST],
            },
        );
        for local in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            let found = interface_of(&all, local.parse().unwrap()).map(|i| i.name.as_str());
            assert_eq!(found, Some("lo"), "{local}");
        }
        assert!(interface_of(&all, "10.1.1.1".parse().unwrap()).is_none());
    }
}

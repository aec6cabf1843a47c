//! Numbers and IPv4 addresses as log text without `core::fmt`: every access and audit line
//! writes a peer address, a status and a duration, and `Display` for `Ipv4Addr` and
//! `SocketAddr` (padding support, a buffer of its own) was a twelfth of a cached read's
//! instructions. Same text as `Display`, tested side by side.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// ASCII text of a few bytes on the stack.
pub struct ShortText<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> ShortText<N> {
    fn new() -> ShortText<N> {
        ShortText {
            bytes: [0; N],
            len: 0,
        }
    }

    fn push(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    /// `octet` in decimal, without a formatter's buffer (an address has four of them).
    fn push_octet(&mut self, octet: u8) {
        if octet >= 100 {
            self.push(b'0' + octet / 100);
        }
        if octet >= 10 {
            self.push(b'0' + octet / 10 % 10);
        }
        self.push(b'0' + octet % 10);
    }

    fn push_u64(&mut self, n: u64) {
        for &digit in itoa::Buffer::new().format(n).as_bytes() {
            self.push(digit);
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII digits, dots and colons are ever pushed.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

/// `n` in decimal, as `Display` writes it.
pub fn u64_text(n: u64) -> ShortText<20> {
    let mut text = ShortText::new();
    text.push_u64(n);
    text
}

/// `a.b.c.d`, as `Display` writes it.
pub fn ipv4_text(ip: Ipv4Addr) -> ShortText<21> {
    let mut text = ShortText::new();
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text.push(b'.');
        }
        text.push_octet(octet);
    }
    text
}

thread_local! {
    /// The IPv4 address this thread wrote last, and its text: a client's requests come one
    /// after another from one address, and every one has an access line and an audit line.
    static LAST_IPV4: RefCell<(Ipv4Addr, String)> =
        RefCell::new((Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED.to_string()));
}

/// Calls `with` on `ip` as `Display` writes it, rendered only when it is not the address this
/// thread wrote last.
fn with_ipv4_text<R>(ip: Ipv4Addr, with: impl FnOnce(&str) -> R) -> R {
    LAST_IPV4.with_borrow_mut(|(last, text)| {
        if *last != ip {
            text.clear();
            text.push_str(ipv4_text(ip).as_str());
            *last = ip;
        }
        with(text)
    })
}

/// Appends `ip` as `Display` writes it.
pub fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => with_ipv4_text(v4, |text| out.push_str(text)),
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// Appends `addr` as `Display` writes it (`a.b.c.d:port`, `[v6]:port`).
pub fn push_socket_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(v4) => {
            with_ipv4_text(*v4.ip(), |text| out.extend_from_slice(text.as_bytes()));
            out.push(b':');
            out.extend_from_slice(itoa::Buffer::new().format(v4.port()).as_bytes());
        }
        SocketAddr::V6(_) => {
            use std::io::Write as _;
            let _ = write!(out, "{addr}");
        }
    }
}

/// Appends `value` as `{:?}` writes it, quickly when it is a whole number of thousandths
/// below 10⁹ (a duration in milliseconds rounded to the microsecond, as the access line has
/// it: `12.0`, `0.084`, `1.5`); any other value through `{:?}` itself.
pub fn push_thousandths(out: &mut Vec<u8>, value: f64) {
    let thousandths = (value * 1000.0).round();
    let exact = value.is_sign_positive()
        && (0.0..1e12).contains(&thousandths)
        && thousandths / 1000.0 == value;
    if !exact {
        let _ = std::io::Write::write_fmt(out, format_args!("{value:?}"));
        return;
    }
    let thousandths = thousandths as u64;
    out.extend_from_slice(itoa::Buffer::new().format(thousandths / 1000).as_bytes());
    out.push(b'.');
    let fraction = thousandths % 1000;
    let digits = [
        b'0' + (fraction / 100) as u8,
        b'0' + (fraction / 10 % 10) as u8,
        b'0' + (fraction % 10) as u8,
    ];
    // `{:?}` writes the shortest digits that read back as the same number: no trailing zeros,
    // but at least one digit after the point.
    let kept = match fraction {
        0 => 1,
        _ if fraction.is_multiple_of(100) => 1,
        _ if fraction.is_multiple_of(10) => 2,
        _ => 3,
    };
    out.extend_from_slice(&digits[..kept]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousandths_read_as_debug_writes_them() {
        let mut checked = 0;
        let mut check = |value: f64| {
            let mut out = Vec::new();
            push_thousandths(&mut out, value);
            assert_eq!(String::from_utf8(out).unwrap(), format!("{value:?}"));
            checked += 1;
        };
        for micros in (0..2_000_000u64).chain((0..1_000).map(|i| 999_999_000_000 + i * 997)) {
            check(micros as f64 / 1000.0);
        }
        // Not whole thousandths, negative, huge or not finite: `{:?}` itself.
        for value in [
            0.0005,
            1.0 / 3.0,
            -0.0,
            -1.5,
            1e12,
            1e16,
            2.5e-7,
            f64::NAN,
            f64::INFINITY,
        ] {
            check(value);
        }
        assert_eq!(checked, 2_001_009);
    }

    #[test]
    fn numbers_read_as_display_writes_them() {
        for n in [0, 7, 10, 99, 100, 200, 404, 65_535, 1_000_000, u64::MAX] {
            assert_eq!(u64_text(n).as_str(), n.to_string());
        }
    }

    #[test]
    fn addresses_read_as_display_writes_them() {
        let addrs = [
            "0.0.0.0:0",
            "127.0.0.1:40404",
            "255.255.255.255:65535",
            "10.20.3.4:8",
            "[::1]:8",
            "[fe80::1%2]:443",
            "[2001:db8::ff00:42:8329]:80",
        ];
        for text in addrs {
            let addr: SocketAddr = text.parse().unwrap();
            let mut out = Vec::new();
            push_socket_addr(&mut out, addr);
            assert_eq!(String::from_utf8(out).unwrap(), addr.to_string());
            let mut ip = String::new();
            push_ip(&mut ip, addr.ip());
            assert_eq!(ip, addr.ip().to_string());
        }
    }

    #[test]
    fn the_last_address_kept_is_replaced_by_the_next_one() {
        // Each address twice in a row (the kept text), then another (its replacement).
        for text in [
            "10.0.0.1",
            "10.0.0.1",
            "10.0.0.2",
            "192.168.100.200",
            "10.0.0.1",
            "0.0.0.0",
        ] {
            for _ in 0..2 {
                let ip: IpAddr = text.parse().unwrap();
                let mut out = String::new();
                push_ip(&mut out, ip);
                assert_eq!(out, text);
                let mut with_port = Vec::new();
                push_socket_addr(&mut with_port, SocketAddr::new(ip, 5000));
                assert_eq!(with_port, format!("{text}:5000").into_bytes());
            }
        }
    }

    #[test]
    fn every_octet_reads_as_display_writes_it() {
        for n in 0..=255u8 {
            let ip = Ipv4Addr::new(n, 255 - n, n / 2, 9);
            assert_eq!(ipv4_text(ip).as_str(), ip.to_string());
        }
    }
}

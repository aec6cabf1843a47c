//! Web origins and host names as a browser sends them (`Origin: scheme://host[:port]`, `Host:
//! host[:port]`), read without allocating: `http.allowed_origins` and `http.allowed_hosts` are
//! checked with them when the config is read, and the HTTP front end compares every request's
//! `Origin` and `Host` with them (`station-http`'s `browser.rs`).

/// An origin: a scheme (`http` or `https`), a host (a name, an IPv4 address, or an IPv6
/// address in brackets) and a port (the scheme's own when none is written).
#[derive(Debug, Clone, Copy)]
pub struct WebOrigin<'a> {
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: u16,
}

impl<'a> WebOrigin<'a> {
    /// `scheme://host[:port]`, exactly what a browser sends in `Origin` (no path, no user, no
    /// trailing slash); `Err` says what is wrong with it.
    pub fn parse(text: &'a str) -> Result<WebOrigin<'a>, &'static str> {
        let (scheme, rest) = text.split_once("://").ok_or(
            "is not an origin: write it as scheme://host[:port], e.g. http://dashboard.lab:8080",
        )?;
        let default_port = default_port(scheme)
            .ok_or("has a scheme other than http or https: write http://... or https://...")?;
        if rest.contains(['/', '?', '#', '@']) {
            return Err(
                "has a path, a query or a user: an origin is scheme://host[:port] and nothing after it",
            );
        }
        let (host, port) = split_host_port(rest).ok_or("has no valid host and port")?;
        Ok(WebOrigin {
            scheme,
            host,
            port: port.unwrap_or(default_port),
        })
    }

    /// Whether `other` is the same origin: scheme and host alike in any case (a host's one
    /// trailing dot ignored), the ports equal.
    pub fn same_as(&self, other: &WebOrigin<'_>) -> bool {
        self.scheme.eq_ignore_ascii_case(other.scheme)
            && self.port == other.port
            && same_host(self.host, other.host)
    }

    /// Whether this is the origin of a page the client got from `authority` (its `Host` or
    /// `:authority`) over `scheme`.
    pub fn is_of(&self, scheme: &str, authority: &str) -> bool {
        let Some((host, port)) = split_host_port(authority) else {
            return false;
        };
        let Some(default_port) = default_port(scheme) else {
            return false;
        };
        self.scheme.eq_ignore_ascii_case(scheme)
            && self.port == port.unwrap_or(default_port)
            && same_host(self.host, host)
    }
}

/// The port of `http` and `https` when none is written.
pub fn default_port(scheme: &str) -> Option<u16> {
    if scheme.eq_ignore_ascii_case("http") {
        Some(80)
    } else if scheme.eq_ignore_ascii_case("https") {
        Some(443)
    } else {
        None
    }
}

/// `host[:port]` (a `Host` header, an `:authority`, an origin's rest): the host as written (an
/// IPv6 address with its brackets) and the port if one is written; `None` when it is not of
/// that shape (empty, a port that is not a number, brackets that do not close).
pub fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if authority.starts_with('[') {
        let close = authority.find(']')?;
        let (host, rest) = authority.split_at(close + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(':') && !host.starts_with('[') {
        return None;
    }
    let port = match port {
        None => None,
        Some(port) => Some(port.parse::<u16>().ok()?),
    };
    Some((host, port))
}

/// Whether two hosts are one: alike in any case, a trailing dot (a fully qualified name)
/// ignored.
pub fn same_host(a: &str, b: &str) -> bool {
    trim_dot(a).eq_ignore_ascii_case(trim_dot(b))
}

/// `host` without the one trailing dot of a fully qualified name.
fn trim_dot(host: &str) -> &str {
    host.strip_suffix('.').unwrap_or(host)
}

/// Whether `host` (as [`split_host_port`] gives it) is an IP address: an IPv4 address, or an
/// IPv6 one in brackets. A name re-pointed at the gateway (DNS rebinding) is never one.
pub fn is_ip_literal(host: &str) -> bool {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host.parse::<std::net::Ipv4Addr>().is_ok(),
    }
}

/// Whether `text` is a host name `http.allowed_hosts` may list: letters, digits, `-` and `.`,
/// optionally after `*.` (every name below a domain); `Err` says why not.
pub fn check_host_pattern(text: &str) -> Result<(), &'static str> {
    let name = text.strip_prefix("*.").unwrap_or(text);
    if name.is_empty() {
        return Err("is empty");
    }
    if name.contains(':') {
        return Err(
            "has a port or is an IPv6 address: list names without a port (any port is served, and any IP address is accepted without being listed)",
        );
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err(
            "is not a host name: letters, digits, - and . only, or *.domain for every name below it",
        );
    }
    Ok(())
}

/// Whether `host` is `pattern` (a name, or `*.domain`: any name below the domain, not the
/// domain itself), in any case, a trailing dot ignored.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let host = trim_dot(host);
    match pattern.strip_prefix("*.") {
        None => same_host(pattern, host),
        Some(domain) => {
            host.len() > domain.len() + 1
                && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
                && host[host.len() - domain.len()..].eq_ignore_ascii_case(domain)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_with_their_schemes_default_port_and_compare_in_any_case() {
        let origin = WebOrigin::parse("http://Dashboard.Lab:8080").unwrap();
        assert_eq!(
            (origin.scheme, origin.host, origin.port),
            ("http", "Dashboard.Lab", 8080)
        );
        assert_eq!(WebOrigin::parse("https://gw").unwrap().port, 443);
        assert_eq!(WebOrigin::parse("http://[::1]:5000").unwrap().host, "[::1]");
        assert!(origin.same_as(&WebOrigin::parse("HTTP://dashboard.lab.:8080").unwrap()));
        assert!(!origin.same_as(&WebOrigin::parse("https://dashboard.lab:8080").unwrap()));
        assert!(!origin.same_as(&WebOrigin::parse("http://dashboard.lab").unwrap()));
        for bad in [
            "dashboard.lab",
            "ftp://x",
            "http://x/",
            "http://x/path",
            "http://user@x",
            "http://",
            "http://x:port",
            "http://x:99999",
            "http://[::1",
            "http://::1",
            "null",
            "*",
        ] {
            assert!(WebOrigin::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_origin_is_of_the_authority_its_page_came_from() {
        let own = WebOrigin::parse("http://127.0.0.1:5000").unwrap();
        assert!(own.is_of("http", "127.0.0.1:5000"));
        assert!(!own.is_of("https", "127.0.0.1:5000"));
        assert!(!own.is_of("http", "127.0.0.1:5001"));
        assert!(!own.is_of("http", "127.0.0.1"));
        let default = WebOrigin::parse("http://localhost").unwrap();
        assert!(default.is_of("http", "LOCALHOST:80"));
        assert!(default.is_of("http", "localhost"));
        assert!(!default.is_of("http", "localhost:8080"));
        assert!(!default.is_of("http", "localhost:x"));
    }

    #[test]
    fn hosts_split_from_ports_and_ip_literals_are_told_from_names() {
        assert_eq!(split_host_port("gw:5000"), Some(("gw", Some(5000))));
        assert_eq!(split_host_port("gw"), Some(("gw", None)));
        assert_eq!(split_host_port("[::1]:80"), Some(("[::1]", Some(80))));
        assert_eq!(split_host_port("[::1]"), Some(("[::1]", None)));
        for bad in ["", ":80", "gw:", "gw:x", "[::1", "[::1]x", "::1", "a:b:c"] {
            assert_eq!(split_host_port(bad), None, "{bad}");
        }
        for ip in ["127.0.0.1", "10.1.2.3", "[::1]", "[fe80::1]"] {
            assert!(is_ip_literal(ip), "{ip}");
        }
        for name in ["localhost", "127.0.0.1.nip.io", "[gw]", "1.2.3", "0x7f.1"] {
            assert!(!is_ip_literal(name), "{name}");
        }
    }

    #[test]
    fn host_patterns_match_names_and_the_names_below_a_domain() {
        assert!(host_matches("gw.lab", "GW.LAB"));
        assert!(host_matches("gw.lab", "gw.lab."));
        assert!(!host_matches("gw.lab", "evil.gw.lab"));
        assert!(host_matches("*.lab", "gw.lab"));
        assert!(host_matches("*.lab", "a.b.LAB"));
        assert!(!host_matches("*.lab", "lab"));
        assert!(!host_matches("*.lab", "evillab"));
        assert!(check_host_pattern("gw.lab").is_ok());
        assert!(check_host_pattern("*.lab").is_ok());
        for bad in ["", "*.", "gw:5000", "::1", "gw/x", "g w"] {
            assert!(check_host_pattern(bad).is_err(), "{bad}");
        }
    }
}

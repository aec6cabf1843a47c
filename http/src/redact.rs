//! What of a request path may be logged: everything after a `lease` or `leases` segment (in
//! any letter case, percent-encoded or not) is hidden, on every path, known route or not, and
//! the query string is never logged. A lease id is its holder's secret.

use std::borrow::Cow;

/// What replaces the segments after a `lease`/`leases` segment.
pub const HIDDEN: &str = "{id}";

/// `path` as the access log may show it: the segments after the first `lease` or `leases`
/// segment replaced by one `{id}`; a path without one as it is. Give the path only (a query
/// string, if passed, is cut off too).
pub fn loggable_path(path: &str) -> Cow<'_, str> {
    // One pass: where the path ends, and whether it may hold a lease id. Most paths (every
    // read, every change but the lease's own) hold neither a `%` nor "lease" in any letter
    // case, and are logged as they are.
    let bytes = path.as_bytes();
    let (mut end, mut plain) = (bytes.len(), true);
    for (at, &byte) in bytes.iter().enumerate() {
        match byte {
            b'?' | b'#' => {
                end = at;
                break;
            }
            b'%' => plain = false,
            // `| 0x20` lowers an ASCII letter.
            _ if byte | 0x20 == b'l'
                && bytes
                    .get(at + 1..at + 5)
                    .is_some_and(|rest| rest.eq_ignore_ascii_case(b"ease")) =>
            {
                plain = false;
            }
            _ => {}
        }
    }
    let path = &path[..end];
    if plain {
        return Cow::Borrowed(path);
    }
    let mut offset = 0;
    for segment in path.split('/') {
        let end = offset + segment.len();
        if is_lease_segment(segment) {
            let rest = &path[end..];
            // Nothing but slashes after it: nothing to hide.
            if rest.trim_matches('/').is_empty() {
                return Cow::Borrowed(path);
            }
            return Cow::Owned(format!("{}/{HIDDEN}", &path[..end]));
        }
        offset = end + 1;
    }
    Cow::Borrowed(path)
}

/// `lease` or `leases` in any letter case, percent-encoded bytes decoded.
fn is_lease_segment(segment: &str) -> bool {
    // Up to 3 bytes per character when percent-encoded: anything longer is not "leases".
    if segment.is_empty() || segment.len() > 3 * "leases".len() {
        return false;
    }
    // Without a `%` there is nothing to decode (and nothing to allocate).
    if !segment.contains('%') {
        return segment.eq_ignore_ascii_case("lease") || segment.eq_ignore_ascii_case("leases");
    }
    let decoded = percent_decoded(segment);
    decoded.eq_ignore_ascii_case(b"lease") || decoded.eq_ignore_ascii_case(b"leases")
}

fn percent_decoded(segment: &str) -> Vec<u8> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = bytes.get(i + 1..i + 3)
            && let Ok(text) = std::str::from_utf8(hex)
            && let Ok(byte) = u8::from_str_radix(text, 16)
        {
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_segments_after_a_lease_segment_are_hidden_however_spelled() {
        for (path, logged) in [
            ("/p/api/lease/3f9a-secret", "/p/api/lease/{id}"),
            ("/api/lease/secret", "/api/lease/{id}"),
            ("/api/Lease/secret", "/api/Lease/{id}"),
            ("/API/LEASE/secret", "/API/LEASE/{id}"),
            ("//api/lease/secret", "//api/lease/{id}"),
            ("/api//lease/secret", "/api//lease/{id}"),
            ("/api/lease//secret", "/api/lease/{id}"),
            ("/api/lease/secret/more", "/api/lease/{id}"),
            ("/api/leases/secret", "/api/leases/{id}"),
            ("/v1/leases/name", "/v1/leases/{id}"),
            ("/anything/LeAsE/secret", "/anything/LeAsE/{id}"),
            ("/api/le%61se/secret", "/api/le%61se/{id}"),
            ("/api/%4C%45%41%53%45/secret", "/api/%4C%45%41%53%45/{id}"),
            ("/api/lease/secret?x=1", "/api/lease/{id}"),
            ("/api/lease?leaseId=secret", "/api/lease"),
            ("/api/channels?lease=secret", "/api/channels"),
        ] {
            assert_eq!(loggable_path(path), logged, "{path}");
        }
    }

    #[test]
    fn other_paths_are_logged_as_they_are() {
        for path in [
            "/api/lease",
            "/api/lease/",
            "/api/channels",
            "/",
            "",
            "/api/leased/x",
            "/api/release/x",
            "/v1/semaphores/x",
        ] {
            assert_eq!(loggable_path(path), path, "{path}");
        }
    }
}

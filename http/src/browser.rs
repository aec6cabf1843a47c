//! A web browser is a door too: any page a lab member opens can make their browser send
//! requests to the gateway. Three rules keep pages of other sites out, read once from
//! `[http]` ([`BrowserRules`]):
//!
//! - **Only known names** (`http.allowed_hosts`): a request's `Host` (HTTP/2: `:authority`)
//!   must be an IP address, one of the gateway's own names or a listed one, else 421 before any
//!   routing. A page on a name re-pointed at the gateway's address after it loaded (DNS
//!   rebinding) is the gateway's "own origin" to the browser; its requests name that name.
//! - **A change from another site changes nothing** ([`RequestSite`]): a request that can
//!   change something (the route table says which: `Route::can_change`) is refused with 403 when
//!   the browser says it comes from elsewhere: an `Origin` other than the gateway's own or a
//!   listed one, or `Sec-Fetch-Site: cross-site`. Clients that send neither (scripts, the
//!   reference clients, curl) are not affected.
//! - **CORS only for the listed origins** (`http.allowed_origins`): a preflight from one of
//!   them is answered with what the API takes, their requests carry
//!   `Access-Control-Allow-Origin`; any other origin's preflight is 403.
//!
//! (The third, "JSON endpoints take JSON", is the body's: `body/media_type.rs`.) Every check on
//! a request that passes is a few header lookups and comparisons: nothing is allocated.

use hyper::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_METHOD, HOST, HeaderMap, HeaderValue, ORIGIN, VARY,
};
use hyper::http::request::Parts;
use hyper::{Method, Response, Version};

use crate::config::HttpConfig;
use crate::config::web_origin::{
    WebOrigin, host_matches, is_ip_literal, same_host, split_host_port,
};
use crate::error::{ApiError, ErrorKind};
use crate::reply::{Body, error_response, no_content};

/// The header a browser tells with where a request comes from (Fetch Metadata).
const SEC_FETCH_SITE: &str = "sec-fetch-site";

/// What a preflight allows: every method the API has, and the headers its clients send.
const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE";
const ALLOWED_HEADERS: &str =
    "Authorization, Content-Type, Last-Event-ID, X-Api-Key, X-Lease-Id, X-Lease-Token";
/// What a page of a listed origin may read of an answer beyond the safelisted headers.
const EXPOSED_HEADERS: &str = "Allow, Retry-After, WWW-Authenticate, X-Lease-Fence";
/// How long a browser may keep a preflight's answer (seconds).
const PREFLIGHT_MAX_AGE: &str = "600";

/// Where a request says it comes from, as its browser tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestSite {
    /// Neither an `Origin` nor `Sec-Fetch-Site: cross-site`: a script, a client, curl (or a
    /// browser's own navigation, which changes nothing).
    Unsaid,
    /// A page of the gateway's own origin (its status pages).
    SameOrigin,
    /// A page of an origin `http.allowed_origins` lists.
    Listed,
    /// A page of another site: an `Origin` neither the gateway's own nor listed (`null`
    /// included), or `Sec-Fetch-Site: cross-site`.
    Elsewhere,
}

/// The browser rules of `[http]`, read once when serving starts.
#[derive(Debug)]
pub struct BrowserRules {
    /// The names requests may give besides IP addresses (patterns: a name or `*.domain`);
    /// `None`: any (`allowed_hosts = ["*"]`).
    hosts: Option<Vec<String>>,
    /// `http.allowed_origins`, each checked when the config was read.
    origins: Vec<String>,
    /// `https` with TLS, else `http`: the scheme of the gateway's own origin.
    scheme: &'static str,
}

impl BrowserRules {
    /// The rules `http` sets, for a gateway serving with TLS or not.
    pub fn new(http: &HttpConfig, tls: bool) -> BrowserRules {
        let hosts = if http.allowed_hosts.iter().any(|host| host == "*") {
            None
        } else {
            let mut hosts = own_names(http);
            for listed in &http.allowed_hosts {
                if !hosts.iter().any(|known| same_host(known, listed)) {
                    hosts.push(listed.to_ascii_lowercase());
                }
            }
            Some(hosts)
        };
        BrowserRules {
            hosts,
            origins: http.allowed_origins.clone(),
            scheme: if tls { "https" } else { "http" },
        }
    }

    /// Why a request is refused for the host it names, if it is: 400 for an HTTP/1.1 request
    /// without exactly one `Host` (RFC 9112), 421 for a name the gateway is not known by (its
    /// `Host`, or its `:authority` on HTTP/2 and an absolute request target). Before routing,
    /// for every path.
    pub fn host_refusal(&self, head: &Parts) -> Option<ApiError> {
        if let Some(malformed) = malformed_host(head) {
            return Some(malformed);
        }
        if let Some(authority) = head.uri.authority()
            && !self.knows(authority.as_str())
        {
            return Some(self.unknown_host(authority.as_str()));
        }
        for host in head.headers.get_all(HOST) {
            let named = host.to_str().unwrap_or("");
            if !self.knows(named) {
                return Some(self.unknown_host(named));
            }
        }
        None
    }

    /// Whether `authority` (`host[:port]`) is a name or address the gateway may be reached by.
    fn knows(&self, authority: &str) -> bool {
        let Some(hosts) = &self.hosts else {
            return true;
        };
        let Some((host, _port)) = split_host_port(authority) else {
            return false;
        };
        is_ip_literal(host) || hosts.iter().any(|known| host_matches(known, host))
    }

    fn unknown_host(&self, named: &str) -> ApiError {
        let own = self
            .hosts
            .as_deref()
            .unwrap_or_default()
            .iter()
            .take(6)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        ApiError::new(
            ErrorKind::UnknownHost,
            format!(
                "this gateway is not known by the name {named:?} (the request's Host): a web page on a name re-pointed at the gateway's address (DNS rebinding) would send it. \
                 Reach it by an IP address or one of its names ({own}), or add the name to http.allowed_hosts ([\"*\"] accepts any name, for a gateway behind a proxy that checks it)"
            ),
        )
    }

    /// Where `head` says it comes from.
    pub fn site(&self, head: &Parts) -> RequestSite {
        match head.headers.get(ORIGIN) {
            Some(origin) => {
                let Some(origin) = origin.to_str().ok().and_then(|o| WebOrigin::parse(o).ok())
                else {
                    return RequestSite::Elsewhere;
                };
                if authority_of(head).is_some_and(|own| origin.is_of(self.scheme, own)) {
                    RequestSite::SameOrigin
                } else if self.lists(&origin) {
                    RequestSite::Listed
                } else {
                    RequestSite::Elsewhere
                }
            }
            None => match head.headers.get(SEC_FETCH_SITE) {
                Some(site) if site.as_bytes().eq_ignore_ascii_case(b"cross-site") => {
                    RequestSite::Elsewhere
                }
                _ => RequestSite::Unsaid,
            },
        }
    }

    fn lists(&self, origin: &WebOrigin<'_>) -> bool {
        self.origins
            .iter()
            .any(|listed| WebOrigin::parse(listed).is_ok_and(|listed| listed.same_as(origin)))
    }

    /// The answer to a CORS preflight (`OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`), for any path: 204 with what the API takes for an
    /// origin `http.allowed_origins` lists, 403 naming the setting for any other. `None`: not
    /// a preflight.
    pub fn preflight(&self, head: &Parts) -> Option<Response<Body>> {
        if head.method != Method::OPTIONS
            || !head.headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD)
        {
            return None;
        }
        let origin = head.headers.get(ORIGIN)?;
        if self.site(head) != RequestSite::Listed {
            let listed = match self.origins.is_empty() {
                true => "none is listed".to_owned(),
                false => format!("it lists {}", self.origins.join(", ")),
            };
            return Some(error_response(&ApiError::new(
                ErrorKind::CrossSite,
                format!(
                    "cross-origin requests from {:?} are not allowed: CORS is answered only for the origins http.allowed_origins lists ({listed}); add the dashboard's origin there to let it in",
                    String::from_utf8_lossy(origin.as_bytes())
                ),
            )));
        }
        let mut response = no_content();
        let headers = response.headers_mut();
        allow_origin_headers(headers, origin.clone());
        headers.insert(
            ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOWED_METHODS),
        );
        headers.insert(
            ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOWED_HEADERS),
        );
        headers.insert(
            ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
        headers.insert(
            VARY,
            HeaderValue::from_static(
                "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
            ),
        );
        Some(response)
    }

    /// The `Origin` of a request from a page of a listed origin, to allow in its answer
    /// ([`allow_origin`]); `None` for every other request (and at once while none is listed).
    pub fn cors_origin(&self, head: &Parts) -> Option<HeaderValue> {
        if self.origins.is_empty() {
            return None;
        }
        let origin = head.headers.get(ORIGIN)?;
        (self.site(head) == RequestSite::Listed).then(|| origin.clone())
    }
}

/// Why a request's `Host` makes it a 400, if it does (RFC 9112 §3.2): an HTTP/1.1 request
/// without one, or with more than one. HTTP/1.0 needs none; HTTP/2 names its authority in
/// `:authority`. One header lookup, nothing made unless refused.
pub(crate) fn malformed_host(head: &Parts) -> Option<ApiError> {
    if head.version != Version::HTTP_11 {
        return None;
    }
    let mut hosts = head.headers.get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(_), None) => None,
        (None, _) => Some(ApiError::bad_request(
            "an HTTP/1.1 request must carry a Host header (RFC 9112 section 3.2); this one has none: send Host: the gateway's host and port",
        )),
        (Some(_), Some(_)) => Some(ApiError::bad_request(
            "an HTTP/1.1 request carries exactly one Host header (RFC 9112 section 3.2); this one has several",
        )),
    }
}

/// Lets the page of `origin` (a listed one: [`BrowserRules::cors_origin`]) read `response`.
pub fn allow_origin(response: &mut Response<Body>, origin: HeaderValue) {
    let headers = response.headers_mut();
    allow_origin_headers(headers, origin);
    headers.insert(
        ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED_HEADERS),
    );
    headers.append(VARY, HeaderValue::from_static("Origin"));
}

fn allow_origin_headers(headers: &mut HeaderMap, origin: HeaderValue) {
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
}

/// The 403 of a change a page of another site sent ([`RequestSite::Elsewhere`]), naming why
/// and what to change.
pub fn cross_site_refusal(head: &Parts, tls: bool) -> ApiError {
    let scheme = if tls { "https" } else { "http" };
    let own = match authority_of(head) {
        Some(authority) => format!("{scheme}://{authority}"),
        None => "this gateway's own".to_owned(),
    };
    let why = match head.headers.get(ORIGIN) {
        Some(origin) => format!(
            "a web page of another origin ({}, its Origin), not this gateway's own ({own}) nor one listed in http.allowed_origins",
            String::from_utf8_lossy(origin.as_bytes())
        ),
        None => {
            "a web page of another site (the browser says Sec-Fetch-Site: cross-site)".to_owned()
        }
    };
    ApiError::new(
        ErrorKind::CrossSite,
        format!(
            "refused: this change was sent by {why}. A page on another site may not change anything here through a lab member's browser; \
             scripts and clients that send no Origin are not affected. To let a dashboard at that origin in, add it to http.allowed_origins"
        ),
    )
}

/// The host and port the client reached: HTTP/2's `:authority` (or an absolute request
/// target's), else the `Host` header.
fn authority_of(head: &Parts) -> Option<&str> {
    match head.uri.authority() {
        Some(authority) => Some(authority.as_str()),
        None => head.headers.get(HOST)?.to_str().ok(),
    }
}

/// The gateway's own names: `localhost` and every name below it (browsers resolve them to
/// loopback themselves), the machine's host name (with and without its domain, and as
/// `NAME.local`), the listen address's host when it is a name, and `http.host_name`.
fn own_names(http: &HttpConfig) -> Vec<String> {
    let mut names = vec!["localhost".to_owned(), "*.localhost".to_owned()];
    let mut add = |name: &str| {
        let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
        if !name.is_empty()
            && !is_ip_literal(&name)
            && !names.iter().any(|known| same_host(known, &name))
        {
            names.push(name);
        }
    };
    if let Ok(host) = nix::unistd::gethostname() {
        let host = host.to_string_lossy();
        add(&host);
        if let Some((short, _domain)) = host.split_once('.') {
            add(short);
        }
        let short = host.split('.').next().unwrap_or_default();
        add(&format!("{short}.local"));
    }
    if let Some((host, _)) = split_host_port(&http.listen) {
        add(host);
    }
    add(&http.host_name);
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: Method, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = hyper::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn rules(tweak: impl FnOnce(&mut HttpConfig)) -> BrowserRules {
        let mut http = HttpConfig::default();
        tweak(&mut http);
        BrowserRules::new(&http, false)
    }

    #[test]
    fn hosts_are_ip_addresses_own_names_or_listed_ones() {
        let known = rules(|http| http.allowed_hosts = vec!["gw.lab".into(), "*.bench".into()]);
        let status = |host: &str| {
            known
                .host_refusal(&head(Method::GET, "/api/lease", &[("host", host)]))
                .map(|refusal| refusal.status().as_u16())
        };
        for known in [
            "127.0.0.1:5000",
            "[::1]:5000",
            "10.0.0.7",
            "localhost:5000",
            "app.localhost",
            "GW.lab",
            "gw.lab.:80",
            "hv3.bench",
        ] {
            assert_eq!(status(known), None, "{known}");
        }
        for unknown in [
            "rebind.evil.example",
            "bench",
            "gw.lab.evil",
            "",
            "gw lab",
            "1.2.3",
        ] {
            assert_eq!(status(unknown), Some(421), "{unknown}");
        }
        // An absolute target names its host as well; a missing Host on HTTP/1.1 stays a 400.
        let absolute = head(
            Method::GET,
            "http://rebind.evil.example/api/lease",
            &[("host", "127.0.0.1")],
        );
        assert_eq!(known.host_refusal(&absolute).unwrap().status(), 421);
        let none = head(Method::GET, "/api/lease", &[]);
        assert_eq!(known.host_refusal(&none).unwrap().status(), 400);
        let message = known
            .host_refusal(&head(Method::GET, "/", &[("host", "evil.example")]))
            .unwrap()
            .message;
        assert!(message.contains("http.allowed_hosts"), "{message}");
        assert!(message.contains("\"evil.example\""), "{message}");
        let open = rules(|http| http.allowed_hosts = vec!["*".into()]);
        assert!(
            open.host_refusal(&head(Method::GET, "/", &[("host", "anything")]))
                .is_none()
        );
    }

    #[test]
    fn the_site_is_told_by_origin_then_by_fetch_metadata() {
        let rules = rules(|http| http.allowed_origins = vec!["https://dash.lab".into()]);
        let site = |headers: &[(&str, &str)]| {
            let mut all = vec![("host", "127.0.0.1:5000")];
            all.extend_from_slice(headers);
            rules.site(&head(Method::POST, "/api/lease", &all))
        };
        assert_eq!(site(&[]), RequestSite::Unsaid);
        assert_eq!(
            site(&[("sec-fetch-site", "same-site")]),
            RequestSite::Unsaid
        );
        assert_eq!(
            site(&[("sec-fetch-site", "Cross-Site")]),
            RequestSite::Elsewhere
        );
        assert_eq!(
            site(&[("origin", "http://127.0.0.1:5000")]),
            RequestSite::SameOrigin
        );
        assert_eq!(
            site(&[
                ("origin", "https://dash.lab"),
                ("sec-fetch-site", "cross-site")
            ]),
            RequestSite::Listed
        );
        for foreign in [
            "http://evil.example",
            "null",
            "https://127.0.0.1:5000",
            "http://127.0.0.1:5001",
            "http://dash.lab",
            "garbage",
        ] {
            assert_eq!(
                site(&[("origin", foreign)]),
                RequestSite::Elsewhere,
                "{foreign}"
            );
        }
    }

    #[test]
    fn a_preflight_is_answered_for_listed_origins_only() {
        let rules = rules(|http| http.allowed_origins = vec!["https://dash.lab".into()]);
        let preflight = |origin: &str| {
            rules.preflight(&head(
                Method::OPTIONS,
                "/api/resources/value/set",
                &[
                    ("host", "gw:5000"),
                    ("origin", origin),
                    ("access-control-request-method", "POST"),
                ],
            ))
        };
        let allowed = preflight("https://dash.lab").unwrap();
        assert_eq!(allowed.status(), 204);
        assert_eq!(
            allowed.headers()[ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://dash.lab"
        );
        let refused = preflight("https://evil.example").unwrap();
        assert_eq!(refused.status(), 403);
        assert!(!refused.headers().contains_key(ACCESS_CONTROL_ALLOW_ORIGIN));
        // An OPTIONS that is not a preflight is routed as any request.
        let plain = head(Method::OPTIONS, "/api/lease", &[("host", "gw")]);
        assert!(rules.preflight(&plain).is_none());
        assert!(
            rules
                .cors_origin(&head(
                    Method::GET,
                    "/",
                    &[("host", "gw"), ("origin", "https://dash.lab")]
                ))
                .is_some()
        );
        assert!(
            rules
                .cors_origin(&head(
                    Method::GET,
                    "/",
                    &[("host", "gw"), ("origin", "https://evil.example")]
                ))
                .is_none()
        );
    }

    #[test]
    fn a_cross_site_refusal_names_the_origin_the_gateways_own_and_the_setting() {
        let refusal = cross_site_refusal(
            &head(
                Method::POST,
                "/api/lease",
                &[
                    ("host", "127.0.0.1:5000"),
                    ("origin", "http://evil.example"),
                ],
            ),
            false,
        );
        assert_eq!(refusal.status(), 403);
        for part in [
            "http://evil.example",
            "http://127.0.0.1:5000",
            "http.allowed_origins",
        ] {
            assert!(
                refusal.message.contains(part),
                "{part}: {}",
                refusal.message
            );
        }
    }
}

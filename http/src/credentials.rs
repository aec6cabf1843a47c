//! Who a request is, for HTTP access control: API keys (`X-Api-Key`) and HTTP Basic users, each with a
//! [`Role`]; off while none are configured. Checked once per request in `routes.rs` with the role the endpoint table names, before
//! the body is read and before the lease admission.
//!
//! Keys and passwords are compared in constant time and never logged.

use base64::Engine as _;
use hyper::header::{AUTHORIZATION, HeaderMap};
use subtle::ConstantTimeEq;

use crate::config::{AccessConfig, Role};

/// The header API keys travel in (`default_headers={"X-Api-Key": ...}`, as `accordionq2/client.py`
/// 5.28.1 shows it).
pub const API_KEY_HEADER: &str = "x-api-key";
/// The `WWW-Authenticate` challenge sent with a 401 while Basic users are configured.
pub const BASIC_CHALLENGE: &str = "Basic realm=\"station-gateway\", charset=\"UTF-8\"";

/// Why a request was refused by access control. Its HTTP status is chosen in `crate::error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No credentials, or ones that match no key or user.
    #[error("{}", unauthenticated_message(*.keys, *.basic))]
    Unauthenticated { keys: bool, basic: bool },
    /// Valid credentials whose role is too low.
    #[error("this needs the role {} or higher; the credentials sent have the role {}; ask the gateway's operator for a key or user with that role", .needed.name(), .granted.name())]
    Forbidden { needed: Role, granted: Role },
}

fn unauthenticated_message(keys: bool, basic: bool) -> String {
    let how = match (keys, basic) {
        (true, true) => {
            "an API key in the X-Api-Key header, or a user and password with HTTP Basic"
        }
        (true, false) => "an API key in the X-Api-Key header",
        _ => "a user and password with HTTP Basic",
    };
    format!(
        "authentication required: the gateway's access control is on; send {how} (missing or wrong credentials)"
    )
}

/// The configured credentials, ready for constant-time comparison.
#[derive(Default)]
pub struct AccessControl {
    keys: Vec<(Vec<u8>, Role)>,
    /// `name:password` as a Basic header carries it once decoded.
    users: Vec<(Vec<u8>, Role)>,
    /// Who each key and each user is, for the audit trail (same order as `keys`, `users`).
    key_names: Vec<String>,
    user_names: Vec<String>,
}

// Never the secrets, not even in a debug print.
impl std::fmt::Debug for AccessControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessControl")
            .field("keys", &self.keys.len())
            .field("users", &self.users.len())
            .finish()
    }
}

impl AccessControl {
    pub fn new(config: &AccessConfig) -> AccessControl {
        AccessControl {
            keys: config
                .keys
                .iter()
                .map(|k| (k.key.as_bytes().to_vec(), k.role))
                .collect(),
            users: config
                .users
                .iter()
                .map(|u| (format!("{}:{}", u.name, u.password).into_bytes(), u.role))
                .collect(),
            key_names: config
                .keys
                .iter()
                .enumerate()
                .map(|(at, k)| {
                    if k.name.is_empty() {
                        format!("key {}", at + 1)
                    } else {
                        k.name.clone()
                    }
                })
                .collect(),
            user_names: config.users.iter().map(|u| u.name.clone()).collect(),
        }
    }

    /// Whether any credential is configured; when not, everyone may do everything.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty() || !self.users.is_empty()
    }

    /// Whether Basic users are configured (401s then carry a `WWW-Authenticate` challenge).
    pub fn basic_enabled(&self) -> bool {
        !self.users.is_empty()
    }

    /// Checks a request's credentials against `needed`. `Ok(None)` while access control is off
    /// or nothing is needed; `Ok(Some(role))` is the role the credentials were granted.
    pub fn authorize(
        &self,
        headers: &HeaderMap,
        needed: Option<Role>,
    ) -> Result<Option<Role>, AccessError> {
        let Some(needed) = needed.filter(|_| self.enabled()) else {
            return Ok(None);
        };
        let granted = self
            .key_role(headers)
            .or_else(|| self.basic_role(headers))
            .ok_or(AccessError::Unauthenticated {
                keys: !self.keys.is_empty(),
                basic: self.basic_enabled(),
            })?;
        if granted < needed {
            return Err(AccessError::Forbidden { needed, granted });
        }
        Ok(Some(granted))
    }

    /// Who the request's credentials name, for the audit trail: the API key's name (`key N`
    /// when it has none) or the Basic user; `None` without valid credentials. Never a secret.
    pub fn caller(&self, headers: &HeaderMap) -> Option<String> {
        if let Some(presented) = headers.get(API_KEY_HEADER)
            && let Some(at) = matching_index(&self.keys, presented.as_bytes())
        {
            return Some(self.key_names[at].clone());
        }
        let decoded = basic_credentials(headers)?;
        matching_index(&self.users, &decoded).map(|at| self.user_names[at].clone())
    }

    fn key_role(&self, headers: &HeaderMap) -> Option<Role> {
        let presented = headers.get(API_KEY_HEADER)?.as_bytes();
        matching_role(&self.keys, presented)
    }

    fn basic_role(&self, headers: &HeaderMap) -> Option<Role> {
        let decoded = basic_credentials(headers)?;
        matching_role(&self.users, &decoded)
    }
}

/// `name:password` of an `Authorization: Basic` header, decoded.
fn basic_credentials(headers: &HeaderMap) -> Option<Vec<u8>> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
}

/// The place of the entry with the highest role equal to `presented` (the one `authorize`
/// granted); compared in constant time like [`matching_role`].
fn matching_index(entries: &[(Vec<u8>, Role)], presented: &[u8]) -> Option<usize> {
    let mut found: Option<(Role, usize)> = None;
    for (at, (secret, role)) in entries.iter().enumerate() {
        if bool::from(secret.as_slice().ct_eq(presented)) && found.is_none_or(|(r, _)| *role > r) {
            found = Some((*role, at));
        }
    }
    found.map(|(_, at)| at)
}

/// The role of the entry equal to `presented`; every entry is compared in constant time, and
/// the comparison does not stop at the first match.
fn matching_role(entries: &[(Vec<u8>, Role)], presented: &[u8]) -> Option<Role> {
    let mut found = None;
    for (secret, role) in entries {
        if bool::from(secret.as_slice().ct_eq(presented)) {
            found = found.max(Some(*role));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiKey, User};
    use hyper::header::HeaderValue;

    fn control() -> AccessControl {
        AccessControl::new(&AccessConfig {
            keys: vec![
                ApiKey {
                    key: "reader-key-0123456789".into(),
                    role: Role::Read,
                    name: String::new(),
                },
                ApiKey {
                    key: "control-key-0123456789".into(),
                    role: Role::Control,
                    name: String::new(),
                },
            ],
            users: vec![User {
                name: "ops".into(),
                password: "s3cret:with colon".into(),
                role: Role::Admin,
            }],
            ..AccessConfig::default()
        })
    }

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn basic(user_pass: &str) -> HeaderMap {
        let encoded = base64::engine::general_purpose::STANDARD.encode(user_pass);
        headers("authorization", &format!("Basic {encoded}"))
    }

    #[test]
    fn off_without_credentials_configured() {
        let off = AccessControl::default();
        assert_eq!(
            off.authorize(&HeaderMap::new(), Some(Role::Admin)),
            Ok(None)
        );
    }

    #[test]
    fn keys_and_users_get_their_roles() {
        let access = control();
        let reader = headers(API_KEY_HEADER, "reader-key-0123456789");
        assert_eq!(
            access.authorize(&reader, Some(Role::Read)),
            Ok(Some(Role::Read))
        );
        assert_eq!(
            access.authorize(&reader, Some(Role::Control)),
            Err(AccessError::Forbidden {
                needed: Role::Control,
                granted: Role::Read
            })
        );
        let controller = headers(API_KEY_HEADER, "control-key-0123456789");
        assert!(access.authorize(&controller, Some(Role::Control)).is_ok());
        assert!(access.authorize(&controller, Some(Role::Admin)).is_err());
        let admin = basic("ops:s3cret:with colon");
        assert_eq!(
            access.authorize(&admin, Some(Role::Admin)),
            Ok(Some(Role::Admin))
        );
        assert_eq!(access.authorize(&admin, None), Ok(None));
    }

    #[test]
    fn callers_are_named_by_key_name_or_user_never_by_secret() {
        let access = control();
        let reader = headers(API_KEY_HEADER, "reader-key-0123456789");
        assert_eq!(access.caller(&reader).as_deref(), Some("key 1"));
        let controller = headers(API_KEY_HEADER, "control-key-0123456789");
        assert_eq!(access.caller(&controller).as_deref(), Some("key 2"));
        assert_eq!(
            access.caller(&basic("ops:s3cret:with colon")).as_deref(),
            Some("ops")
        );
        assert_eq!(access.caller(&basic("ops:wrong")), None);
        assert_eq!(access.caller(&HeaderMap::new()), None);
        let named = AccessControl::new(&AccessConfig {
            keys: vec![ApiKey {
                key: "bench-3-key-0123456789".into(),
                role: Role::Control,
                name: "bench 3".into(),
            }],
            users: Vec::new(),
            ..AccessConfig::default()
        });
        let bench = headers(API_KEY_HEADER, "bench-3-key-0123456789");
        assert_eq!(named.caller(&bench).as_deref(), Some("bench 3"));
    }

    #[test]
    fn missing_or_wrong_credentials_are_unauthenticated() {
        let access = control();
        let error = AccessError::Unauthenticated {
            keys: true,
            basic: true,
        };
        let unauthenticated = Err(error.clone());
        for headers in [
            HeaderMap::new(),
            headers(API_KEY_HEADER, "reader-key-012345678"),
            headers(API_KEY_HEADER, "reader-key-01234567890"),
            basic("ops:wrong"),
            basic("ops"),
            headers("authorization", "Basic !!!not base64"),
            headers("authorization", "Bearer reader-key-0123456789"),
        ] {
            assert_eq!(
                access.authorize(&headers, Some(Role::Read)),
                unauthenticated
            );
        }
        let message = error.to_string();
        assert!(message.contains("X-Api-Key"), "{message}");
        assert!(message.contains("Basic"), "{message}");
    }

    #[test]
    fn the_debug_print_shows_no_secret() {
        let printed = format!("{:?}", control());
        assert!(!printed.contains("key-0123"), "{printed}");
        let config = AccessConfig {
            keys: vec![ApiKey {
                key: "control-key-0123456789".into(),
                role: Role::Control,
                name: String::new(),
            }],
            users: vec![User {
                name: "ops".into(),
                password: "hunter22".into(),
                role: Role::Admin,
            }],
            ..AccessConfig::default()
        };
        let printed = format!("{config:?}");
        assert!(!printed.contains("control-key"), "{printed}");
        assert!(!printed.contains("hunter22"), "{printed}");
    }
}

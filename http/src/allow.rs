//! The methods a path has, as a 405's `Allow` header names them (RFC 9110 §15.5.6): a set
//! small enough to ride in an `ApiError` without making it larger, written out only when a 405
//! is answered.

use hyper::Method;
use hyper::header::HeaderValue;

/// A set of the methods the gateway serves, in the order `Allow` lists them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowed(u8);

/// Every method a route may have, in the order `Allow` lists them.
const ORDER: [Method; 6] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

impl Allowed {
    pub const NONE: Allowed = Allowed(0);
    /// What the operations (`/healthz`, `/metrics`, the status page) and `/openapi.json` have.
    pub const GET_AND_HEAD: Allowed = Allowed(0b11);

    /// The set of `methods` (a method the gateway serves on no route is left out).
    pub fn of(methods: &[Method]) -> Allowed {
        methods
            .iter()
            .fold(Allowed::NONE, |set, method| set.with(method))
    }

    /// This set and `method`.
    pub fn with(self, method: &Method) -> Allowed {
        match ORDER.iter().position(|m| m == method) {
            Some(bit) => Allowed(self.0 | 1 << bit),
            None => self,
        }
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The methods as `Allow` lists them: "GET, POST, DELETE".
    pub fn listed(self) -> String {
        ORDER
            .iter()
            .enumerate()
            .filter(|(bit, _)| self.0 & 1 << bit != 0)
            .map(|(_, method)| method.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The `Allow` header's value.
    pub fn header_value(self) -> HeaderValue {
        HeaderValue::from_str(&self.listed()).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_listed_in_one_order_whatever_order_they_came_in() {
        assert_eq!(
            Allowed::of(&[Method::DELETE, Method::GET, Method::POST]).listed(),
            "GET, POST, DELETE"
        );
        assert_eq!(Allowed::GET_AND_HEAD.listed(), "GET, HEAD");
        assert_eq!(
            Allowed::NONE.with(&Method::PUT).with(&Method::PUT).listed(),
            "PUT"
        );
        assert_eq!(Allowed::of(&[Method::OPTIONS]), Allowed::NONE);
        assert!(Allowed::NONE.is_empty());
        assert_eq!(
            Allowed::of(&[Method::PATCH, Method::HEAD]).header_value(),
            "HEAD, PATCH"
        );
    }
}

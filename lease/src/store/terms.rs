//! The terms every lease store speaks, plain data below the [`LeaseStore`] trait, its backends
//! and the acquisition decision (`plan`): who holds a lease ([`LeaseToken`], [`LeaseGrant`],
//! [`LeaseHolder`]), what an acquisition asks and gets ([`AcquireRequest`], [`Acquisition`]),
//! a lease's [`LeaseKind`], and why a store could not answer ([`LeaseStoreError`]).
//!
//! [`LeaseStore`]: super::LeaseStore

use std::fmt;
use std::time::{Duration, SystemTime};

use subtle::ConstantTimeEq;

/// The secret that proves who holds a lease: 128 random bits as 32 hex digits (a store never
/// gives a lease any other), or a token as a caller presented it. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A new token of 128 random bits from the operating system's generator.
    pub fn random() -> LeaseToken {
        use rand::RngCore;
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        LeaseToken(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// A token as a caller presented it (e.g. from a header): it proves nothing until a store
    /// finds it holding a lease.
    pub fn from_text(text: impl Into<String>) -> LeaseToken {
        LeaseToken(text.into())
    }

    /// The token as text (to hand to its holder; never log it).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, compared in constant time for equal lengths.
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(<secret>)")
    }
}

/// A lease as its holder sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The secret that refreshes and releases it.
    pub token: LeaseToken,
    /// Who holds it, as others see it.
    pub owner: String,
    /// Goes up each time the name (or a slot of it) is taken: hand it to whatever the lease
    /// protects, so that a stalled holder's late write can be told apart.
    pub fence: u64,
    /// The time to live it was last given.
    pub ttl: Duration,
    /// How long it has left, as of the answer.
    pub expires_in: Duration,
    /// When this holder took it (the backend's clock, for display).
    pub since: SystemTime,
    /// The semaphore slot it holds; 0 for an exclusive lease.
    pub slot: u32,
}

/// Who holds a lease, as anyone may see it (never the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// Who holds it.
    pub owner: String,
    /// The fence it was taken with.
    pub fence: u64,
    /// How long it has left, as of the answer.
    pub expires_in: Duration,
    /// When this holder took it (the backend's clock, for display).
    pub since: SystemTime,
    /// The semaphore slot it holds; 0 for an exclusive lease.
    pub slot: u32,
}

impl LeaseHolder {
    /// A holder the backend could not describe (never expected; keeps refusals total).
    pub fn unknown() -> LeaseHolder {
        LeaseHolder {
            owner: "an unknown holder".into(),
            fence: 0,
            expires_in: Duration::ZERO,
            since: SystemTime::UNIX_EPOCH,
            slot: 0,
        }
    }
}

impl From<LeaseGrant> for LeaseHolder {
    fn from(grant: LeaseGrant) -> LeaseHolder {
        LeaseHolder {
            owner: grant.owner,
            fence: grant.fence,
            expires_in: grant.expires_in,
            since: grant.since,
            slot: grant.slot,
        }
    }
}

/// What one acquisition attempt asks for.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// Who asks, as others will see it.
    pub owner: String,
    /// How long the lease lasts unless refreshed.
    pub ttl: Duration,
    /// A token an earlier grant gave (a retry of the same job): it gets back, renewed with the
    /// same fence, the lease it still holds. A token that holds nothing is never given to a
    /// lease: the acquisition is then a fresh one, with [`fresh_token`](Self::fresh_token).
    pub retry_token: Option<LeaseToken>,
    /// The token a lease taken anew gets: 128 random bits, drawn when the request is made and
    /// kept by its clones, so that every attempt of one request (a blocking wait) is one caller.
    fresh_token: LeaseToken,
}

impl AcquireRequest {
    /// A request by `owner` for `ttl`, with a fresh random token.
    pub fn new(owner: impl Into<String>, ttl: Duration) -> AcquireRequest {
        AcquireRequest {
            owner: owner.into(),
            ttl,
            retry_token: None,
            fresh_token: LeaseToken::random(),
        }
    }

    /// The same request, also renewing the lease `token` holds (see [`retry_token`]).
    ///
    /// [`retry_token`]: AcquireRequest::retry_token
    pub fn with_retry_token(mut self, token: LeaseToken) -> AcquireRequest {
        self.retry_token = Some(token);
        self
    }

    /// The token a lease taken anew by this request gets.
    pub fn fresh_token(&self) -> &LeaseToken {
        &self.fresh_token
    }

    /// Whether `holder` (a stored token) is this request's own: its fresh or its retry token.
    pub fn is_own(&self, holder: &str) -> bool {
        self.fresh_token.matches(holder)
            || self
                .retry_token
                .as_ref()
                .is_some_and(|token| token.matches(holder))
    }
}

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquisition {
    /// Taken anew, with a new fence.
    Taken(LeaseGrant),
    /// The caller's token already held it: renewed, same token and fence.
    Renewed(LeaseGrant),
    /// Someone else holds it (for a semaphore: every slot is taken; this is the holder whose
    /// slot frees soonest).
    HeldByOther(LeaseHolder),
}

/// An exclusive lease or a counted semaphore. A name is used as one or the other, never both:
/// the SQL backends keep both in one table (see `sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// One holder at a time (slot 0).
    Exclusive,
    /// At most `slots` holders at a time (slots `0..slots`). `slots` matters only to acquiring.
    Semaphore {
        /// How many may hold it at once.
        slots: u32,
    },
}

impl LeaseKind {
    /// How many may hold it at once.
    pub fn slots(self) -> u32 {
        match self {
            LeaseKind::Exclusive => 1,
            LeaseKind::Semaphore { slots } => slots.max(1),
        }
    }

    /// Whether it is a semaphore.
    pub fn is_semaphore(self) -> bool {
        matches!(self, LeaseKind::Semaphore { .. })
    }
}

/// Why a store could not answer, or refused a request that contradicts what it holds. A lease
/// the backend could not confirm is never reported held.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseStoreError {
    /// Not reached, not answering in time, or locked: try again.
    #[error("the lease store is unavailable: {0}")]
    Unavailable(String),
    /// The backend answered with an error.
    #[error("the lease store failed: {0}")]
    Backend(String),
    /// A semaphore asked for with another number of slots than the one in force: its first
    /// holder fixes it for as long as anyone holds it, so that no caller can make room for
    /// itself by asking for more.
    #[error(
        "the semaphore has {in_force} slots, fixed by its holders for as long as anyone holds it; \
         slots={asked} was asked: ask with slots={in_force}, or wait until nobody holds it"
    )]
    CapacityConflict {
        /// The number of slots its holders took it with.
        in_force: u32,
        /// The number asked for.
        asked: u32,
    },
    /// The backend URL is wrong.
    #[error("lease backend {url:?} cannot be used: {message}")]
    BadBackend {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_random_bits_in_hex_and_never_printed() {
        let token = LeaseToken::random();
        assert_eq!(token.as_str().len(), 32);
        assert!(token.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(token, LeaseToken::random());
        assert!(token.matches(token.as_str()));
        assert!(!token.matches(&token.as_str()[..31]));
        assert!(!format!("{token:?}").contains(token.as_str()));
    }
}

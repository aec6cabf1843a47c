//! The lease engine as lab code uses it: [`Lease::exclusive`] (`lease(name, ttl)`) and
//! [`Lease::semaphore`] (`semaphore(name, slots, ttl)`) on any [`LeaseStore`], with
//! `acquire(blocking, wait)`, `refresh(ttl)`, `release()` and a scoped [`LeaseGuard`].
//!
//! A `Lease` draws its fresh token (128 random bits) when it is made and asks with it on every
//! attempt, so an attempt whose answer was lost is not refused by its own lease; once held, it
//! asks with the token it holds. A job retried in a new process gets its lease back with
//! [`Lease::with_owner_token`] and the token of its earlier grant ([`Lease::token`]); a token
//! that holds nothing is never given to a lease, so a guessed one gets nothing. A lease never refreshes itself: its holder calls
//! `refresh` before the TTL passes, or loses it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;
use tracing::warn;

use crate::store::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseHolder, LeaseKind, LeaseStore, LeaseStoreError,
    LeaseToken,
};

/// The first pause between attempts of a blocking acquire; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// The longest pause between attempts of a blocking acquire (before jitter).
pub const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Why a [`LeaseGuard`] could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseGuardError {
    /// Someone else held it (and still did when the wait ran out).
    #[error("lease {name} not acquired: {}", held_by(.holder))]
    LeaseNotAcquired {
        /// The lease's name.
        name: String,
        /// Who held it at the last attempt.
        holder: Option<LeaseHolder>,
    },
    /// The store could not answer, or refused the request.
    #[error("{0}")]
    Store(#[from] LeaseStoreError),
}

fn held_by(holder: &Option<LeaseHolder>) -> String {
    match holder {
        Some(holder) => format!(
            "held by {} (fence {}) for another {} ms",
            holder.owner,
            holder.fence,
            holder.expires_in.as_millis()
        ),
        None => "still held when the wait ran out".into(),
    }
}

/// One lease or semaphore slot as its (would-be) holder sees it.
pub struct Lease {
    store: Arc<dyn LeaseStore>,
    kind: LeaseKind,
    name: String,
    /// Owner, TTL and the fresh token, for every attempt.
    request: AcquireRequest,
    /// The token it is held with: the last grant's; before one, the owner token given, else the
    /// fresh one.
    token: Mutex<LeaseToken>,
    /// What the store last said about our lease (None: not held as far as we know).
    held: Mutex<Option<LeaseGrant>>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("owner", &self.request.owner)
            .field("ttl", &self.request.ttl)
            .finish()
    }
}

impl Lease {
    /// `lease(name, ttl)`: exclusive.
    pub fn exclusive(store: Arc<dyn LeaseStore>, name: impl Into<String>, ttl: Duration) -> Lease {
        Lease::new(store, LeaseKind::Exclusive, name.into(), ttl)
    }

    /// `semaphore(name, slots, ttl)`: at most `slots` holders.
    pub fn semaphore(
        store: Arc<dyn LeaseStore>,
        name: impl Into<String>,
        slots: u32,
        ttl: Duration,
    ) -> Lease {
        Lease::new(store, LeaseKind::Semaphore { slots }, name.into(), ttl)
    }

    fn new(store: Arc<dyn LeaseStore>, kind: LeaseKind, name: String, ttl: Duration) -> Lease {
        let request = AcquireRequest::new(name.clone(), ttl);
        Lease {
            store,
            kind,
            name,
            token: Mutex::new(request.fresh_token().clone()),
            request,
            held: Mutex::new(None),
        }
    }

    /// Resumes the lease `token` holds: a token an earlier grant gave (see [`Lease::token`]),
    /// e.g. kept by a job that is now retried. The first acquire then gets that lease back,
    /// renewed with the same fence. A token that holds nothing gives nothing: the acquire is a
    /// fresh one, and the lease gets a token of 128 random bits.
    pub fn with_owner_token(self, token: LeaseToken) -> Lease {
        *self.token.lock().unwrap_or_else(PoisonError::into_inner) = token;
        self
    }

    /// Who holds it, as others see it (default: the name).
    pub fn with_owner(mut self, owner: impl Into<String>) -> Lease {
        self.request.owner = owner.into();
        self
    }

    /// The lease's name in the store.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Exclusive, or a semaphore of how many slots.
    pub fn kind(&self) -> LeaseKind {
        self.kind
    }

    /// The token this lease is held with (keep it to resume the lease after a restart, with
    /// [`Lease::with_owner_token`]); before it is held, the token it will ask with.
    pub fn token(&self) -> LeaseToken {
        self.token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What the store last confirmed (fence, slot, time left as of that answer).
    pub fn grant(&self) -> Option<LeaseGrant> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The fence of the last acquisition, while we believe we hold it.
    pub fn fence(&self) -> Option<u64> {
        self.grant().map(|grant| grant.fence)
    }

    fn remember(&self, grant: Option<LeaseGrant>) {
        if let Some(grant) = &grant {
            *self.token.lock().unwrap_or_else(PoisonError::into_inner) = grant.token.clone();
        }
        *self.held.lock().unwrap_or_else(PoisonError::into_inner) = grant;
    }

    /// One attempt. `Err(holder)` names who holds it.
    pub async fn try_acquire(&self) -> Result<Result<LeaseGrant, LeaseHolder>, LeaseStoreError> {
        let request = self.request.clone().with_retry_token(self.token());
        let answer = self
            .store
            .try_acquire_kind(self.kind, &self.name, request)
            .await;
        match answer {
            Ok(Acquisition::Taken(grant) | Acquisition::Renewed(grant)) => {
                self.remember(Some(grant.clone()));
                Ok(Ok(grant))
            }
            Ok(Acquisition::HeldByOther(holder)) => {
                self.remember(None);
                Ok(Err(holder))
            }
            Err(error) => {
                // Not confirmed: never believed held.
                self.remember(None);
                Err(error)
            }
        }
    }

    /// Non-blocking: one attempt. Blocking: attempts with jittered, doubling back-off until it
    /// is held or `wait` has passed (`None`: forever). `Ok(false)` when not held; a backend
    /// error ends the wait at once.
    pub async fn acquire(
        &self,
        blocking: bool,
        wait: Option<Duration>,
    ) -> Result<bool, LeaseStoreError> {
        Ok(self.acquire_or_holder(blocking, wait).await?.is_ok())
    }

    async fn acquire_or_holder(
        &self,
        blocking: bool,
        wait: Option<Duration>,
    ) -> Result<Result<LeaseGrant, LeaseHolder>, LeaseStoreError> {
        let deadline = wait.map(|wait| Instant::now() + wait);
        let mut backoff = FIRST_BACKOFF;
        loop {
            let attempt = self.try_acquire().await?;
            if attempt.is_ok() || !blocking {
                return Ok(attempt);
            }
            let mut pause = jittered(backoff);
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(attempt);
                }
                pause = pause.min(left);
            }
            tokio::time::sleep(pause).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Extends it from now by `ttl` (`None`: the TTL it was last given). `false` when it expired
    /// or moved on.
    pub async fn refresh(&self, ttl: Option<Duration>) -> Result<bool, LeaseStoreError> {
        let grant = self
            .store
            .refresh_kind(self.kind, &self.name, &self.token(), ttl)
            .await;
        match grant {
            Ok(grant) => {
                let refreshed = grant.is_some();
                self.remember(grant);
                Ok(refreshed)
            }
            Err(error) => {
                self.remember(None);
                Err(error)
            }
        }
    }

    /// Ends it. `false` when it had already expired or moved on; never ends someone else's.
    pub async fn release(&self) -> Result<bool, LeaseStoreError> {
        self.remember(None);
        self.store
            .release_kind(self.kind, &self.name, &self.token())
            .await
    }

    /// Acquires (as [`acquire`](Lease::acquire)) and hands back a guard that releases it.
    pub async fn guard(
        self,
        blocking: bool,
        wait: Option<Duration>,
    ) -> Result<LeaseGuard, LeaseGuardError> {
        match self.acquire_or_holder(blocking, wait).await? {
            Ok(_) => Ok(LeaseGuard { lease: Some(self) }),
            Err(holder) => Err(LeaseGuardError::LeaseNotAcquired {
                name: self.name,
                holder: Some(holder),
            }),
        }
    }
}

/// Full jitter in the upper half: a pause between `backoff / 2` and `backoff`.
fn jittered(backoff: Duration) -> Duration {
    let half = backoff / 2;
    half + half.mul_f64(rand::thread_rng().r#gen::<f64>())
}

/// A held lease that is released when the scope ends. Prefer [`LeaseGuard::release`] (it
/// waits for the store and says whether it was still held); dropping the guard releases it
/// best-effort in a spawned task (nothing to release it with outside a tokio runtime: it then
/// simply runs out).
#[derive(Debug)]
pub struct LeaseGuard {
    lease: Option<Lease>,
}

impl LeaseGuard {
    /// The lease it holds.
    pub fn lease(&self) -> &Lease {
        self.lease
            .as_ref()
            .expect("a LeaseGuard holds its lease until release or drop")
    }

    /// The fence it was acquired with (see [`Lease::fence`]).
    pub fn fence(&self) -> Option<u64> {
        self.lease().fence()
    }

    /// Extends it from now (see [`Lease::refresh`]).
    pub async fn refresh(&self, ttl: Option<Duration>) -> Result<bool, LeaseStoreError> {
        self.lease().refresh(ttl).await
    }

    /// Releases it now. `false` when it had already expired or moved on.
    pub async fn release(mut self) -> Result<bool, LeaseStoreError> {
        match self.lease.take() {
            Some(lease) => lease.release().await,
            None => Ok(false),
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = lease.release().await {
                        warn!(name = %lease.name, "lease guard dropped: release failed ({error}); it runs out by itself");
                    }
                });
            }
            Err(_) => warn!(
                name = %lease.name,
                "lease guard dropped outside a tokio runtime: not released; it runs out by itself"
            ),
        }
    }
}

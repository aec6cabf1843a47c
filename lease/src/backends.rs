//! Lease backends by URL: `memory`, `sqlite:PATH[?busy_timeout_ms=N]`, `postgres://...`
//! (or `postgresql://`), `redis://...`. [`LeaseBackends`] opens each URL once and hands out the
//! same store for it afterwards, so a call can name another backend than the configured one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::postgres::PostgresLeaseStore;
use crate::redis::RedisLeaseStore;
use crate::sqlite::{DEFAULT_BUSY_TIMEOUT, SqliteLeaseStore};
use crate::store::{LeaseStore, LeaseStoreError, MemoryLeaseStore};

/// A parsed backend URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendUrl {
    /// `memory`: this process only.
    Memory,
    /// `sqlite:PATH[?busy_timeout_ms=N]`: every process on the host that opens the file.
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// How long an attempt waits for another connection's write lock.
        busy_timeout: Duration,
    },
    /// `postgres://...` or `postgresql://...`, as given.
    Postgres(String),
    /// `redis://...`, as given.
    Redis(String),
}

impl BackendUrl {
    /// Parses `url`, or says what is wrong with it ([`LeaseStoreError::BadBackend`]).
    pub fn parse(url: &str) -> Result<BackendUrl, LeaseStoreError> {
        let bad = |message: &str| LeaseStoreError::BadBackend {
            url: url.to_owned(),
            message: message.to_owned(),
        };
        let url = url.trim();
        if url == "memory" {
            return Ok(BackendUrl::Memory);
        }
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let rest = rest.strip_prefix("//").unwrap_or(rest);
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            if path.is_empty() {
                return Err(bad(
                    "give a file, e.g. sqlite:/var/lib/station-gateway/lease.db",
                ));
            }
            let mut busy_timeout = DEFAULT_BUSY_TIMEOUT;
            for pair in query.split('&').filter(|pair| !pair.is_empty()) {
                match pair.split_once('=') {
                    Some(("busy_timeout_ms", value)) => {
                        let ms = value
                            .parse::<u64>()
                            .map_err(|_| bad("busy_timeout_ms must be a whole number"))?;
                        busy_timeout = Duration::from_millis(ms);
                    }
                    _ => return Err(bad("the only option is ?busy_timeout_ms=N")),
                }
            }
            return Ok(BackendUrl::Sqlite {
                path: PathBuf::from(path),
                busy_timeout,
            });
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(BackendUrl::Postgres(url.to_owned()));
        }
        if url.starts_with("redis://") {
            return Ok(BackendUrl::Redis(url.to_owned()));
        }
        Err(bad(
            "not a known backend: memory, sqlite:PATH, postgres://..., or redis://...",
        ))
    }

    /// Whether leases in it outlive this process (and may be shared with others).
    pub fn is_shared(&self) -> bool {
        !matches!(self, BackendUrl::Memory)
    }

    /// Opens a new store (SQLite opens the file now; Postgres and Redis connect on first use).
    pub async fn open(&self) -> Result<Arc<dyn LeaseStore>, LeaseStoreError> {
        Ok(match self {
            BackendUrl::Memory => Arc::new(MemoryLeaseStore::new()),
            BackendUrl::Sqlite { path, busy_timeout } => {
                Arc::new(SqliteLeaseStore::open_async(path.clone(), *busy_timeout).await?)
            }
            BackendUrl::Postgres(url) => Arc::new(PostgresLeaseStore::new(url)?),
            BackendUrl::Redis(url) => Arc::new(RedisLeaseStore::new(url)?),
        })
    }
}

/// The stores this process has opened, by URL; the configured one is the default.
pub struct LeaseBackends {
    default_url: String,
    default_store: Arc<dyn LeaseStore>,
    opened: tokio::sync::Mutex<HashMap<String, Arc<dyn LeaseStore>>>,
}

impl LeaseBackends {
    /// Opens the default backend `url`.
    pub async fn open(url: &str) -> Result<LeaseBackends, LeaseStoreError> {
        let default_store = BackendUrl::parse(url)?.open().await?;
        let opened = HashMap::from([(url.trim().to_owned(), default_store.clone())]);
        Ok(LeaseBackends {
            default_url: url.trim().to_owned(),
            default_store,
            opened: tokio::sync::Mutex::new(opened),
        })
    }

    /// `store` as the configured backend, named `url` (a test's or a simulation's store, say:
    /// `url` says whether others share it, as for an opened one).
    pub fn with_store(url: &str, store: Arc<dyn LeaseStore>) -> LeaseBackends {
        let opened = HashMap::from([(url.trim().to_owned(), store.clone())]);
        LeaseBackends {
            default_url: url.trim().to_owned(),
            default_store: store,
            opened: tokio::sync::Mutex::new(opened),
        }
    }

    /// The configured backend.
    pub fn default_store(&self) -> Arc<dyn LeaseStore> {
        self.default_store.clone()
    }

    /// The configured backend's URL, trimmed.
    pub fn default_url(&self) -> &str {
        &self.default_url
    }

    /// The store for `url` (`None`: the default), opened on first use.
    pub async fn store(&self, url: Option<&str>) -> Result<Arc<dyn LeaseStore>, LeaseStoreError> {
        let Some(url) = url.map(str::trim).filter(|url| *url != self.default_url) else {
            return Ok(self.default_store.clone());
        };
        let mut opened = self.opened.lock().await;
        if let Some(store) = opened.get(url) {
            return Ok(store.clone());
        }
        let store = BackendUrl::parse(url)?.open().await?;
        opened.insert(url.to_owned(), store.clone());
        Ok(store)
    }
}

impl std::fmt::Debug for LeaseBackends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBackends")
            .field("default_url", &self.default_url)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_urls_parse_or_say_what_is_wrong() {
        assert_eq!(BackendUrl::parse("memory").unwrap(), BackendUrl::Memory);
        assert_eq!(
            BackendUrl::parse("sqlite:/tmp/x.db?busy_timeout_ms=250").unwrap(),
            BackendUrl::Sqlite {
                path: "/tmp/x.db".into(),
                busy_timeout: Duration::from_millis(250)
            }
        );
        assert!(matches!(
            BackendUrl::parse("sqlite:///tmp/x.db").unwrap(),
            BackendUrl::Sqlite { path, .. } if path == std::path::Path::new("/tmp/x.db")
        ));
        assert!(matches!(
            BackendUrl::parse("postgres://postgres@127.0.0.1/test").unwrap(),
            BackendUrl::Postgres(_)
        ));
        assert!(matches!(
            BackendUrl::parse("redis://127.0.0.1:6379").unwrap(),
            BackendUrl::Redis(_)
        ));
        for bad in ["mysql://x", "sqlite:", "sqlite:/x?wal=1", ""] {
            let error = BackendUrl::parse(bad).unwrap_err().to_string();
            assert!(error.contains("cannot be used"), "{bad}: {error}");
        }
    }
}

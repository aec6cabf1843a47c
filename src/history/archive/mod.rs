//! The archive in PostgreSQL (`[history] archive`): the table's SQL (`schema`), a sample as
//! a row (`rows`), the writer task (`writer`), and [`ArchiveReader`], which a query asks for
//! the times memory no longer holds.

pub mod rows;
pub mod schema;
pub mod writer;

use std::time::Duration;

use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::history::ring::Sample;
use rows::sample_of;
use schema::select_range;

/// How long a query waits for the archive before it answers 503.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the archive could not answer a query.
#[derive(Debug, thiserror::Error)]
#[error("the history archive cannot be read: {0}")]
pub struct ArchiveUnavailable(pub String);

/// The query side of the archive: a connection of its own, made when first needed and again
/// after it broke.
pub struct ArchiveReader {
    url: String,
    table: String,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for ArchiveReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveReader")
            .field("table", &self.table)
            .finish()
    }
}

impl ArchiveReader {
    pub fn new(url: String, table: String) -> ArchiveReader {
        ArchiveReader {
            url,
            table,
            client: Mutex::new(None),
        }
    }

    /// `channel`'s samples in `[from_ms, to_ms)` with the one before, in time order.
    pub async fn range(
        &self,
        channel: &str,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<Sample>, ArchiveUnavailable> {
        let read = async {
            let mut client = self.client.lock().await;
            if client.as_ref().is_none_or(Client::is_closed) {
                *client = Some(
                    writer::connect(&self.url, &self.table)
                        .await
                        .map_err(|error| ArchiveUnavailable(error.to_string()))?,
                );
            }
            let Some(connected) = client.as_ref() else {
                return Err(ArchiveUnavailable("no connection".into()));
            };
            let rows = connected
                .query(
                    &select_range(&self.table),
                    &[&channel, &(from_ms as f64), &(to_ms as f64)],
                )
                .await
                .map_err(|error| {
                    *client = None;
                    ArchiveUnavailable(error.to_string())
                })?;
            Ok(rows
                .iter()
                .map(|row| sample_of(row.get(0), row.get(1), row.get(2), row.get(3)))
                .collect())
        };
        match tokio::time::timeout(QUERY_TIMEOUT, read).await {
            Ok(answer) => answer,
            Err(_) => Err(ArchiveUnavailable(format!(
                "no answer within {} s",
                QUERY_TIMEOUT.as_secs()
            ))),
        }
    }
}

//! The archive's table, in SQL: one table partitioned by day (declarative partitioning), a
//! BRIN index on time, a B-tree on (channel, time) for one channel's range; partition names
//! and which ones retention drops. Pure: the text of every statement, tested without a
//! database.
//!
//! The same table can be a TimescaleDB hypertable instead, where that extension is installed:
//! create it unpartitioned (the `CREATE TABLE` below without `PARTITION BY`), then
//! `SELECT create_hypertable('history_samples', 't', chunk_time_interval => INTERVAL '1 day');`
//! and `SELECT add_retention_policy('history_samples', INTERVAL '30 days');` — the gateway's
//! COPY and queries are the same.

use time::{Date, OffsetDateTime};

pub const DAY_MS: u64 = 86_400_000;

/// Status codes in the table's `status` column.
pub const STATUS_OK: i16 = 0;
pub const STATUS_READ_ERROR: i16 = 1;
pub const STATUS_NOT_REACHED: i16 = 2;
pub const STATUS_GATEWAY_STOPPED: i16 = 3;

/// Whether `name` may be the table's name: a plain lower-case SQL identifier (it is written
/// into statements, never bound).
pub fn valid_table_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The statements that make the table and its indexes (idempotent).
pub fn create_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\
           channel text NOT NULL, \
           t timestamptz NOT NULL, \
           status smallint NOT NULL, \
           value double precision, \
           text_value text\
         ) PARTITION BY RANGE (t); \
         CREATE INDEX IF NOT EXISTS {table}_t_brin ON {table} USING brin (t); \
         CREATE INDEX IF NOT EXISTS {table}_channel_t ON {table} (channel, t);"
    )
}

/// The day (days since the Unix epoch) of `t_ms`.
pub fn day_of(t_ms: u64) -> i64 {
    (t_ms / DAY_MS) as i64
}

fn date_of(day: i64) -> Date {
    OffsetDateTime::from_unix_timestamp(day * 86_400)
        .map(|at| at.date())
        .unwrap_or(Date::MIN)
}

fn iso(date: Date) -> String {
    format!(
        "{:04}-{:02}-{:02}",
        date.year(),
        u8::from(date.month()),
        date.day()
    )
}

/// The partition holding `day`: `{table}_dYYYYMMDD`.
pub fn partition_name(table: &str, day: i64) -> String {
    format!("{table}_d{}", iso(date_of(day)).replace('-', ""))
}

/// The statement that makes `day`'s partition (idempotent).
pub fn create_partition(table: &str, day: i64) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} PARTITION OF {table} FOR VALUES FROM ('{} 00:00:00+00') TO ('{} 00:00:00+00')",
        partition_name(table, day),
        iso(date_of(day)),
        iso(date_of(day + 1))
    )
}

/// The table's partitions, by name.
pub fn list_partitions() -> &'static str {
    "SELECT c.relname::text FROM pg_inherits i \
     JOIN pg_class c ON c.oid = i.inhrelid \
     JOIN pg_class p ON p.oid = i.inhparent \
     WHERE p.relname = $1"
}

/// The partitions among `names` whose whole day is older than `retention_days` before
/// `today`: kept are today and the `retention_days` days before it.
pub fn partitions_to_drop(
    names: &[String],
    table: &str,
    today: i64,
    retention_days: u32,
) -> Vec<String> {
    let oldest_kept = today - i64::from(retention_days);
    names
        .iter()
        .filter(|name| {
            name.strip_prefix(&format!("{table}_d"))
                .and_then(day_of_suffix)
                .is_some_and(|day| day < oldest_kept)
        })
        .cloned()
        .collect()
}

/// `YYYYMMDD` as a day since the epoch.
fn day_of_suffix(suffix: &str) -> Option<i64> {
    if suffix.len() != 8 || !suffix.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let year: i32 = suffix[0..4].parse().ok()?;
    let month: u8 = suffix[4..6].parse().ok()?;
    let day: u8 = suffix[6..8].parse().ok()?;
    let date = Date::from_calendar_date(year, time::Month::try_from(month).ok()?, day).ok()?;
    Some(
        date.to_julian_day() as i64
            - Date::from_calendar_date(1970, time::Month::January, 1)
                .ok()?
                .to_julian_day() as i64,
    )
}

/// One channel's samples in `[$2, $3)` (ms since the epoch) in time order, preceded by the last
/// one before `$2`.
pub fn select_range(table: &str) -> String {
    format!(
        "(SELECT (extract(epoch FROM t) * 1000)::int8 AS t_ms, status, value, text_value FROM {table} \
           WHERE channel = $1 AND t < to_timestamp($2::float8 / 1000) ORDER BY t DESC LIMIT 1) \
         UNION ALL \
         (SELECT (extract(epoch FROM t) * 1000)::int8 AS t_ms, status, value, text_value FROM {table} \
           WHERE channel = $1 AND t >= to_timestamp($2::float8 / 1000) AND t < to_timestamp($3::float8 / 1000) \
           ORDER BY t) \
         ORDER BY t_ms"
    )
}

/// The COPY statement the writer streams its rows into.
pub fn copy_in(table: &str) -> String {
    format!("COPY {table} (channel, t, status, value, text_value) FROM STDIN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_named_and_bounded_by_their_utc_day() {
        let day = day_of(1_764_583_200_000); // 2025-12-01T10:00:00Z
        assert_eq!(
            partition_name("history_samples", day),
            "history_samples_d20251201"
        );
        assert_eq!(
            create_partition("h", day),
            "CREATE TABLE IF NOT EXISTS h_d20251201 PARTITION OF h FOR VALUES FROM ('2025-12-01 00:00:00+00') TO ('2025-12-02 00:00:00+00')"
        );
        assert_eq!(day_of_suffix("20251201"), Some(day));
    }

    #[test]
    fn retention_drops_whole_days_older_than_it_and_nothing_else() {
        let today = day_of(1_764_583_200_000);
        let names: Vec<String> = [today - 31, today - 30, today - 29, today]
            .iter()
            .map(|day| partition_name("h", *day))
            .chain(["h_default".to_owned(), "other_d20200101".to_owned()])
            .collect();
        assert_eq!(
            partitions_to_drop(&names, "h", today, 30),
            [partition_name("h", today - 31)]
        );
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(valid_table_name("history_samples"));
        assert!(valid_table_name("_t1"));
        for bad in ["", "History", "a;drop", "1abc", "a b", "a\"b"] {
            assert!(!valid_table_name(bad), "{bad}");
        }
    }
}

//! The archive's tables, in SQL: the samples in one table partitioned by day (declarative
//! partitioning), a BRIN index on time, a B-tree on (channel, time) for one channel's range;
//! beside it `{table}_minutes`, one row per channel and minute summing up that minute's
//! samples, partitioned by day the same way; partition names and which ones retention drops.
//! Pure: the text of every statement, tested without a database.
//!
//! The same table can be a TimescaleDB hypertable instead, where that extension is installed:
//! create it unpartitioned (the `CREATE TABLE` below without `PARTITION BY`), then
//! `SELECT create_hypertable('history_samples', 't', chunk_time_interval => INTERVAL '1 day');`
//! and `SELECT add_retention_policy('history_samples', INTERVAL '30 days');` — the gateway's
//! COPY and queries are the same. The minutes table is then TimescaleDB's continuous
//! aggregate (see [`create_table`] for the columns and ARCHITECTURE.md for the view).

use time::{Date, OffsetDateTime};

pub const DAY_MS: u64 = 86_400_000;

/// Status codes in the table's `status` column.
pub const STATUS_OK: i16 = 0;
pub const STATUS_READ_ERROR: i16 = 1;
pub const STATUS_NOT_REACHED: i16 = 2;
pub const STATUS_GATEWAY_STOPPED: i16 = 3;

/// Whether `name` may be the table's name (the rule lives with `[history]`'s other checks).
pub use crate::config::valid_table_name;

/// The per-minute table beside `table`.
pub fn minutes_table(table: &str) -> String {
    format!("{table}_minutes")
}

/// The table of settings beside `table`: `minutes_from` (ms since the epoch) is where the
/// minutes begin to sum up every sample — 0 for an archive made with them, the time they were
/// added to one made before them (its older samples have no minutes; a query reaching back
/// before it reads samples).
pub fn meta_table(table: &str) -> String {
    format!("{table}_meta")
}

/// Where the minutes begin (see [`meta_table`]).
pub fn select_minutes_from(table: &str) -> String {
    format!(
        "SELECT ms FROM {} WHERE key = 'minutes_from'",
        meta_table(table)
    )
}

/// The statements that make the tables and their indexes (idempotent).
///
/// `{table}_batches` keeps the id of every batch written (and when), so that a batch written
/// again — its commit's answer was lost, so the writer spooled it — is taken once.
///
/// A row of `{table}_minutes` sums up one channel's samples of one minute (`minute`, its
/// start): `n` samples with a value (numbers and texts), `n_num` of them numbers, their `sum`,
/// the smallest (`min`, at `min_ms` into the minute, the earliest of equals) and the largest
/// (`max`, `max_ms`), the first and the last sample with a value (`first_ms`, `first_value`
/// or `first_text`; `last_…`). `n_irregular` counts the samples without a value (read error,
/// station not reached, gateway stopped) or with a number that is not finite: a minute with
/// any is answered from its samples, so a gap is never summed over.
pub fn create_table(table: &str) -> String {
    let minutes = minutes_table(table);
    let meta = meta_table(table);
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\
           channel text NOT NULL, \
           t timestamptz NOT NULL, \
           status smallint NOT NULL, \
           value double precision, \
           text_value text\
         ) PARTITION BY RANGE (t); \
         CREATE INDEX IF NOT EXISTS {table}_t_brin ON {table} USING brin (t); \
         CREATE INDEX IF NOT EXISTS {table}_channel_t ON {table} (channel, t); \
         CREATE TABLE IF NOT EXISTS {minutes} (\
           channel text NOT NULL, \
           minute timestamptz NOT NULL, \
           n integer NOT NULL, \
           n_num integer NOT NULL, \
           sum double precision NOT NULL, \
           min double precision, \
           min_ms integer, \
           max double precision, \
           max_ms integer, \
           first_ms integer, \
           first_value double precision, \
           first_text text, \
           last_ms integer, \
           last_value double precision, \
           last_text text, \
           n_irregular integer NOT NULL, \
           PRIMARY KEY (channel, minute)\
         ) PARTITION BY RANGE (minute); \
         CREATE TABLE IF NOT EXISTS {table}_batches (id text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now()); \
         CREATE TABLE IF NOT EXISTS {meta} (key text PRIMARY KEY, ms int8 NOT NULL); \
         INSERT INTO {meta} (key, ms) VALUES ('minutes_from', \
           CASE WHEN EXISTS (SELECT 1 FROM {table}) \
             THEN (extract(epoch FROM now()) * 1000)::int8 ELSE 0 END) \
         ON CONFLICT (key) DO NOTHING;"
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

/// The statements that make `day`'s partitions of the samples and of the minutes
/// (idempotent).
pub fn create_partition(table: &str, day: i64) -> String {
    [table, &minutes_table(table)]
        .map(|parent| {
            format!(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF {parent} FOR VALUES FROM ('{} 00:00:00+00') TO ('{} 00:00:00+00');",
                partition_name(parent, day),
                iso(date_of(day)),
                iso(date_of(day + 1))
            )
        })
        .join(" ")
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

/// One channel's minute rows with `minute` in `[$2, $3)` (ms since the epoch), in time order:
/// the minute's start in ms, then the columns from `n` on.
pub fn select_minutes(table: &str) -> String {
    format!(
        "SELECT (extract(epoch FROM minute) * 1000)::int8, n, n_num, sum, min, min_ms, max, max_ms, \
           first_ms, first_value, first_text, last_ms, last_value, last_text, n_irregular \
         FROM {} WHERE channel = $1 AND minute >= to_timestamp($2::float8 / 1000) \
           AND minute < to_timestamp($3::float8 / 1000) ORDER BY minute",
        minutes_table(table)
    )
}

/// One channel's samples in the windows `[$2[i], $3[i])` (ms since the epoch; apart, in time
/// order), in time order, preceded by the last one before `$4`.
pub fn select_windows(table: &str) -> String {
    format!(
        "(SELECT (extract(epoch FROM t) * 1000)::int8 AS t_ms, status, value, text_value FROM {table} \
           WHERE channel = $1 AND t < to_timestamp($4::float8 / 1000) ORDER BY t DESC LIMIT 1) \
         UNION ALL \
         (SELECT (extract(epoch FROM s.t) * 1000)::int8 AS t_ms, s.status, s.value, s.text_value \
           FROM unnest($2::float8[], $3::float8[]) AS w(a, b) \
           JOIN {table} s ON s.channel = $1 AND s.t >= to_timestamp(w.a / 1000) \
             AND s.t < to_timestamp(w.b / 1000)) \
         ORDER BY t_ms"
    )
}

/// Merges one batch's minute rows (as arrays, one a column, in `upsert_minutes`' order:
/// channel, minute in ms, then `n` … `n_irregular`) into `{table}_minutes`: counts and sums
/// add up, an extreme is replaced by a smaller (larger) one or an equal one earlier, the first
/// by an earlier one, the last by a later one (or one at the same time, written later).
pub fn upsert_minutes(table: &str) -> String {
    let minutes = minutes_table(table);
    let pick = |columns: &[&str], when: &str| {
        columns
            .iter()
            .map(|c| format!("{c} = CASE WHEN {when} THEN EXCLUDED.{c} ELSE r.{c} END"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "INSERT INTO {minutes} AS r (channel, minute, n, n_num, sum, min, min_ms, max, max_ms, \
           first_ms, first_value, first_text, last_ms, last_value, last_text, n_irregular) \
         SELECT c, to_timestamp(m::float8 / 1000), n, nn, s, mi, mit, ma, mat, ft, fv, fx, lt, lv, lx, ni \
         FROM unnest($1::text[], $2::int8[], $3::int4[], $4::int4[], $5::float8[], $6::float8[], \
           $7::int4[], $8::float8[], $9::int4[], $10::int4[], $11::float8[], $12::text[], $13::int4[], \
           $14::float8[], $15::text[], $16::int4[]) \
           AS u(c, m, n, nn, s, mi, mit, ma, mat, ft, fv, fx, lt, lv, lx, ni) \
         ON CONFLICT (channel, minute) DO UPDATE SET \
           n = r.n + EXCLUDED.n, n_num = r.n_num + EXCLUDED.n_num, sum = r.sum + EXCLUDED.sum, \
           n_irregular = r.n_irregular + EXCLUDED.n_irregular, {}, {}, {}, {}",
        pick(
            &["min", "min_ms"],
            "r.min IS NULL OR EXCLUDED.min < r.min OR (EXCLUDED.min = r.min AND EXCLUDED.min_ms < r.min_ms)"
        ),
        pick(
            &["max", "max_ms"],
            "r.max IS NULL OR EXCLUDED.max > r.max OR (EXCLUDED.max = r.max AND EXCLUDED.max_ms < r.max_ms)"
        ),
        pick(
            &["first_ms", "first_value", "first_text"],
            "r.first_ms IS NULL OR EXCLUDED.first_ms < r.first_ms"
        ),
        pick(
            &["last_ms", "last_value", "last_text"],
            "r.last_ms IS NULL OR EXCLUDED.last_ms >= r.last_ms"
        ),
    )
}

/// Claims batch `$1` in the batch's transaction: no row when the archive took it before (its
/// commit's answer was lost, and it came again from the spool).
pub fn claim_batch(table: &str) -> String {
    format!("INSERT INTO {table}_batches (id) VALUES ($1) ON CONFLICT (id) DO NOTHING")
}

/// Forgets the ids of batches taken more than `$1` days ago (with retention).
pub fn forget_batches(table: &str) -> String {
    format!("DELETE FROM {table}_batches WHERE at < now() - make_interval(days => $1)")
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
            "CREATE TABLE IF NOT EXISTS h_d20251201 PARTITION OF h FOR VALUES FROM ('2025-12-01 00:00:00+00') TO ('2025-12-02 00:00:00+00'); \
             CREATE TABLE IF NOT EXISTS h_minutes_d20251201 PARTITION OF h_minutes FOR VALUES FROM ('2025-12-01 00:00:00+00') TO ('2025-12-02 00:00:00+00');"
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
        // The minutes' partitions are the minutes table's, by the same rule.
        let minutes: Vec<String> = [today - 31, today]
            .iter()
            .map(|day| partition_name("h_minutes", *day))
            .collect();
        assert_eq!(
            partitions_to_drop(&minutes, "h_minutes", today, 30),
            [partition_name("h_minutes", today - 31)]
        );
        assert!(partitions_to_drop(&minutes, "h", today, 30).is_empty());
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

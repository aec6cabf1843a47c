//! The value history's archive on PostgreSQL: samples written with COPY and read back after a
//! restart, nothing lost across a database outage (a proxy that stalls the connection) while
//! reads go on unaffected, retention dropping old day partitions. Needs PostgreSQL
//! (`tests/common/backends.rs`): fails, naming it, when it cannot be reached.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::backends::{drop_history_tables, history_postgres, history_table, unix_ms_now};
use common::proxy::StallingProxy;
use common::{VMON1, config_for, default_simulator, rig_on, start_gateway, until, within};
use serde_json::Value as Json;
use station_gateway::history::archive::schema;
use station_gateway::history::archive::writer;
use station_gateway::history::recorder::ArchivedSample;
use station_gateway::history::ring::{Sample, SampleValue};

fn spool_path(table: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("station-gateway-{table}.spool"))
}

async fn rows(client: &tokio_postgres::Client, table: &str) -> i64 {
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

async fn history(base: &str, query: &str) -> Json {
    let response = reqwest::get(format!("{base}/v1/history?{query}"))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

#[tokio::test]
async fn samples_are_archived_and_a_restart_reads_them_back() {
    let (url, client) = history_postgres().await;
    let table = history_table("restart");
    let sim = default_simulator().await;
    let config = config_for(&sim, |c| {
        c.history.channels = vec![VMON1.into()];
        c.history.interval_ms = 20;
        c.history.archive = url.clone();
        c.history.archive_table = table.clone();
        c.history.spool = spool_path(&table);
    });
    let rig = rig_on(sim, config.clone(), false).await;
    let recorder = rig.gateway.gateway.history.clone().unwrap();
    until(Duration::from_secs(10), "20 samples archived", || {
        recorder.counters.archived.load(Ordering::Relaxed) >= 20
    })
    .await;
    let base = rig.gateway.base_url();
    let before = history(&base, &format!("channel={VMON1}&from=-1h&fn=raw")).await;
    rig.gateway.stop().await;
    let recorded = recorder.counters.recorded.load(Ordering::Relaxed);
    assert_eq!(recorder.counters.dropped.load(Ordering::Relaxed), 0);
    assert_eq!(
        rows(&client, &table).await,
        recorded as i64,
        "every recorded sample is in the archive after a stop"
    );

    // A new gateway has nothing in memory: the query is answered from the archive.
    let mut config = config;
    config.history.channels.clear();
    let gateway = start_gateway(config).await;
    let after = history(
        &gateway.base_url(),
        &format!("channel={VMON1}&from=-1h&fn=raw"),
    )
    .await;
    let times = |body: &Json| -> Vec<String> {
        body["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["t"].as_str().unwrap().to_owned())
            .collect()
    };
    let gaps = after["gaps"].as_array().unwrap();
    assert!(
        gaps.iter().any(|gap| gap["why"] == "gateway stopped"),
        "the stop is a gap: {after}"
    );
    let (before, after) = (times(&before), times(&after));
    assert!(before.len() >= 20, "{before:?}");
    assert!(
        before.iter().all(|t| after.contains(t)),
        "every sample seen before the restart is there after it"
    );
    gateway.stop().await;
    drop_history_tables(&client, &table).await;
}

#[tokio::test]
async fn a_database_outage_loses_no_sample_and_never_slows_a_read() {
    // Longer than the writer's database timeout (5 s), so that it gives up and spools;
    // HISTORY_OUTAGE_SECONDS=60 for the outage BENCHMARKS.md reports.
    let outage = Duration::from_secs(
        std::env::var("HISTORY_OUTAGE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(8),
    );
    let (url, client) = history_postgres().await;
    let (database, proxied_url) = through_proxy(&url);
    let proxy = StallingProxy::start(database).await;
    let table = history_table("outage");
    let spool = spool_path(&table);
    let sim = default_simulator().await;
    let config = config_for(&sim, |c| {
        c.history.channels = vec!["*".into()];
        c.history.interval_ms = 20;
        c.history.archive = proxied_url(proxy.addr);
        c.history.archive_table = table.clone();
        c.history.spool = spool.clone();
    });
    let rig = rig_on(sim, config, false).await;
    let recorder = rig.gateway.gateway.history.clone().unwrap();
    until(Duration::from_secs(10), "samples archived", || {
        recorder.counters.archived.load(Ordering::Relaxed) >= 50
    })
    .await;

    proxy.set_stalled(true);
    let stalled_at = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut reads = 0;
    while stalled_at.elapsed() < outage {
        let started = Instant::now();
        let (status, body) = rig.read(VMON1).await;
        assert_eq!(status, 200, "{body}");
        slowest = slowest.max(started.elapsed());
        reads += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spooled = recorder.counters.spooled.load(Ordering::Relaxed);
    proxy.set_stalled(false);
    println!(
        "outage {outage:?}: {reads} reads, the slowest {slowest:?}; {spooled} samples spooled"
    );
    assert!(
        slowest < Duration::from_millis(500),
        "a read took {slowest:?} while the database was stalled"
    );
    assert!(
        spooled > 0,
        "nothing was spooled during a {outage:?} outage"
    );

    // Caught up: the spool is written out once the database answers again.
    within(
        Duration::from_secs(60),
        "the spool to be caught up",
        async {
            while std::fs::metadata(&spool).is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
    rig.gateway.stop().await;
    let recorded = recorder.counters.recorded.load(Ordering::Relaxed);
    assert_eq!(recorder.counters.dropped.load(Ordering::Relaxed), 0);
    let archived = rows(&client, &table).await;
    println!("recorded {recorded}, in the archive {archived}");
    assert_eq!(
        archived, recorded as i64,
        "{recorded} recorded, {archived} in the archive: samples were lost or written twice"
    );
    let distinct: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM (SELECT DISTINCT channel, t, status FROM {table}) d"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(distinct, recorded as i64, "every recorded sample, once");
    drop_history_tables(&client, &table).await;
}

/// The database's TCP address in `url`, and `url` with that address replaced by another's.
fn through_proxy(
    url: &str,
) -> (
    std::net::SocketAddr,
    impl Fn(std::net::SocketAddr) -> String,
) {
    use std::net::ToSocketAddrs;
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => panic!("the outage test needs PostgreSQL over TCP; {url} is not"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = (host.as_str(), port)
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap();
    let user = config.get_user().unwrap_or("postgres").to_owned();
    let password = config
        .get_password()
        .map(|p| format!(":{}", String::from_utf8_lossy(p)))
        .unwrap_or_default();
    let dbname = config.get_dbname().unwrap_or("postgres").to_owned();
    (database, move |proxy| {
        format!("postgres://{user}{password}@{proxy}/{dbname}")
    })
}

#[tokio::test]
async fn retention_drops_the_partitions_older_than_it() {
    let (url, client) = history_postgres().await;
    let table = history_table("retention");
    let writer_client = writer::connect(&url, &table).await.unwrap();
    let now_ms = unix_ms_now();
    let day = schema::DAY_MS;
    let batch: Vec<ArchivedSample> = [40, 31, 30, 2, 0]
        .iter()
        .map(|days_ago| ArchivedSample {
            channel: "V".into(),
            sample: Sample {
                t_ms: now_ms - days_ago * day,
                value: SampleValue::Number(*days_ago as f64),
            },
        })
        .collect();
    let mut writer_client = writer_client;
    let mut made = Default::default();
    writer::copy_batch(
        &mut writer_client,
        &table,
        &batch,
        &writer::new_batch_id(),
        &mut made,
    )
    .await
    .unwrap();
    assert_eq!(rows(&client, &table).await, 5);
    assert_eq!(rows(&client, &schema::minutes_table(&table)).await, 5);
    let dropped = writer::drop_expired(&writer_client, &table, now_ms, 30)
        .await
        .unwrap();
    let today = schema::day_of(now_ms);
    let minutes = schema::minutes_table(&table);
    let mut expected = vec![
        schema::partition_name(&table, today - 40),
        schema::partition_name(&table, today - 31),
        schema::partition_name(&minutes, today - 40),
        schema::partition_name(&minutes, today - 31),
    ];
    let mut dropped_sorted = dropped.clone();
    dropped_sorted.sort();
    expected.sort();
    assert_eq!(dropped_sorted, expected);
    let left: Vec<f64> = client
        .query(&format!("SELECT value FROM {table} ORDER BY t"), &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(left, [30.0, 2.0, 0.0]);
    assert_eq!(
        rows(&client, &minutes).await,
        3,
        "the minutes go with their days"
    );
    drop_history_tables(&client, &table).await;
}

/// A known channel over three hours: a number every 0.7 s or so (quarters, so every sum is
/// exact), a stretch the station was not reached, a read error, a number that is not finite,
/// a gateway stop, texts; written in batches that split minutes, two of them out of order.
fn known_samples(base: u64) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut seed = 12_345u64;
    let mut t = base + 250;
    let minute = 60_000;
    while t < base + 180 * minute {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let value = match t - base {
            at if (30 * minute + 10_000..33 * minute + 40_000).contains(&at) => {
                SampleValue::NotReached
            }
            at if (100 * minute..101 * minute + 30_000).contains(&at) => {
                SampleValue::GatewayStopped
            }
            at if (120 * minute..120 * minute + 3_000).contains(&at) => {
                SampleValue::Text(format!("state {}", seed >> 62))
            }
            at if (50 * minute + 5_000..50 * minute + 5_800).contains(&at) => {
                SampleValue::ReadError
            }
            at if (70 * minute + 30_000..70 * minute + 30_800).contains(&at) => {
                SampleValue::Number(f64::NAN)
            }
            _ => SampleValue::Number(((seed >> 40) % 4_000) as f64 / 4.0 - 500.0),
        };
        let stopped = value == SampleValue::GatewayStopped;
        samples.push(Sample { t_ms: t, value });
        t += 600 + (seed >> 33) % 200;
        if stopped {
            // Nothing until the gateway runs again.
            t = t.max(base + 101 * minute + 30_000);
        }
    }
    samples
}

#[tokio::test]
async fn minutes_answer_every_fn_as_the_samples_do_across_edges_gaps_and_the_memory_seam() {
    use station_gateway::history::archive::ArchiveReader;
    use station_gateway::history::bucket::{Buckets, Reduce, reduce_in};
    use station_gateway::history::query::found;
    use station_gateway::history::recorder::{History, Limits, WallClock};
    let (url, client) = history_postgres().await;
    let table = history_table("minutes");
    let mut writer_client = writer::connect(&url, &table).await.unwrap();
    let now_ms = unix_ms_now();
    let minute = 60_000;
    let base = now_ms - now_ms % minute - 86_400_000;
    let samples = known_samples(base);
    assert!(
        samples
            .iter()
            .any(|s| matches!(s.value, SampleValue::Number(n) if n.is_nan()))
    );
    assert!(samples.iter().any(|s| s.value == SampleValue::ReadError));
    let mut batches: Vec<Vec<ArchivedSample>> = samples
        .chunks(97)
        .map(|chunk| {
            chunk
                .iter()
                .map(|sample| ArchivedSample {
                    channel: "V".into(),
                    sample: sample.clone(),
                })
                .collect()
        })
        .collect();
    batches.swap(3, 4);
    let mut made = Default::default();
    for batch in &batches {
        writer::copy_batch(
            &mut writer_client,
            &table,
            batch,
            &writer::new_batch_id(),
            &mut made,
        )
        .await
        .unwrap();
    }
    let reader = ArchiveReader::new(url, table.clone());
    let limits = Limits {
        samples_per_channel: 100_000,
        max_channels: 10,
        min_spacing_ms: 0,
    };
    let nothing_in_memory = History::new(limits, WallClock::now(), None);
    // Memory holds the newest part, from 97 min 12.345 s on (inside a minute).
    let seam = base + 97 * minute + 12_345;
    let recent = History::new(limits, WallClock::now(), None);
    for sample in samples.iter().filter(|s| s.t_ms >= seam) {
        recent.record("V", sample.t_ms, sample.value.clone());
    }
    let cases = [
        (base + 12_345, base + 180 * minute - 5_000, 7),
        (base + 12_345, base + 180 * minute - 5_000, 100),
        (base, base + 180 * minute, 180),
        (base + 29 * minute + 30_000, base + 35 * minute + 1, 3),
        (base + 95 * minute + 1, base + 125 * minute - 1, 13),
        (base + 119 * minute, base + 122 * minute, 1),
        // Buckets under a minute: samples only.
        (base + 95 * minute + 1, base + 100 * minute, 1_000),
    ];
    let mut by_minute = 0;
    for (from, to, points) in cases {
        for how in Reduce::ALL {
            let buckets = Buckets::new(from, to, points, how);
            let expected = reduce_in(&buckets, &samples, &[], how);
            for (memory, name) in [(&nothing_in_memory, "the archive"), (&recent, "the seam")] {
                let data = found(memory, Some(&reader), "V", &buckets)
                    .await
                    .unwrap()
                    .unwrap();
                if !data.minutes.is_empty() {
                    by_minute += 1;
                    assert!(buckets.by_minute && how != Reduce::Raw);
                }
                let answered = reduce_in(&buckets, &data.samples, &data.minutes, how);
                // Compared as written out, so that a NaN equals a NaN.
                let case = format!(
                    "{} over [{}, {}) in {points} from {name}",
                    how.name(),
                    from - base,
                    to - base
                );
                assert_eq!(
                    (answered.from_ms, answered.to_ms, answered.points.len()),
                    (expected.from_ms, expected.to_ms, expected.points.len()),
                    "{case}"
                );
                for (got, want) in answered.points.iter().zip(&expected.points) {
                    assert_eq!(format!("{got:?}"), format!("{want:?}"), "{case}");
                }
                assert_eq!(answered.gaps, expected.gaps, "{case}");
            }
        }
    }
    assert!(
        by_minute >= 30,
        "the minutes answered only {by_minute} queries"
    );
    // A minute with a gap is read as samples, never summed over.
    let irregular: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE n_irregular > 0",
                schema::minutes_table(&table)
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // 30:10 to 33:40 not reached, 50:05 a read error, 70:30 a NaN, 100:00 the gateway stopped.
    assert_eq!(irregular, 7);
    drop_history_tables(&client, &table).await;
}

#[tokio::test]
async fn an_archive_written_before_the_minutes_is_answered_from_its_samples() {
    use station_gateway::history::archive::ArchiveReader;
    use station_gateway::history::bucket::{Buckets, Reduce, reduce_in};
    let (url, client) = history_postgres().await;
    let table = history_table("upgrade");
    let now_ms = unix_ms_now();
    let minute = 60_000;
    let base = now_ms - now_ms % minute - 86_400_000;
    let samples = known_samples(base);
    // The table as the gateway made it before the minutes: samples only.
    let day = schema::day_of(base);
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (channel text NOT NULL, t timestamptz NOT NULL, \
               status smallint NOT NULL, value double precision, text_value text) \
             PARTITION BY RANGE (t); {}; {}",
            schema::create_partition(&table, day)
                .split(';')
                .next()
                .unwrap(),
            schema::create_partition(&table, day + 1)
                .split(';')
                .next()
                .unwrap(),
        ))
        .await
        .unwrap();
    let (mut times, mut statuses, mut values, mut texts) = (vec![], vec![], vec![], vec![]);
    for sample in &samples {
        let (status, value, text): (i16, Option<f64>, Option<String>) = match &sample.value {
            SampleValue::Number(n) => (0, Some(*n), None),
            SampleValue::Text(t) => (0, None, Some(t.clone())),
            SampleValue::ReadError => (1, None, None),
            SampleValue::NotReached => (2, None, None),
            SampleValue::GatewayStopped => (3, None, None),
        };
        times.push(sample.t_ms as f64);
        statuses.push(status);
        values.push(value);
        texts.push(text);
    }
    client
        .execute(
            &format!(
                "INSERT INTO {table} SELECT 'V', to_timestamp(t / 1000), s, v, x \
                 FROM unnest($1::float8[], $2::int2[], $3::float8[], $4::text[]) AS u(t, s, v, x)"
            ),
            &[&times, &statuses, &values, &texts],
        )
        .await
        .unwrap();
    // This gateway adds the minutes; the samples before have none.
    let reader = ArchiveReader::new(url, table.clone());
    for how in [Reduce::Mean, Reduce::MinMax, Reduce::Last] {
        let buckets = Buckets::new(base, base + 180 * minute, 30, how);
        let expected = reduce_in(&buckets, &samples, &[], how);
        let (found, minutes) = reader
            .by_minute("V", buckets.from_ms, buckets.to_ms)
            .await
            .unwrap();
        assert!(minutes.is_empty());
        let answered = reduce_in(&buckets, &found, &minutes, how);
        assert_eq!(
            format!("{answered:?}"),
            format!("{expected:?}"),
            "{}",
            how.name()
        );
    }
    drop_history_tables(&client, &table).await;
}

#[tokio::test]
async fn a_batch_written_again_after_its_commit_is_archived_once() {
    use station_gateway::history::archive::rows::{spool_header, spool_line};
    use station_gateway::history::recorder::{History, Limits, WallClock};
    use tokio_util::sync::CancellationToken;
    let (url, client) = history_postgres().await;
    let table = history_table("twice");
    let mut writer_client = writer::connect(&url, &table).await.unwrap();
    let now_ms = unix_ms_now();
    let batch = |first: u64| -> Vec<ArchivedSample> {
        (first..first + 50)
            .map(|i| ArchivedSample {
                channel: "V".into(),
                sample: Sample {
                    t_ms: now_ms - 60_000 + i * 100,
                    value: SampleValue::Number(i as f64),
                },
            })
            .collect()
    };
    let (taken, lost) = (batch(0), batch(50));
    let (taken_id, lost_id) = (writer::new_batch_id(), writer::new_batch_id());
    let mut made = Default::default();
    // The same batch twice: the second finds it taken.
    let first = writer::copy_batch(&mut writer_client, &table, &taken, &taken_id, &mut made)
        .await
        .unwrap();
    let again = writer::copy_batch(&mut writer_client, &table, &taken, &taken_id, &mut made)
        .await
        .unwrap();
    assert_eq!(
        (first, again),
        (writer::Written::Now, writer::Written::Before)
    );
    assert_eq!(rows(&client, &table).await, 50);

    // A spool holding that batch (committed, its answer lost) and one never written: caught up,
    // each sample is in the archive once, and the minutes count each once.
    let spool = spool_path(&table);
    let text: String = [(&taken_id, &taken), (&lost_id, &lost)]
        .iter()
        .flat_map(|(id, samples)| {
            std::iter::once(spool_header(id)).chain(samples.iter().map(spool_line))
        })
        .collect();
    std::fs::write(&spool, text).unwrap();
    let limits = Limits {
        samples_per_channel: 1000,
        max_channels: 10,
        min_spacing_ms: 0,
    };
    let history = std::sync::Arc::new(History::new(limits, WallClock::now(), None));
    let (_queue, receiver) = tokio::sync::mpsc::channel(16);
    let shutdown = CancellationToken::new();
    let settings = writer::WriterSettings {
        url: url.clone(),
        table: table.clone(),
        spool: spool.clone(),
        retention_days: 30,
    };
    let running = tokio::spawn(writer::run(
        history.clone(),
        receiver,
        settings,
        shutdown.clone(),
    ));
    within(
        Duration::from_secs(30),
        "the spool to be caught up",
        async {
            while std::fs::metadata(&spool).is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    shutdown.cancel();
    running.await.unwrap();
    assert_eq!(rows(&client, &table).await, 100, "each sample once");
    let counted: i64 = client
        .query_one(
            &format!("SELECT sum(n)::int8 FROM {}", schema::minutes_table(&table)),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(counted, 100, "the minutes count each sample once");
    assert_eq!(history.counters.archived.load(Ordering::Relaxed), 100);
    drop_history_tables(&client, &table).await;
}

/// The archive's figures (BENCHMARKS.md), on this machine's PostgreSQL (run on its own:
/// `cargo test --test history_archive --release -- --ignored --nocapture`): the COPY insert
/// rate, and a 30-day query of one channel at 1 Hz reduced to 1 000 points.
#[tokio::test]
#[ignore = "a benchmark: 2.6 million rows; run on its own with --ignored"]
async fn bench_archive_insert_rate_and_a_30_day_query() {
    use station_gateway::history::archive::ArchiveReader;
    use station_gateway::history::bucket::{Buckets, Reduce, reduce, reduce_in};
    let (url, client) = history_postgres().await;
    let table = history_table("bench");
    let mut writer_client = writer::connect(&url, &table).await.unwrap();
    let now_ms = unix_ms_now();
    let start = now_ms - 30 * schema::DAY_MS;
    let total = 30 * 86_400u64;
    let channel: std::sync::Arc<str> = VMON1.into();
    let mut made = Default::default();
    let started = Instant::now();
    for first in (0..total).step_by(writer::BATCH) {
        let batch: Vec<ArchivedSample> = (first..(first + writer::BATCH as u64).min(total))
            .map(|i| ArchivedSample {
                channel: channel.clone(),
                sample: Sample {
                    t_ms: start + i * 1000,
                    value: SampleValue::Number((i % 600) as f64),
                },
            })
            .collect();
        writer::copy_batch(
            &mut writer_client,
            &table,
            &batch,
            &writer::new_batch_id(),
            &mut made,
        )
        .await
        .unwrap();
    }
    let took = started.elapsed();
    let rate = total as f64 / took.as_secs_f64();
    println!("archive insert: {total} samples in {took:?}: {rate:.0} samples/s");
    client
        .batch_execute(&format!("VACUUM ANALYZE {table}"))
        .await
        .unwrap();
    let reader = ArchiveReader::new(url, table.clone());
    // Warm the connection once, then time the query.
    reader.range(VMON1, start, start + 1000).await.unwrap();
    let buckets = Buckets::new(start, now_ms, 1000, Reduce::Mean);
    let mut timings = Vec::new();
    let mut by_minute = None;
    for _ in 0..5 {
        let started = Instant::now();
        let (samples, minutes) = reader
            .by_minute(VMON1, buckets.from_ms, buckets.to_ms)
            .await
            .unwrap();
        let fetched = started.elapsed();
        let series = reduce_in(&buckets, &samples, &minutes, Reduce::Mean);
        let took = started.elapsed();
        println!(
            "30-day query by minute: {} minutes and {} samples fetched in {fetched:?}, reduced to {} points in {took:?}",
            minutes.len(),
            samples.len(),
            series.points.len()
        );
        timings.push(took);
        by_minute = Some(series);
    }
    timings.sort();
    println!(
        "30-day query by minute: median {:?}",
        timings[timings.len() / 2]
    );
    // Before: every sample read and reduced in the gateway; the same answer.
    let started = Instant::now();
    let samples = reader
        .range(VMON1, buckets.from_ms, buckets.to_ms)
        .await
        .unwrap();
    let fetched = started.elapsed();
    let series = reduce(&samples, buckets.from_ms, buckets.to_ms, 1000, Reduce::Mean);
    let took = started.elapsed();
    println!(
        "30-day query of every sample: {} samples fetched in {fetched:?}, reduced to {} points in {took:?}",
        samples.len(),
        series.points.len()
    );
    assert_eq!(samples.len() as u64, total);
    assert_eq!(
        by_minute,
        Some(series),
        "the minutes answer as the samples do"
    );
    drop_history_tables(&client, &table).await;
}

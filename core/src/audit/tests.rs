//! The audit trail's writer: rotation, reading back, durability ordering and group commit.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use super::files::{RotatingFiles, merged_in_time_order, rotated_path, tail_of_file};
use super::*;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "station-gateway-audit-{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn read_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn files_rotate_at_their_size_keep_their_count_and_lose_no_line_between() {
    let dir = temp_dir("rotate");
    // 100-byte files, 3 of them: 10-byte lines, 10 per file.
    let mut files = RotatingFiles::open(&dir, REQUESTS, 100, 3).unwrap();
    for n in 0..45 {
        files.append(format!("line {n:04}\n").as_bytes()).unwrap();
    }
    files.sync().unwrap();
    let current = read_lines(&rotated_path(&dir, REQUESTS, 0));
    let first = read_lines(&rotated_path(&dir, REQUESTS, 1));
    let second = read_lines(&rotated_path(&dir, REQUESTS, 2));
    assert_eq!(
        current,
        (40..45).map(|n| format!("line {n:04}")).collect::<Vec<_>>()
    );
    assert_eq!(
        first,
        (30..40).map(|n| format!("line {n:04}")).collect::<Vec<_>>()
    );
    assert_eq!(
        second,
        (20..30).map(|n| format!("line {n:04}")).collect::<Vec<_>>()
    );
    assert!(
        !rotated_path(&dir, REQUESTS, 3).exists(),
        "only 3 files are kept"
    );
    for path in [
        rotated_path(&dir, REQUESTS, 1),
        rotated_path(&dir, REQUESTS, 2),
    ] {
        assert!(std::fs::metadata(&path).unwrap().len() <= 100);
    }
    // Many lines in one append rotate at the same places as one by one.
    let batch: String = (45..70).map(|n| format!("line {n:04}\n")).collect();
    files.append(batch.as_bytes()).unwrap();
    assert_eq!(
        read_lines(&rotated_path(&dir, REQUESTS, 0)),
        (60..70).map(|n| format!("line {n:04}")).collect::<Vec<_>>()
    );
    assert_eq!(
        read_lines(&rotated_path(&dir, REQUESTS, 1)),
        (50..60).map(|n| format!("line {n:04}")).collect::<Vec<_>>()
    );
    // A line longer than a file gets a file of its own.
    let mut long = vec![b'x'; 150];
    long.push(b'\n');
    files.append(&long).unwrap();
    assert_eq!(
        std::fs::read(rotated_path(&dir, REQUESTS, 0)).unwrap(),
        long
    );
    files.append(b"after\n").unwrap();
    assert_eq!(read_lines(&rotated_path(&dir, REQUESTS, 0)), ["after"]);
    // Reopened, it goes on where it was.
    drop(files);
    let mut files = RotatingFiles::open(&dir, REQUESTS, 100, 3).unwrap();
    files.append(b"again\n").unwrap();
    assert_eq!(
        read_lines(&rotated_path(&dir, REQUESTS, 0)),
        ["after", "again"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_file_only_starts_over() {
    let dir = temp_dir("one");
    let mut files = RotatingFiles::open(&dir, REQUESTS, 20, 1).unwrap();
    for n in 0..5 {
        files.append(format!("l{n:08}\n").as_bytes()).unwrap();
    }
    assert_eq!(read_lines(&rotated_path(&dir, REQUESTS, 0)), ["l00000004"]);
    assert!(!rotated_path(&dir, REQUESTS, 1).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tail_reads_the_last_lines_of_the_current_file_and_skips_a_cut_line() {
    let dir = temp_dir("tail");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(
        tail_of_file(&dir, REQUESTS, 5).unwrap().is_empty(),
        "no file yet"
    );
    let mut text: String = (0..2000).map(|n| format!("line number {n}\n")).collect();
    text.push_str("cut by a crash");
    std::fs::write(rotated_path(&dir, REQUESTS, 0), text).unwrap();
    assert_eq!(
        tail_of_file(&dir, REQUESTS, 3).unwrap(),
        ["line number 1997", "line number 1998", "line number 1999"]
    );
    let all = tail_of_file(&dir, REQUESTS, 0).unwrap();
    assert_eq!(all.len(), 2000);
    assert_eq!(all[0], "line number 0");
    assert_eq!(tail_of_file(&dir, REQUESTS, 5000).unwrap().len(), 2000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sink whose sync waits until the test lets it finish, and says when it started.
struct HeldSync {
    written: Arc<Mutex<Vec<u8>>>,
    synced: Arc<Mutex<Vec<u8>>>,
    sync_started: std_mpsc::Sender<()>,
    release: std_mpsc::Receiver<()>,
}

impl Sink for HeldSync {
    fn append(&mut self, lines: &[u8]) -> std::io::Result<()> {
        lock(&self.written).extend_from_slice(lines);
        Ok(())
    }

    fn sync(&mut self) -> std::io::Result<()> {
        let _ = self.sync_started.send(());
        self.release
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| std::io::Error::other("the test never released the sync"))?;
        let written = lock(&self.written).clone();
        *lock(&self.synced) = written;
        Ok(())
    }
}

/// A trail on [`HeldSync`]: the log, what was synced, "a sync started", "let it finish".
type HeldLog = (
    AuditLog,
    Arc<Mutex<Vec<u8>>>,
    std_mpsc::Receiver<()>,
    std_mpsc::Sender<()>,
);

fn held_log() -> HeldLog {
    let (sync_started, started) = std_mpsc::channel();
    let (release, released) = std_mpsc::channel();
    let synced = Arc::new(Mutex::new(Vec::new()));
    let sink = HeldSync {
        written: Arc::default(),
        synced: synced.clone(),
        sync_started,
        release: released,
    };
    let memory = Streams::in_memory(&AuditConfig::default());
    let requests = MemorySink(memory.requests.clone());
    let log = AuditLog::start(requests, sink, None, memory);
    (log, synced, started, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_recorded_only_once_its_line_is_synced() {
    let (log, synced, sync_started, release) = held_log();
    let record = tokio::spawn({
        let log = log.clone();
        async move { log.record("change one outcome=applied".into()).await }
    });
    sync_started
        .recv_timeout(Duration::from_secs(10))
        .expect("the writer syncs a change");
    // The sync has begun and not finished: the change must still be waiting.
    tokio::task::yield_now().await;
    assert!(!record.is_finished(), "recorded before its line was synced");
    assert!(lock(&synced).is_empty());
    release.send(()).unwrap();
    record.await.unwrap().unwrap();
    assert_eq!(lock(&synced).as_slice(), b"change one outcome=applied\n");
    assert_eq!(log.recent_changes(), ["change one outcome=applied"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_share_one_sync() {
    let (log, _synced, sync_started, release) = held_log();
    let first = tokio::spawn({
        let log = log.clone();
        async move { log.record("first outcome=applied".into()).await }
    });
    sync_started.recv_timeout(Duration::from_secs(10)).unwrap();
    // While the first sync runs, 50 more changes queue up: they go out in one write, one sync.
    let mut more = Vec::new();
    for n in 0..50 {
        let log = log.clone();
        more.push(tokio::spawn(async move {
            log.record(format!("change {n} outcome=applied")).await
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.jobs_queued() < 50 {
        assert!(Instant::now() < deadline, "the changes never queued");
        tokio::task::yield_now().await;
    }
    release.send(()).unwrap();
    first.await.unwrap().unwrap();
    sync_started.recv_timeout(Duration::from_secs(10)).unwrap();
    release.send(()).unwrap();
    for change in more {
        change.await.unwrap().unwrap();
    }
    assert_eq!(log.batches_and_syncs(), (2, 2));
    assert_eq!(log.recent_changes().len(), RECENT_CHANGES);
}

#[tokio::test(start_paused = true)]
async fn a_disk_that_hangs_delays_a_change_by_the_limit_not_forever() {
    let (log, _synced, sync_started, release) = held_log();
    let started = tokio::time::Instant::now();
    let outcome = log.record("stuck outcome=applied".into()).await;
    let why = outcome.unwrap_err();
    assert!(why.contains("did not confirm"), "{why}");
    assert_eq!(started.elapsed(), RECORD_LIMIT);
    sync_started.recv_timeout(Duration::from_secs(10)).unwrap();
    release.send(()).unwrap();
}

#[test]
fn memory_only_keeps_one_files_worth() {
    let mut memory = MemoryLines::new(30);
    for n in 0..7 {
        memory.push(&format!("line {n}"));
    }
    // 7 bytes a line: 4 fit in 30 bytes, then it starts over.
    assert_eq!(memory.tail(0), ["line 4", "line 5", "line 6"]);
    assert_eq!(memory.tail(2), ["line 5", "line 6"]);
}

#[test]
fn a_batch_of_lines_is_kept_as_its_lines_one_by_one_would_be() {
    let batches = [
        "line 0\nline 1\n",
        "line 2\n",
        "line 3\nline 4\nline 5\n",
        "\nline 6\n\nline 7",
        "line 8\nline 9\n",
        "",
    ];
    // Small enough to start over within a batch and between batches.
    for max_bytes in [20, 30, 1000] {
        let (mut batched, mut one_by_one) =
            (MemoryLines::new(max_bytes), MemoryLines::new(max_bytes));
        for batch in batches {
            batched.push_lines(batch);
            for line in batch.split('\n').filter(|line| !line.is_empty()) {
                one_by_one.push(line);
            }
            assert_eq!(
                batched.tail(0),
                one_by_one.tail(0),
                "{max_bytes} bytes, after {batch:?}"
            );
        }
    }
    let mut kept = MemoryLines::new(1000);
    kept.push_lines("a\nb\n");
    assert_eq!(kept.tail(0), ["a", "b"]);
}

#[tokio::test]
async fn recent_changes_come_back_from_the_file_after_a_restart() {
    let dir = temp_dir("seed");
    let config = AuditConfig {
        dir: dir.to_string_lossy().into_owned(),
        ..AuditConfig::default()
    };
    let log = AuditLog::open(&config).unwrap();
    log.note("a read");
    for n in 0..25 {
        log.record(format!(
            "x - POST /api/x 200 1ms change {n} outcome=applied"
        ))
        .await
        .unwrap();
    }
    drop(log);
    let reopened = AuditLog::open(&config).unwrap();
    let recent = reopened.recent_changes();
    assert_eq!(recent.len(), RECENT_CHANGES);
    assert!(recent[19].contains("change 24"), "{recent:?}");
    assert_eq!(reopened.tail(0).unwrap().len(), 26);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Lines of requests that changed nothing do not wake the writer one by one: a burst of them
/// goes out in one write within the batch window; a change behind them takes them along at once.
#[test]
fn quiet_lines_are_written_together_and_a_change_takes_them_along_at_once() {
    let memory = Streams::in_memory(&AuditConfig::default());
    let sinks = (
        MemorySink(memory.requests.clone()),
        MemorySink(memory.changes.clone()),
    );
    let log = AuditLog::start(sinks.0, sinks.1, None, memory.clone());
    let (memory, changes) = (memory.requests, memory.changes);
    for n in 0..200 {
        log.note(&format!("read {n}"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock(&memory).tail(0).len() < 200 {
        assert!(Instant::now() < deadline, "quiet lines were never written");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (batches, syncs) = log.batches_and_syncs();
    // Two would be the rule (the window's batch and perhaps a straggler); a stalled machine may
    // split a burst more, never two hundred ways.
    assert!(
        batches <= 10,
        "200 quiet lines took {batches} writes: the writer woke for each"
    );
    assert_eq!(syncs, 0, "quiet lines are never synced");
    // A quiet line, then a change: both written in the change's batch, without waiting out
    // the window.
    log.note("read again");
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(log.record("change outcome=applied".into()))
        .unwrap();
    assert!(
        started.elapsed() < BATCH_WINDOW * 20,
        "a change waited {:?}",
        started.elapsed()
    );
    assert_eq!(lock(&memory).tail(1), ["read again"]);
    assert_eq!(lock(&changes).tail(0), ["change outcome=applied"]);
}

#[test]
fn the_two_streams_merge_in_time_order_each_keeping_its_own() {
    let requests = vec![
        "2026-05-29 14:23:01.100 a GET /api/x 200 1ms".to_owned(),
        "2026-05-29 14:23:01.300 a GET /api/x 200 1ms".to_owned(),
        "2026-05-29 14:23:01.300 b GET /api/y 200 1ms".to_owned(),
        "2026-05-29 14:23:02.000 a GET /api/x 200 1ms".to_owned(),
    ];
    let changes = vec![
        "2026-05-29 14:23:01.000 a POST /api/s 200 1ms outcome=applied".to_owned(),
        "2026-05-29 14:23:01.300 - LEASE taken - - caller=-".to_owned(),
        "2026-05-29 14:23:03.000 a POST /api/s 423 1ms outcome=refused".to_owned(),
    ];
    let merged = merged_in_time_order(requests.clone(), changes.clone(), 0);
    let order: Vec<&str> = merged.iter().map(|l| &l[20..23]).collect();
    assert_eq!(order, ["000", "100", "300", "300", "300", "000", "000"]);
    assert_eq!(merged[2], requests[1]);
    assert_eq!(merged[3], requests[2]);
    assert_eq!(merged[4], changes[1]);
    assert_eq!(
        merged_in_time_order(requests.clone(), changes.clone(), 2),
        [requests[3].clone(), changes[2].clone()]
    );
    assert_eq!(
        merged_in_time_order(Vec::new(), changes.clone(), 0),
        changes
    );
}

#[tokio::test]
async fn reads_never_rotate_a_change_out() {
    let dir = temp_dir("apart");
    let config = AuditConfig {
        dir: dir.to_string_lossy().into_owned(),
        file_bytes: 4096,
        files: 2,
        ..AuditConfig::default()
    };
    let log = AuditLog::open(&config).unwrap();
    let change = "2026-05-29 14:23:01.000 - POST /api/s 200 1ms outcome=applied asked=V=1";
    log.record(change.into()).await.unwrap();
    for n in 0..10_000 {
        log.note(&format!(
            "2026-05-29 14:23:02.000 - POST /api/g 200 1ms read {n:05}"
        ));
    }
    log.written().await;
    let trail = log.tail(0).unwrap();
    assert_eq!(trail[0], change, "{} lines", trail.len());
    assert!(trail.last().unwrap().ends_with("read 09999"));
    assert_eq!(read_lines(&rotated_path(&dir, CHANGES, 0)), [change]);
    assert!(
        !rotated_path(&dir, REQUESTS, 2).exists(),
        "only 2 request files"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A line as the gateway renders it, at a fixed time `n` ms into the day.
fn rendered(n: u64, method: &str, path: &str, change: Option<&ChangeFields>) -> String {
    RequestLine {
        at: std::time::UNIX_EPOCH + Duration::from_millis(1_780_064_581_000 + n),
        ip: Some("192.168.1.55".parse().unwrap()),
        method,
        path,
        status: Some(200),
        duration: Some(Duration::from_millis(1)),
    }
    .render(change)
}

#[tokio::test]
async fn two_stations_write_one_trail_each_line_naming_its_station() {
    let log = AuditLog::memory_only();
    let (st1, st2) = (log.for_station("st1"), log.for_station("st-2_b"));
    let applied = ChangeFields {
        outcome: Some(Outcome::Applied),
        ..ChangeFields::default()
    };
    let lease = lease_lines::lease_line(
        &crate::lease::LeaseNotice::Taken {
            owner: "TAT station 3",
            fence: 7,
        },
        std::time::UNIX_EPOCH + Duration::from_millis(1_780_064_581_003),
    );
    st1.note(&rendered(0, "GET", "/api/application/status", None));
    st2.note_with(|out| out.push_str(&rendered(1, "GET", "/api/resources", None)));
    st1.record(rendered(
        2,
        "POST",
        "/api/resources/value/set",
        Some(&applied),
    ))
    .await
    .unwrap();
    // The lease's own lines go through its hook, which a station's parts give their view.
    (lease_lines::lease_hook(st2.clone()))(crate::lease::LeaseNotice::Taken {
        owner: "TAT station 3",
        fence: 7,
    });
    st2.note_change(lease.clone());
    log.written().await;
    let trail = log.tail(0).unwrap();
    assert_eq!(trail.len(), 5, "{trail:#?}");
    assert_eq!(
        trail[0],
        format!(
            "{} station=st1",
            rendered(0, "GET", "/api/application/status", None)
        )
    );
    assert_eq!(
        trail[1],
        format!(
            "{} station=st-2_b",
            rendered(1, "GET", "/api/resources", None)
        )
    );
    assert_eq!(
        trail[2],
        format!(
            "{} station=st1",
            rendered(2, "POST", "/api/resources/value/set", Some(&applied))
        )
    );
    assert!(
        trail[3].contains(" LEASE taken ")
            && trail[3].ends_with(" fence=7 outcome=applied station=st-2_b"),
        "{}",
        trail[3]
    );
    assert_eq!(trail[4], format!("{lease} station=st-2_b"));
    // Change and LEASE lines are still recognised with the station field at their end; a
    // request that changed nothing is still not one.
    assert!(line::is_change_line(&trail[2]));
    assert!(line::is_change_line(&trail[3]));
    assert!(line::is_change_line(&trail[4]));
    assert!(!line::is_change_line(&trail[0]));
    let recent = log.recent_changes();
    assert_eq!(recent.len(), 3, "{recent:#?}");
    assert!(recent.iter().all(|line| line.contains(" station=")));
    // A station's view reads its own lines only, its tail counted in them.
    assert_eq!(st1.tail(0).unwrap(), [trail[0].clone(), trail[2].clone()]);
    assert_eq!(
        st2.tail(0).unwrap(),
        [trail[1].clone(), trail[3].clone(), trail[4].clone()]
    );
    assert_eq!(st2.tail(2).unwrap(), [trail[3].clone(), trail[4].clone()]);
    assert_eq!(st1.tail(1).unwrap(), [trail[2].clone()]);
}

#[tokio::test]
async fn a_plain_trail_writes_its_lines_as_they_are() {
    let log = AuditLog::memory_only();
    let _station = log.for_station("st1");
    let applied = ChangeFields {
        outcome: Some(Outcome::Applied),
        ..ChangeFields::default()
    };
    let (read, change) = (
        rendered(0, "GET", "/api/application/status", None),
        rendered(1, "POST", "/api/x", Some(&applied)),
    );
    log.note(&read);
    log.record(change.clone()).await.unwrap();
    log.written().await;
    assert_eq!(log.tail(0).unwrap(), [read, change]);
}

#[tokio::test]
async fn a_station_id_is_escaped_and_a_waiter_adds_no_line() {
    let log = AuditLog::memory_only();
    let odd = log.for_station("st 1\n");
    odd.note("read");
    // A station's view waits for the trail as any other: its waiter is no line of its own.
    odd.written().await;
    odd.written().await;
    assert_eq!(log.tail(0).unwrap(), ["read station=\"st 1\\x0A\""]);
    // A view of a view names the new station only.
    let other = odd.for_station("st2");
    other.note_change("x - LEASE taken - - outcome=applied".into());
    log.written().await;
    assert_eq!(
        log.tail(1).unwrap(),
        ["x - LEASE taken - - outcome=applied station=st2"]
    );
}

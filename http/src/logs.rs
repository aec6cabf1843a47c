//! The log writer: formatted lines go into a shared buffer that one thread writes out, so an
//! access line costs a request task a copy, never a system call or a thread wake-up. Also the
//! log formats ([`install`]): `human`, whose fields ([`EscapedFields`]) escape control
//! characters so a value a client sent (a lease owner with a newline) cannot forge a line, and
//! `json`, escaped by JSON itself.
//!
//! Access lines (target `access`) are written in batches, at most [`BATCH_INTERVAL`] after the
//! first line of a batch; every other line (start-up, link up and down, warnings) wakes the
//! writer at once. A writer that cannot keep up (stderr blocked) drops lines past
//! [`MAX_BUFFERED`] and says how many it dropped, rather than growing or stalling requests.
//!
//! Access lines themselves ([`AccessLine`]) are rendered straight into the writer's batch, in
//! the format [`install`] set up, byte for byte what `tracing`'s formatter would write but
//! without its formatting machinery (coloured output still goes through `tracing`).
//!
//! The last [`RECENT_LINES`] lines other than access lines are also kept in memory
//! ([`recent_lines`]) for `GET api/application/log`, each with the station it is of: in a
//! gateway of several stations, each station's tasks run in a [`STATION_SPAN`] span naming it
//! (the human format shows it as `station{id=st2}:`), [`StationSpans`] tells the writer which
//! station's span an event is in, and a station's `api/application/log` holds only its lines.

use std::collections::VecDeque;
use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tracing::Metadata;
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::{FormatFields, Writer};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::numtext;

/// How long the first access line of a batch may wait for others before it is written.
pub const BATCH_INTERVAL: Duration = Duration::from_millis(50);
/// Buffered bytes past which the writer is woken before the interval ends.
pub const WRITE_SOON: usize = 64 * 1024;
/// Buffered bytes past which lines are dropped (and counted) instead of kept.
pub const MAX_BUFFERED: usize = 8 * 1024 * 1024;

/// The `tracing` target of the one-line-per-request access log.
pub const ACCESS_TARGET: &str = "access";

/// Log lines kept in memory for `api/application/log` (access lines are not kept: they would
/// push out the link, lease and start-up lines a user asks the log for).
pub const RECENT_LINES: usize = 1000;

/// The name of the span a station's tasks run in, in a gateway of several; its one field,
/// `id`, is the station's id.
pub use station_core::runtime::STATION_SPAN;

/// A recent line and the station whose span it was logged in (`None`: the gateway's own).
type RecentLine = (Option<Arc<str>>, String);

/// The bounded ring of recent lines, oldest first.
static RECENT: Mutex<VecDeque<RecentLine>> = Mutex::new(VecDeque::new());

std::thread_local! {
    /// The stations whose spans this thread is in, innermost last ([`StationSpans`]).
    static ENTERED_STATIONS: std::cell::RefCell<Vec<Arc<str>>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

/// The station whose span this thread is in now, if any.
fn entered_station() -> Option<Arc<str>> {
    ENTERED_STATIONS.with(|entered| entered.borrow().last().cloned())
}

/// Keeps `line` (one formatted log line) in the ring, dropping the oldest beyond `capacity`.
fn keep_recent(
    ring: &Mutex<VecDeque<RecentLine>>,
    station: Option<Arc<str>>,
    line: &[u8],
    capacity: usize,
) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\r', '\n']);
    let mut ring = ring.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    while ring.len() >= capacity {
        ring.pop_front();
    }
    ring.push_back((station, text.to_owned()));
}

/// The last `tail` lines the gateway logged (all it keeps for 0), oldest first: of `station`
/// only (lines logged in its [`STATION_SPAN`]) when given, every line otherwise.
pub fn recent_lines(station: Option<&str>, tail: usize) -> Vec<String> {
    last_of(&RECENT, station, tail)
}

fn last_of(ring: &Mutex<VecDeque<RecentLine>>, station: Option<&str>, tail: usize) -> Vec<String> {
    let ring = ring.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let ours = |of: &Option<Arc<str>>| station.is_none_or(|wanted| of.as_deref() == Some(wanted));
    let count = ring.iter().filter(|(of, _)| ours(of)).count();
    let skip = match tail {
        0 => 0,
        tail => count.saturating_sub(tail),
    };
    ring.iter()
        .filter(|(of, _)| ours(of))
        .skip(skip)
        .map(|(_, line)| line.clone())
        .collect()
}

/// The layer that knows which station's span a thread is in: a [`STATION_SPAN`] span keeps
/// its `id` when made, and entering and leaving it push and pop the id on this thread, so the
/// writer, called on the event's own thread, keeps each line with its station. A task of a
/// station runs instrumented with its span (entered at every poll), so every line it logs is
/// that station's.
#[derive(Debug, Clone, Copy, Default)]
pub struct StationSpans;

/// A station span's id, kept in the span's extensions.
struct StationOfSpan(Arc<str>);

/// Reads a station span's `id` field.
struct IdVisitor(Option<String>);

impl Visit for IdVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "id" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "id" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for StationSpans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() != STATION_SPAN {
            return;
        }
        let mut visitor = IdVisitor(None);
        attrs.record(&mut visitor);
        if let (Some(station), Some(span)) = (visitor.0, ctx.span(id)) {
            span.extensions_mut()
                .insert(StationOfSpan(Arc::from(station)));
        }
    }

    fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(StationOfSpan(station)) = span.extensions().get::<StationOfSpan>()
        {
            ENTERED_STATIONS.with(|entered| entered.borrow_mut().push(station.clone()));
        }
    }

    fn on_exit(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && span.extensions().get::<StationOfSpan>().is_some()
        {
            ENTERED_STATIONS.with(|entered| entered.borrow_mut().pop());
        }
    }
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    dropped: u64,
    /// A line that should not wait for the batch interval is in `bytes`.
    urgent: bool,
    closed: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// [`BATCH_INTERVAL`] but in tests.
    batch_interval: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding this lock leaves only bytes behind: keep logging.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The [`MakeWriter`] given to `tracing_subscriber`; cheap to clone.
#[derive(Clone)]
pub struct BatchingWriter {
    shared: Arc<Shared>,
}

/// Owns the writer thread. Dropping it writes out what is left and ends the thread.
pub struct BatchingWriterGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the writer thread over `out` (stderr in the gateway, a buffer in tests).
pub fn batching_writer<W: Write + Send + 'static>(out: W) -> (BatchingWriter, BatchingWriterGuard) {
    batching_writer_every(out, BATCH_INTERVAL)
}

fn batching_writer_every<W: Write + Send + 'static>(
    out: W,
    batch_interval: Duration,
) -> (BatchingWriter, BatchingWriterGuard) {
    let shared = Arc::new(Shared {
        pending: Mutex::default(),
        wake: Condvar::new(),
        batch_interval,
    });
    let thread = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || write_until_closed(&shared, out))
            .expect("cannot start the log writer thread")
    };
    (
        BatchingWriter {
            shared: shared.clone(),
        },
        BatchingWriterGuard {
            shared,
            thread: Some(thread),
        },
    )
}

fn write_until_closed<W: Write>(shared: &Shared, mut out: W) {
    let mut batch = Vec::new();
    loop {
        let (dropped, closed) = {
            let mut pending = shared.lock();
            while pending.bytes.is_empty() && pending.dropped == 0 && !pending.closed {
                pending = shared.wake.wait(pending).unwrap_or_else(|p| p.into_inner());
            }
            // Let a batch of access lines gather, unless something should go out now.
            let deadline = Instant::now() + shared.batch_interval;
            while !pending.urgent && !pending.closed && pending.bytes.len() < WRITE_SOON {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                pending = shared
                    .wake
                    .wait_timeout(pending, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            std::mem::swap(&mut pending.bytes, &mut batch);
            pending.urgent = false;
            (std::mem::take(&mut pending.dropped), pending.closed)
        };
        // A log that cannot be written has nowhere to report it: carry on.
        let _ = out.write_all(&batch);
        if dropped > 0 {
            let _ = writeln!(
                out,
                "station-gateway: {dropped} log lines dropped: the log output could not keep up"
            );
        }
        let _ = out.flush();
        batch.clear();
        if closed {
            return;
        }
    }
}

impl Drop for BatchingWriterGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One event's formatted line, appended to the shared buffer in one piece.
pub struct LineWriter<'a> {
    shared: &'a Shared,
    urgent: bool,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        if self.urgent {
            keep_recent(&RECENT, entered_station(), line, RECENT_LINES);
        }
        let mut pending = self.shared.lock();
        if pending.bytes.len() + line.len() > MAX_BUFFERED {
            pending.dropped += 1;
            return Ok(line.len());
        }
        let was_empty = pending.bytes.is_empty();
        pending.bytes.extend_from_slice(line);
        let crossed =
            pending.bytes.len() >= WRITE_SOON && pending.bytes.len() - line.len() < WRITE_SOON;
        let wake = (self.urgent && !pending.urgent) || was_empty || crossed;
        pending.urgent |= self.urgent;
        drop(pending);
        // The writer sleeps only while the buffer is empty, or while it lets a batch gather:
        // wake it for the first line, an urgent line, or a full buffer; no other line costs a
        // wake-up.
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchingWriter {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            shared: &self.shared,
            urgent: true,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        LineWriter {
            shared: &self.shared,
            urgent: meta.target() != ACCESS_TARGET,
        }
    }
}

/// Where and how access lines are rendered without `tracing`, once [`install`] set it up.
static ACCESS_LINES: OnceLock<AccessLines> = OnceLock::new();

struct AccessLines {
    shared: Arc<Shared>,
    format: AccessFormat,
}

/// The installed log format, as access lines are rendered in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccessFormat {
    Human,
    Json,
}

/// One request's access line (target [`ACCESS_TARGET`], message `request`).
#[derive(Debug, Clone, Copy)]
pub struct AccessLine<'a> {
    pub method: &'a str,
    /// The path as it may be logged (`redact::loggable_path`).
    pub path: &'a str,
    pub status: u16,
    pub duration_ms: f64,
    pub peer: SocketAddr,
}

impl AccessLine<'_> {
    /// Renders the line straight into the log writer's batch. `false` when the logger was not
    /// set up for that (coloured output, or not installed by [`install`]): the caller then
    /// logs it through `tracing`.
    pub fn write_direct(&self) -> bool {
        let Some(sink) = ACCESS_LINES.get() else {
            return false;
        };
        let now = SystemTime::now();
        let mut pending = sink.shared.lock();
        let start = pending.bytes.len();
        self.render(sink.format, Some(now), &mut pending.bytes);
        if pending.bytes.len() > MAX_BUFFERED {
            pending.bytes.truncate(start);
            pending.dropped += 1;
            return true;
        }
        // As for any access line: wake the writer for the first line or a full buffer only.
        let wake = start == 0 || (pending.bytes.len() >= WRITE_SOON && start < WRITE_SOON);
        drop(pending);
        if wake {
            sink.shared.wake.notify_one();
        }
        true
    }

    /// Appends the line, with its newline, as `tracing_subscriber`'s `format` (the human one
    /// with [`EscapedFields`]) writes it; `at` is its timestamp, `None` for none.
    fn render(&self, format: AccessFormat, at: Option<SystemTime>, out: &mut Vec<u8>) {
        match format {
            AccessFormat::Human => {
                if let Some(at) = at {
                    crate::timestamp::push_rfc3339_micros(out, at);
                    out.push(b' ');
                }
                out.extend_from_slice(b" INFO access: request method=");
                push_escaped_field(out, self.method);
                out.extend_from_slice(b" path=");
                push_escaped_field(out, self.path);
                out.extend_from_slice(b" status=");
                out.extend_from_slice(numtext::u64_text(u64::from(self.status)).as_bytes());
                out.extend_from_slice(b" duration_ms=");
                numtext::push_thousandths(out, self.duration_ms);
                out.extend_from_slice(b" peer=");
                numtext::push_socket_addr(out, self.peer);
                out.push(b'\n');
            }
            AccessFormat::Json => {
                out.push(b'{');
                if let Some(at) = at {
                    out.extend_from_slice(b"\"timestamp\":\"");
                    crate::timestamp::push_rfc3339_micros(out, at);
                    out.extend_from_slice(b"\",");
                }
                // The fields in the order the event declares them, as `tracing_subscriber`'s
                // JSON writes them.
                out.extend_from_slice(
                    b"\"level\":\"INFO\",\"fields\":{\"message\":\"request\",\"method\":",
                );
                let _ = serde_json::to_writer(&mut *out, self.method);
                out.extend_from_slice(b",\"path\":");
                let _ = serde_json::to_writer(&mut *out, self.path);
                out.extend_from_slice(b",\"status\":");
                out.extend_from_slice(numtext::u64_text(u64::from(self.status)).as_bytes());
                let _ = write!(
                    out,
                    ",\"duration_ms\":{},\"peer\":\"",
                    serde_json::Value::from(self.duration_ms)
                );
                numtext::push_socket_addr(out, self.peer);
                out.push(b'"');
                out.extend_from_slice(b"},\"target\":\"access\"}\n");
            }
        }
    }
}

/// Appends a field's text as [`EscapedFields`] writes it: control characters escaped.
fn push_escaped_field(out: &mut Vec<u8>, value: &str) {
    // ASCII (every method and path the gateway logs) is checked a byte at a time; `char`'s
    // controls beyond ASCII are the C1 block, which only non-ASCII text can hold.
    let plain = if value.is_ascii() {
        !value.bytes().any(|b| b.is_ascii_control())
    } else {
        !value.contains(char::is_control)
    };
    if plain {
        out.extend_from_slice(value.as_bytes());
        return;
    }
    use fmt::Write as _;
    let mut text = String::with_capacity(value.len() + 8);
    let _ = Escaping(&mut text).write_str(value);
    out.extend_from_slice(text.as_bytes());
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogSetupError {
    #[error("--log-format: {0:?} is not human or json")]
    UnknownFormat(String),
    #[error("cannot install the logger: {0}")]
    Install(String),
}

/// Installs the process's logger: `format` (`human` or `json`) written to `out` through the
/// batching writer, the level from `RUST_LOG` (default info). Keep the guard until the end of
/// `main`: dropping it writes what is left.
pub fn install<W: Write + Send + 'static>(
    format: &str,
    ansi: bool,
    out: W,
) -> Result<BatchingWriterGuard, LogSetupError> {
    if !matches!(format, "human" | "json") {
        return Err(LogSetupError::UnknownFormat(format.to_owned()));
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = batching_writer(out);
    let access = match (format, ansi) {
        ("json", _) => Some(AccessFormat::Json),
        (_, false) => Some(AccessFormat::Human),
        (_, true) => None,
    };
    let shared = writer.shared.clone();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    let installed = match format {
        "json" => builder.json().finish().with(StationSpans).try_init(),
        _ => builder
            .fmt_fields(EscapedFields)
            .finish()
            .with(StationSpans)
            .try_init(),
    };
    installed.map_err(|error| LogSetupError::Install(error.to_string()))?;
    if let Some(format) = access {
        let _ = ACCESS_LINES.set(AccessLines { shared, format });
    }
    Ok(guard)
}

/// The human format's fields: `message name=value ...` with every control character escaped
/// (`\n`, `\r`, `\t`, `\u{1b}`), so one event is always one line whatever its values hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = EscapingVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapingVisitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        // Metadata of events from the `log` crate, shown elsewhere in the line.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let separator = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = match name {
            "message" => write!(self.writer, "{separator}"),
            name => write!(
                self.writer,
                "{separator}{}=",
                name.strip_prefix("r#").unwrap_or(name)
            ),
        }
        .and_then(|()| {
            use fmt::Write as _;
            write!(Escaping(&mut self.writer), "{value:?}")
        });
    }
}

/// A [`fmt::Write`] that escapes control characters on their way through.
struct Escaping<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(char::is_control) {
            self.0.write_str(&rest[..at])?;
            let Some(control) = rest[at..].chars().next() else {
                break;
            };
            match control {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                other => write!(self.0, "\\u{{{:x}}}", other as u32)?,
            }
            rest = &rest[at + control.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` the test can read back, with a count of the writes it was given.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let mut inner = self.0.lock().unwrap();
            inner.0.extend_from_slice(bytes);
            inner.1 += 1;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().0.clone()).unwrap()
        }
        fn writes(&self) -> usize {
            self.0.lock().unwrap().1
        }
    }

    fn line(writer: &BatchingWriter, urgent: bool, text: &str) {
        let mut line = LineWriter {
            shared: &writer.shared,
            urgent,
        };
        line.write_all(text.as_bytes()).unwrap();
    }

    fn wait_for(sink: &Sink, what: &str) -> Duration {
        let started = Instant::now();
        while !sink.text().contains(what) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what:?} was not written within 30 s; written: {:?}",
                sink.text()
            );
            std::thread::yield_now();
        }
        started.elapsed()
    }

    #[test]
    fn access_lines_are_written_together_in_order() {
        let sink = Sink::default();
        let (writer, guard) = batching_writer(sink.clone());
        for n in 0..100 {
            line(&writer, false, &format!("access {n}\n"));
        }
        wait_for(&sink, "access 99\n");
        let expected: String = (0..100).map(|n| format!("access {n}\n")).collect();
        assert_eq!(sink.text(), expected);
        assert!(sink.writes() <= 4, "{} writes for one batch", sink.writes());
        drop(guard);
    }

    #[test]
    fn an_urgent_line_does_not_wait_for_the_batch() {
        // A batch window of an hour: an urgent line that waited for it would never show
        // within the hang guard of `wait_for`.
        let sink = Sink::default();
        let (writer, _guard) = batching_writer_every(sink.clone(), Duration::from_secs(3600));
        line(&writer, false, "access 1\n");
        line(&writer, true, "station link down\n");
        wait_for(&sink, "station link down\n");
        assert_eq!(sink.text(), "access 1\nstation link down\n");
    }

    #[test]
    fn access_lines_are_written_once_the_batch_window_ends() {
        let window = Duration::from_millis(200);
        let sink = Sink::default();
        let (writer, _guard) = batching_writer_every(sink.clone(), window);
        let started = Instant::now();
        line(&writer, false, "access 1\n");
        line(&writer, false, "access 2\n");
        wait_for(&sink, "access 2\n");
        // Not before the window ends (the writer has no other reason to write them), and in
        // one write.
        assert!(
            started.elapsed() >= window,
            "written after {:?}",
            started.elapsed()
        );
        assert_eq!(sink.text(), "access 1\naccess 2\n");
        assert_eq!(sink.writes(), 1);
    }

    /// The human format's line for one event, through the real formatter.
    fn human_line(record: impl FnOnce()) -> String {
        let sink = Sink::default();
        let (writer, guard) = batching_writer(sink.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(writer)
            .fmt_fields(EscapedFields)
            .finish();
        tracing::subscriber::with_default(subscriber, record);
        drop(guard);
        sink.text()
    }

    #[test]
    fn the_human_format_escapes_control_characters_in_every_field() {
        let owner = "x\nINFO forged\r\t\u{1b}[2J\u{85}";
        let text = human_line(
            || tracing::info!(owner = %owner, debug = ?owner, fence = 3, "lease taken by {owner}"),
        );
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
        assert!(
            text.contains(r"lease taken by x\nINFO forged\r\t\u{1b}[2J\u{85} owner=x\nINFO forged"),
            "{text:?}"
        );
        assert!(text.contains("fence=3"), "{text:?}");
        // Plain values are written as they were.
        let text = human_line(|| tracing::info!(path = "/api/lease/{id}", status = 200, "request"));
        assert!(
            text.ends_with("request path=\"/api/lease/{id}\" status=200\n"),
            "{text:?}"
        );
    }

    /// The line `tracing` writes for this access event, through the real formatter.
    fn tracing_access_line(json: bool, line: &AccessLine<'_>) -> String {
        let sink = Sink::default();
        let (writer, guard) = batching_writer(sink.clone());
        let record = || {
            tracing::info!(
                target: "access",
                method = %line.method,
                path = %line.path,
                status = line.status,
                duration_ms = line.duration_ms,
                peer = %line.peer,
                "request"
            )
        };
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(writer);
        if json {
            tracing::subscriber::with_default(builder.json().finish(), record);
        } else {
            tracing::subscriber::with_default(builder.fmt_fields(EscapedFields).finish(), record);
        }
        drop(guard);
        sink.text()
    }

    #[test]
    fn access_lines_rendered_directly_are_what_tracing_would_write() {
        let peer: SocketAddr = "127.0.0.1:40404".parse().unwrap();
        let lines = [
            AccessLine {
                method: "POST",
                path: "/api/resources/values/get",
                status: 200,
                duration_ms: 0.123,
                peer,
            },
            AccessLine {
                method: "GET",
                path: "/api/a\"b\tc\\d\u{1b}",
                status: 404,
                duration_ms: 12.0,
                peer: "[::1]:8".parse().unwrap(),
            },
        ];
        for line in &lines {
            for (json, format) in [(false, AccessFormat::Human), (true, AccessFormat::Json)] {
                let mut direct = Vec::new();
                line.render(format, None, &mut direct);
                assert_eq!(
                    String::from_utf8(direct).unwrap(),
                    tracing_access_line(json, line)
                );
            }
        }
    }

    #[test]
    fn a_direct_access_line_starts_with_the_same_timestamp_as_tracings() {
        let at = std::time::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        let line = AccessLine {
            method: "GET",
            path: "/",
            status: 200,
            duration_ms: 1.5,
            peer: "127.0.0.1:1".parse().unwrap(),
        };
        let mut human = Vec::new();
        line.render(AccessFormat::Human, Some(at), &mut human);
        let human = String::from_utf8(human).unwrap();
        assert!(
            human.starts_with("2023-11-14T22:13:20.123456Z  INFO access: request "),
            "{human}"
        );
        let mut json = Vec::new();
        line.render(AccessFormat::Json, Some(at), &mut json);
        let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(json["timestamp"], "2023-11-14T22:13:20.123456Z");
        assert_eq!(json["fields"]["duration_ms"], 1.5);
    }

    #[test]
    fn dropping_the_guard_writes_what_is_left() {
        let sink = Sink::default();
        let (writer, guard) = batching_writer(sink.clone());
        line(&writer, false, "last access line\n");
        drop(guard);
        assert_eq!(sink.text(), "last access line\n");
    }

    #[test]
    fn lines_past_the_limit_are_dropped_and_counted() {
        /// A sink that blocks until released: the log output is stuck.
        struct Stuck(Arc<(Mutex<bool>, Condvar)>, Sink);
        impl Write for Stuck {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                let (released, cv) = &*self.0;
                let mut released = released.lock().unwrap();
                while !*released {
                    released = cv.wait(released).unwrap();
                }
                self.1.write(bytes)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let sink = Sink::default();
        let (writer, guard) = batching_writer(Stuck(gate.clone(), sink.clone()));
        // The first batch is taken by the writer, which then blocks on the stuck output.
        line(&writer, true, "first\n");
        while !writer.shared.lock().bytes.is_empty() {
            std::thread::yield_now();
        }
        let big = "x".repeat(1024 * 1024 - 1) + "\n";
        for _ in 0..10 {
            line(&writer, false, &big);
        }
        assert!(writer.shared.lock().bytes.len() <= MAX_BUFFERED);
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        drop(guard);
        let text = sink.text();
        assert!(text.starts_with("first\n"));
        assert!(
            text.contains("2 log lines dropped"),
            "no count of the dropped lines in {} bytes",
            text.len()
        );
        assert_eq!(text.matches('x').count(), 8 * (1024 * 1024 - 1));
    }

    /// In a gateway of several stations each line is kept with the station whose span it was
    /// logged in (a task of the station, instrumented with it, or a call in its scope): a
    /// station's `api/application/log` holds only its own, a gateway of one (no station span)
    /// every line.
    #[test]
    fn each_line_is_kept_with_the_station_whose_span_it_was_logged_in() {
        use tracing::Instrument as _;
        let (writer, guard) = batching_writer(std::io::sink());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .fmt_fields(EscapedFields)
            .finish()
            .with(StationSpans);
        let marker = "kept-with-its-station";
        tracing::subscriber::with_default(subscriber, || {
            let st1 = tracing::info_span!(STATION_SPAN, id = "st1");
            let st2 = tracing::info_span!(STATION_SPAN, id = "st2");
            tracing::warn!("{marker}: the gateway's own");
            st1.in_scope(|| tracing::warn!("{marker}: one of st1"));
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(
                async {
                    tokio::task::yield_now().await;
                    tracing::warn!("{marker}: one of st2's task");
                    // A span inside the station's is still the station's.
                    tracing::info_span!("inner")
                        .in_scope(|| tracing::warn!("{marker}: st2, deeper"));
                }
                .instrument(st2.clone()),
            );
            tracing::warn!("{marker}: the gateway's again");
        });
        drop(guard);
        let ours = |station: Option<&str>| -> Vec<String> {
            recent_lines(station, 0)
                .into_iter()
                .filter(|line| line.contains(marker))
                .map(|line| line.split(": ").last().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ours(Some("st1")), ["one of st1"]);
        assert_eq!(ours(Some("st2")), ["one of st2's task", "st2, deeper"]);
        assert_eq!(ours(Some("st3")), Vec::<String>::new());
        assert_eq!(
            ours(None),
            [
                "the gateway's own",
                "one of st1",
                "one of st2's task",
                "st2, deeper",
                "the gateway's again"
            ]
        );
        let st1_line = recent_lines(Some("st1"), 0)
            .into_iter()
            .find(|line| line.contains(marker))
            .unwrap();
        assert!(st1_line.contains("station{id=\"st1\"}:"), "{st1_line}");
    }

    #[test]
    fn the_recent_ring_keeps_the_newest_lines_last() {
        let ring = Mutex::new(VecDeque::new());
        for n in 0..5 {
            keep_recent(&ring, None, format!("line {n}\n").as_bytes(), 3);
        }
        assert_eq!(last_of(&ring, None, 0), ["line 2", "line 3", "line 4"]);
        assert_eq!(last_of(&ring, None, 2), ["line 3", "line 4"]);
        assert_eq!(last_of(&ring, None, 10), ["line 2", "line 3", "line 4"]);
    }
}

//! Where audit lines are kept: two streams, each in rotating files of its own in one
//! directory — the changes in `changes.log` (then `changes.log.1` the newest full one ...
//! `changes.log.{N-1}` the oldest), every other request in `audit.log` (the same way), so
//! that reads never rotate a change out — or, without a directory, memory only, each stream
//! holding one file's worth of lines at most. [`merged_in_time_order`] reads them as one trail.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The current file of requests that changed nothing, in the audit directory.
pub const REQUESTS: &str = "audit.log";
/// The current file of changes (every change, refused ones included, and the lease's own
/// lines): the stream synced before a change is answered.
pub const CHANGES: &str = "changes.log";

/// The length of a line's timestamp (`2026-05-29 14:23:01.442`), by which streams merge.
const TIMESTAMP_LEN: usize = 23;

/// What the writer thread appends to and syncs.
pub trait Sink: Send + 'static {
    /// Appends whole lines (each ending in `\n`), rotating first when they would not fit.
    fn append(&mut self, lines: &[u8]) -> io::Result<()>;
    /// Makes everything appended so far durable.
    fn sync(&mut self) -> io::Result<()>;
}

/// Rotating files in a directory.
pub struct RotatingFiles {
    dir: PathBuf,
    /// The current file's name ([`REQUESTS`] or [`CHANGES`]).
    name: &'static str,
    file: File,
    size: u64,
    max_bytes: u64,
    files: u32,
    /// Set once the current file has lines not yet synced.
    dirty: bool,
}

impl RotatingFiles {
    /// Opens (creating) `dir/{name}` for appending.
    pub fn open(
        dir: &Path,
        name: &'static str,
        max_bytes: u64,
        files: u32,
    ) -> io::Result<RotatingFiles> {
        fs::create_dir_all(dir)?;
        let file = open_current(dir, name)?;
        let size = file.metadata()?.len();
        Ok(RotatingFiles {
            dir: dir.to_owned(),
            name,
            file,
            size,
            max_bytes,
            files: files.max(1),
            dirty: false,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        if !bytes.is_empty() {
            self.file.write_all(bytes)?;
            self.size += bytes.len() as u64;
            self.dirty = true;
        }
        Ok(())
    }

    fn path(&self, index: u32) -> PathBuf {
        rotated_path(&self.dir, self.name, index)
    }

    /// `audit.log` → `audit.log.1` → ... (or `changes.log` ...); the oldest beyond the count is removed. The full
    /// file is synced first, and the directory after, so no synced line is lost on the way.
    fn rotate(&mut self) -> io::Result<()> {
        self.file.sync_all()?;
        self.dirty = false;
        let last = self.files - 1;
        if last == 0 {
            fs::remove_file(self.path(0))?;
        } else {
            match fs::remove_file(self.path(last)) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
            for index in (0..last).rev() {
                match fs::rename(self.path(index), self.path(index + 1)) {
                    Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
                    _ => {}
                }
            }
        }
        self.file = open_current(&self.dir, self.name)?;
        self.size = 0;
        sync_dir(&self.dir)
    }
}

impl Sink for RotatingFiles {
    fn append(&mut self, lines: &[u8]) -> io::Result<()> {
        // Consecutive lines that fit go out in one write; a line that would not fit in the
        // current file starts the next one (a file holds at least one line).
        let (mut from, mut at) = (0, 0);
        for line in lines.split_inclusive(|b| *b == b'\n') {
            let pending = (at - from) as u64;
            if self.size + pending > 0 && self.size + pending + line.len() as u64 > self.max_bytes {
                self.write(&lines[from..at])?;
                self.rotate()?;
                from = at;
            }
            at += line.len();
        }
        self.write(&lines[from..at])
    }

    fn sync(&mut self) -> io::Result<()> {
        if self.dirty {
            self.file.sync_data()?;
            self.dirty = false;
        }
        Ok(())
    }
}

fn open_current(dir: &Path, name: &str) -> io::Result<File> {
    let existed = dir.join(name).exists();
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))?;
    if !existed {
        // The new file's name is durable too.
        sync_dir(dir)?;
    }
    Ok(file)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `name` (`audit.log`) for 0, `audit.log.N` for N.
pub fn rotated_path(dir: &Path, name: &str, index: u32) -> PathBuf {
    if index == 0 {
        dir.join(name)
    } else {
        dir.join(format!("{name}.{index}"))
    }
}

/// The last `tail` lines of the current file `name` (`0`: all of them), read from disk. A
/// line cut by a crash mid-write (no newline yet) is left out.
pub fn tail_of_file(dir: &Path, name: &str, tail: usize) -> io::Result<Vec<String>> {
    tail_of_file_where(dir, name, tail, |_| true)
}

/// The last `tail` lines of the current file `name` that `keep` accepts (`0`: all of them),
/// read back from the end only as far as needed to find them.
pub fn tail_of_file_where(
    dir: &Path,
    name: &str,
    tail: usize,
    keep: impl Fn(&[u8]) -> bool,
) -> io::Result<Vec<String>> {
    let mut file = match File::open(dir.join(name)) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let len = file.metadata()?.len();
    // Lines are short: read back from the end only as far as needed.
    let mut start = if tail == 0 {
        0
    } else {
        len.saturating_sub(512 * tail as u64 + 4096)
    };
    loop {
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::with_capacity((len - start) as usize);
        Read::by_ref(&mut file)
            .take(len - start)
            .read_to_end(&mut bytes)?;
        let complete = match bytes.iter().rposition(|b| *b == b'\n') {
            Some(at) => &bytes[..=at],
            None => &bytes[..0],
        };
        let mut lines: Vec<&[u8]> = complete.split(|b| *b == b'\n').collect();
        lines.pop(); // after the last newline
        if start > 0 && !lines.is_empty() {
            lines.remove(0); // maybe cut at `start`
        }
        lines.retain(|line| keep(line));
        if tail == 0 || lines.len() >= tail || start == 0 {
            let from = if tail == 0 {
                0
            } else {
                lines.len().saturating_sub(tail)
            };
            return Ok(lines[from..]
                .iter()
                .map(|line| String::from_utf8_lossy(line).into_owned())
                .collect());
        }
        start = start.saturating_sub((len - start).max(4096));
    }
}

/// Memory only (no `[audit] dir`): the current "file", at most `max_bytes`, as one text of
/// lines each ending in a newline (a line appended is copied once, not kept as a string of its
/// own: every request has one).
#[derive(Default)]
pub struct MemoryLines {
    text: String,
    max_bytes: u64,
}

impl MemoryLines {
    pub fn new(max_bytes: u64) -> MemoryLines {
        MemoryLines {
            max_bytes,
            ..MemoryLines::default()
        }
    }

    /// Appends `line` (without its newline).
    pub fn push(&mut self, line: &str) {
        let len = line.len() as u64 + 1;
        if !self.text.is_empty() && self.text.len() as u64 + len > self.max_bytes {
            // Rotated out, as a file would be.
            self.text.clear();
        }
        self.text.push_str(line);
        self.text.push('\n');
    }

    /// Appends a batch of lines, each ending in a newline, as [`MemoryLines::push`] of each
    /// non-empty one would: at once when it fits and holds no empty line (a batch of rendered
    /// lines always does), one line at a time otherwise (so a cached read's line is never
    /// split off its batch and copied on its own).
    pub fn push_lines(&mut self, lines: &str) {
        let whole = lines.ends_with('\n') && !lines.starts_with('\n') && !lines.contains("\n\n");
        if whole && self.text.len() as u64 + lines.len() as u64 <= self.max_bytes {
            self.text.push_str(lines);
            return;
        }
        for line in lines.split('\n').filter(|line| !line.is_empty()) {
            self.push(line);
        }
    }

    /// The last `tail` lines (`0`: all), oldest first.
    pub fn tail(&self, tail: usize) -> Vec<String> {
        self.tail_where(tail, |_| true)
    }

    /// The last `tail` lines that `keep` accepts (`0`: all of them), oldest first.
    pub fn tail_where(&self, tail: usize, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let lines = self.text.split_terminator('\n').filter(|line| keep(line));
        let skip = match tail {
            0 => 0,
            _ => lines.clone().count().saturating_sub(tail),
        };
        lines.skip(skip).map(str::to_owned).collect()
    }
}

/// The lines of both streams as one trail in time order (by their timestamps; each stream's
/// own order kept, a request's line before a change's of the same millisecond), its last
/// `tail` (`0`: all).
pub fn merged_in_time_order(
    requests: Vec<String>,
    changes: Vec<String>,
    tail: usize,
) -> Vec<String> {
    fn stamp(line: &str) -> &str {
        line.get(..TIMESTAMP_LEN).unwrap_or(line)
    }
    let mut merged = Vec::with_capacity(requests.len() + changes.len());
    let (mut requests, mut changes) = (
        requests.into_iter().peekable(),
        changes.into_iter().peekable(),
    );
    loop {
        let take_request = match (requests.peek(), changes.peek()) {
            (Some(request), Some(change)) => stamp(request) <= stamp(change),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_request {
            requests.next()
        } else {
            changes.next()
        };
        merged.extend(next);
    }
    if tail != 0 && merged.len() > tail {
        merged.drain(..merged.len() - tail);
    }
    merged
}

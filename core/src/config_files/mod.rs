//! Station configuration files: the station's channel configuration and the values of its
//! writable settings, kept by name in a directory of the gateway's own (`[config_files] dir`).
//!
//! - `format`: the file format (TOML, `format_version = 1`).
//! - `settings`: a channel's configuration as people write it, made CONFIGURE settings.
//! - `plan`: a load checked whole and put in order (HV outputs last); a save's snapshot.
//! - `apply`: save and load against the station, through the station service.
//!
//! This module keeps the directory: plain file names only, writes that are atomic
//! (temporary file, fsync, rename, fsync of the directory), and what was loaded when.
//!
//! One save or load runs at a time (a tokio `Mutex`), each going through the station service
//! like any other change.

mod apply;
pub mod format;
pub mod plan;
pub mod settings;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::config::ConfigFilesConfig;
use crate::error_kind::ErrorKind;
use crate::link::LinkError;

pub use apply::{LoadReport, configs_of, load, save};

/// The longest file name accepted (bytes).
pub const MAX_NAME_LEN: usize = 64;

/// What went wrong with a configuration file; its kind is [`ConfigFileError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("bad configuration file name {0:?}: {1}")]
    BadName(String, &'static str),
    #[error("configuration file {0:?} not found")]
    NotFound(String),
    #[error("the configuration file is {size} bytes, over the {limit}-byte limit")]
    TooLarge { size: usize, limit: usize },
    /// The file (uploaded, or the one to load) is not a configuration this station can take.
    #[error("{0}")]
    BadFile(String),
    /// The station could not be asked or did not answer; nothing was changed.
    #[error("{context}: {error}")]
    Station { context: String, error: LinkError },
    /// A load stopped partway: exactly what was applied and what was not.
    #[error(transparent)]
    Stopped(Box<LoadStopped>),
    /// The caller stopped waiting for the load, which goes on to its end.
    #[error(transparent)]
    StillRunning(crate::station::StillRunning),
    /// The station is not connected: nothing was asked or changed.
    #[error("{0}")]
    NotReached(String),
    /// The station refused a read a save needed.
    #[error("{0}")]
    ReadFailed(String),
    /// The gateway's own directory failed it.
    #[error("configuration files directory: {0}")]
    Io(String),
}

impl ConfigFileError {
    /// Its kind: a bad name or file is the client's (bad request, too large), an unknown name
    /// not found, the station's and the link's as theirs, the gateway's directory internal.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ConfigFileError::BadName(..) | ConfigFileError::BadFile(_) => ErrorKind::BadRequest,
            ConfigFileError::NotFound(_) => ErrorKind::NotFound,
            ConfigFileError::TooLarge { .. } => ErrorKind::TooLarge,
            ConfigFileError::NotReached(_) => ErrorKind::StationNotReached,
            ConfigFileError::ReadFailed(_) => ErrorKind::StationFailed,
            ConfigFileError::Station { error, .. } => error.kind(),
            ConfigFileError::Stopped(stopped) => stopped.error.kind(),
            ConfigFileError::Io(_) => ErrorKind::Internal,
            ConfigFileError::StillRunning(still) => still.kind(),
        }
    }
}

/// Where a load stopped, what it had applied and what it had not.
#[derive(Debug, thiserror::Error)]
#[error(
    "loading {file} stopped at step {step} of {total} ({failed}): {error}. Applied before it: {applied}. Not applied: that step (its outcome is as the error says) and the {rest} after it"
)]
pub struct LoadStopped {
    pub file: String,
    pub step: usize,
    pub total: usize,
    pub failed: String,
    pub error: LinkError,
    pub applied: String,
    pub rest: usize,
}

/// The last configuration loaded, for the status page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub name: String,
    pub at: SystemTime,
    /// The station link's generation it was loaded in.
    pub generation: u64,
}

/// The directory of configuration files and what was loaded from it. Cheap to clone (a load
/// runs as a task of its own, so a caller that goes away does not cut it short).
#[derive(Debug, Clone)]
pub struct ConfigFiles {
    dir: PathBuf,
    max_file_bytes: usize,
    loaded: Arc<Mutex<Vec<Loaded>>>,
    temp_counter: Arc<AtomicU64>,
    /// One save or load at a time: a load is one sequence, never interleaved with another.
    pub(crate) busy: Arc<tokio::sync::Mutex<()>>,
}

/// Checks that `name` is a plain file name: no path, no `..`, printable, not too long.
pub fn check_name(name: &str) -> Result<(), ConfigFileError> {
    let bad = |why| Err(ConfigFileError::BadName(name.to_owned(), why));
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("it is longer than 64 bytes");
    }
    if name.contains('/') || name.contains('\\') {
        return bad("a path separator is not allowed: give a plain file name");
    }
    if name.contains("..") {
        return bad("\"..\" is not allowed");
    }
    if name.starts_with('.') || name.starts_with(' ') || name.ends_with(' ') {
        return bad("it may not start with a dot or start or end with a space");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ' | '+' | '@'))
    {
        return bad("only letters, digits, space and . - _ + @ are allowed");
    }
    Ok(())
}

fn io(error: std::io::Error) -> ConfigFileError {
    ConfigFileError::Io(error.to_string())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ConfigFileError> + Send + 'static,
) -> Result<T, ConfigFileError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| ConfigFileError::Io(error.to_string()))?
}

impl ConfigFiles {
    pub fn new(config: &ConfigFilesConfig) -> ConfigFiles {
        ConfigFiles {
            dir: config.dir.clone(),
            max_file_bytes: config.max_file_bytes,
            loaded: Arc::new(Mutex::new(Vec::new())),
            temp_counter: Arc::new(AtomicU64::new(0)),
            busy: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    pub fn max_file_bytes(&self) -> usize {
        self.max_file_bytes
    }

    /// The files' names, sorted.
    pub async fn list(&self) -> Result<Vec<String>, ConfigFileError> {
        let dir = self.dir.clone();
        blocking(move || {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
                Err(error) => return Err(io(error)),
            };
            let mut names: Vec<String> = entries
                .filter_map(Result::ok)
                .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
                .filter_map(|entry| entry.file_name().into_string().ok())
                .filter(|name| check_name(name).is_ok())
                .collect();
            names.sort();
            Ok(names)
        })
        .await
    }

    /// A file's bytes; `NotFound` when there is none of that name.
    pub async fn read(&self, name: &str) -> Result<Vec<u8>, ConfigFileError> {
        check_name(name)?;
        let (path, owned) = (self.dir.join(name), name.to_owned());
        blocking(move || match std::fs::read(&path) {
            Ok(bytes) => Ok(bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                Err(ConfigFileError::NotFound(owned))
            }
            Err(error) => Err(io(error)),
        })
        .await
    }

    /// Writes a file atomically: a temporary file beside it, fsync, rename over the old one,
    /// fsync of the directory. A reader sees the old file or the new one, never part of one.
    pub async fn write(&self, name: &str, bytes: Vec<u8>) -> Result<(), ConfigFileError> {
        check_name(name)?;
        let count = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let temp = format!(".{name}.{}-{count}.tmp", std::process::id());
        let (dir, name) = (self.dir.clone(), name.to_owned());
        blocking(move || write_atomically(&dir, &name, &temp, &bytes).map_err(io)).await
    }

    /// Deletes a file; `NotFound` when there is none of that name.
    pub async fn delete(&self, name: &str) -> Result<(), ConfigFileError> {
        check_name(name)?;
        let (dir, owned) = (self.dir.clone(), name.to_owned());
        blocking(move || match std::fs::remove_file(dir.join(&owned)) {
            Ok(()) => sync_dir(&dir).map_err(io),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                Err(ConfigFileError::NotFound(owned))
            }
            Err(error) => Err(io(error)),
        })
        .await
    }

    /// The names loaded in station link generation `generation`, in the order loaded (a name
    /// loaded again moves to the end).
    pub fn loaded_in(&self, generation: u64) -> Vec<String> {
        self.loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .filter(|loaded| loaded.generation == generation)
            .map(|loaded| loaded.name.clone())
            .collect()
    }

    /// The last configuration loaded, in any generation: for the status page.
    pub fn last_loaded(&self) -> Option<Loaded> {
        self.loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .last()
            .cloned()
    }

    /// [`ConfigFiles::last_loaded`] for `status.json`: `{name, at, generation}` or null.
    pub fn last_loaded_json(&self) -> serde_json::Value {
        match self.last_loaded() {
            Some(loaded) => serde_json::json!({
                "name": loaded.name,
                "at": crate::lease::rfc3339(loaded.at),
                "generation": loaded.generation,
            }),
            None => serde_json::Value::Null,
        }
    }

    fn record_loaded(&self, name: &str, generation: u64) {
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        loaded.retain(|l| l.generation == generation && l.name != name);
        loaded.push(Loaded {
            name: name.to_owned(),
            at: SystemTime::now(),
            generation,
        });
    }
}

fn write_atomically(dir: &Path, name: &str, temp: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let temp_path = dir.join(temp);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp_path)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp_path, dir.join(name))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp_path);
    }
    written?;
    sync_dir(dir)
}

/// Makes a rename or removal in `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_are_taken() {
        for good in ["factory.cfg", "current_state.cfg", "HV setup 2", "a+b@c-d"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        let long = "x".repeat(65);
        for bad in [
            "",
            "../x",
            "a/b",
            "a\\b",
            "..",
            "a..b",
            ".hidden",
            " x",
            "x ",
            "x\n",
            "é.cfg",
            long.as_str(),
        ] {
            assert!(
                matches!(check_name(bad), Err(ConfigFileError::BadName(..))),
                "{bad:?}"
            );
        }
        assert!(check_name(&"x".repeat(64)).is_ok());
    }

    #[tokio::test]
    async fn files_are_written_whole_listed_read_and_deleted() {
        let dir = std::env::temp_dir().join(format!("config-files-test-{}", std::process::id()));
        let files = ConfigFiles::new(&ConfigFilesConfig {
            dir: dir.join("nested"),
            max_file_bytes: 4096,
        });
        assert_eq!(files.list().await.unwrap(), Vec::<String>::new());
        files.write("b.cfg", b"one".to_vec()).await.unwrap();
        files.write("a.cfg", b"two".to_vec()).await.unwrap();
        files.write("b.cfg", b"three".to_vec()).await.unwrap();
        assert_eq!(files.list().await.unwrap(), ["a.cfg", "b.cfg"]);
        assert_eq!(files.read("b.cfg").await.unwrap(), b"three");
        // No temporary file is left behind.
        let all = std::fs::read_dir(dir.join("nested")).unwrap().count();
        assert_eq!(all, 2);
        files.delete("a.cfg").await.unwrap();
        assert!(matches!(
            files.delete("a.cfg").await,
            Err(ConfigFileError::NotFound(_))
        ));
        assert!(matches!(
            files.read("nope").await,
            Err(ConfigFileError::NotFound(_))
        ));
        assert!(matches!(
            files.read("../etc/passwd").await,
            Err(ConfigFileError::BadName(..))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loaded_lists_this_generation_only_with_the_latest_last() {
        let files = ConfigFiles::new(&ConfigFilesConfig::default());
        files.record_loaded("a", 1);
        files.record_loaded("b", 1);
        files.record_loaded("a", 1);
        assert_eq!(files.loaded_in(1), ["b", "a"]);
        files.record_loaded("c", 2);
        assert_eq!(files.loaded_in(1), Vec::<String>::new());
        assert_eq!(files.loaded_in(2), ["c"]);
        assert_eq!(files.last_loaded().unwrap().name, "c");
    }
}

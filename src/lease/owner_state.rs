//! This gateway's instance on its host: a small state file (`[lease] link_owner_state`), locked
//! (`flock`) for the life of the process, that keeps the link-owner lease's token. A gateway
//! restarted after a crash (`kill -9`, a power cut) takes its own lease back at once with that
//! token instead of waiting for it to lapse; a second process given the same file is refused
//! while the first runs, by the operating system's lock.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::store::LeaseToken;

/// Why the state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OwnerStateError {
    #[error(
        "another gateway process on this host holds {path} ([lease] link_owner_state): only one process may use it; stop the other one or give this one its own file"
    )]
    Busy { path: PathBuf },
    #[error("cannot use the link-owner state file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The open, locked state file.
#[derive(Debug)]
pub struct OwnerState {
    file: File,
    path: PathBuf,
}

impl OwnerState {
    /// Opens (or creates, readable by its owner only) and locks `path`.
    pub fn open(path: &Path) -> Result<OwnerState, OwnerStateError> {
        let io = |source| OwnerStateError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(OwnerState {
                file,
                path: path.to_owned(),
            }),
            Err(TryLockError::WouldBlock) => Err(OwnerStateError::Busy {
                path: path.to_owned(),
            }),
            Err(TryLockError::Error(error)) => Err(io(error)),
        }
    }

    /// What the file holds: the link-owner lease's token on its first line, then a line
    /// `station TOKEN IDENTITY` for the station's own lease.
    fn contents(&mut self) -> String {
        let mut text = String::new();
        if self.file.seek(SeekFrom::Start(0)).is_ok() {
            let _ = self.file.read_to_string(&mut text);
        }
        text
    }

    /// The token an earlier run of this gateway kept, if any.
    pub fn token(&mut self) -> Option<LeaseToken> {
        let text = self.contents();
        let token = text.lines().next()?.trim();
        is_token(token).then(|| LeaseToken::from_text(token))
    }

    /// The token of the lease an earlier run held for the station `identity`, if any.
    pub fn station_token(&mut self, identity: &str) -> Option<LeaseToken> {
        self.contents().lines().find_map(|line| {
            let (token, kept) = line.strip_prefix("station ")?.split_once(' ')?;
            (kept == identity && is_token(token)).then(|| LeaseToken::from_text(token))
        })
    }

    /// Keeps `token` (and the station lease's, if any) for the next run, on disk when this
    /// returns.
    pub fn remember(
        &mut self,
        token: &LeaseToken,
        station: Option<(&str, &LeaseToken)>,
    ) -> Result<(), OwnerStateError> {
        let mut text = format!("{}\n", token.as_str());
        if let Some((identity, station_token)) = station {
            text.push_str(&format!("station {} {identity}\n", station_token.as_str()));
        }
        let io = |source| OwnerStateError::Io {
            path: self.path.clone(),
            source,
        };
        self.file.set_len(0).map_err(io)?;
        self.file.seek(SeekFrom::Start(0)).map_err(io)?;
        self.file.write_all(text.as_bytes()).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

fn is_token(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of a test's own, removed when the test ends.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("sg-owner-state-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Scratch(dir)
        }

        fn file(&self) -> PathBuf {
            self.0.join("link-owner.state")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_token_kept_is_read_back_by_the_next_run() {
        let scratch = Scratch::new("kept");
        let path = scratch.file();
        let mut first = OwnerState::open(&path).unwrap();
        assert!(first.token().is_none(), "a new file keeps nothing");
        let token = LeaseToken::random();
        first.remember(&token, None).unwrap();
        drop(first);
        let mut next = OwnerState::open(&path).unwrap();
        assert_eq!(next.token(), Some(token));
        let newer = LeaseToken::random();
        let station = LeaseToken::random();
        next.remember(&newer, Some(("ESH 42 serial 7", &station)))
            .unwrap();
        assert_eq!(next.token(), Some(newer), "a newer token replaces it whole");
        assert_eq!(next.station_token("ESH 42 serial 7"), Some(station));
        assert_eq!(next.station_token("another station"), None);
    }

    #[test]
    fn a_second_holder_of_the_file_is_refused_while_the_first_lives() {
        let scratch = Scratch::new("busy");
        let path = scratch.file();
        let first = OwnerState::open(&path).unwrap();
        let second = OwnerState::open(&path);
        assert!(
            matches!(&second, Err(OwnerStateError::Busy { .. })),
            "{second:?}"
        );
        assert!(second.unwrap_err().to_string().contains("link_owner_state"));
        drop(first);
        assert!(
            OwnerState::open(&path).is_ok(),
            "free once the first is gone"
        );
    }

    #[test]
    fn a_file_that_holds_no_token_gives_none() {
        let scratch = Scratch::new("garbage");
        let path = scratch.file();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "not a token\n").unwrap();
        assert!(OwnerState::open(&path).unwrap().token().is_none());
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let scratch = Scratch::new("mode");
        let path = scratch.file();
        let _state = OwnerState::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}

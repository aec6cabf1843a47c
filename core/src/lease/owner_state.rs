//! This gateway's instance on its host: a small state file (`[lease] link_owner_state`), locked
//! (`flock`) for the life of the process, that keeps the tokens of both its link-owner leases:
//! the one named after the control lease and the station's own (named after its identity). A
//! gateway restarted after a crash (`kill -9`, a power cut) takes both back at once with those
//! tokens instead of waiting for them to lapse; a second process given the same file is
//! refused while the first runs, by the operating system's lock.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::store::LeaseToken;
use crate::config::identity_key;

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

/// The open, locked state file, and what it keeps.
#[derive(Debug)]
pub struct OwnerState {
    file: File,
    path: PathBuf,
    kept: Kept,
}

/// The tokens the file keeps: the link-owner lease's, and the station's own lease's with the
/// station's identity (as its lease names it, [`identity_key`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Kept {
    link: Option<LeaseToken>,
    station: Option<(String, LeaseToken)>,
}

impl Kept {
    /// The file's text: the link-owner lease's token on its first line (empty when none), then
    /// a line `station TOKEN IDENTITY` for the station's own lease.
    fn parse(text: &str) -> Kept {
        let mut lines = text.lines();
        let link = lines
            .next()
            .map(str::trim)
            .filter(|token| is_token(token))
            .map(LeaseToken::from_text);
        let station = lines.find_map(|line| {
            let (token, identity) = line.strip_prefix("station ")?.split_once(' ')?;
            is_token(token).then(|| (identity_key(identity), LeaseToken::from_text(token)))
        });
        Kept { link, station }
    }

    fn text(&self) -> String {
        let mut text = format!(
            "{}\n",
            self.link
                .as_ref()
                .map(LeaseToken::as_str)
                .unwrap_or_default()
        );
        if let Some((identity, token)) = &self.station {
            text.push_str(&format!("station {} {identity}\n", token.as_str()));
        }
        text
    }
}

impl OwnerState {
    /// Opens (or creates, readable by its owner only) and locks `path`, and reads what an
    /// earlier run kept there.
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
        let mut file = options.open(path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(OwnerStateError::Busy {
                    path: path.to_owned(),
                });
            }
            Err(TryLockError::Error(error)) => return Err(io(error)),
        }
        let mut text = String::new();
        // A file that cannot be read as text keeps nothing (the leases are then waited out).
        if file.read_to_string(&mut text).is_err() {
            text.clear();
        }
        Ok(OwnerState {
            file,
            path: path.to_owned(),
            kept: Kept::parse(&text),
        })
    }

    /// The link-owner lease's token an earlier run of this gateway kept, if any.
    pub fn token(&self) -> Option<LeaseToken> {
        self.kept.link.clone()
    }

    /// The token of the lease an earlier run held for the station `identity` (compared after
    /// [`identity_key`]), if any.
    pub fn station_token(&self, identity: &str) -> Option<LeaseToken> {
        let (kept, token) = self.kept.station.as_ref()?;
        (*kept == identity_key(identity)).then(|| token.clone())
    }

    /// Keeps the link-owner lease's `token` for the next run (the station's lease's, kept
    /// before, stays), on disk when this returns.
    pub fn remember_link(&mut self, token: &LeaseToken) -> Result<(), OwnerStateError> {
        let kept = Kept {
            link: Some(token.clone()),
            ..self.kept.clone()
        };
        self.write(kept)
    }

    /// Keeps the token of the lease of the station `identity` for the next run (in place of
    /// any other station's; the link-owner lease's stays), on disk when this returns.
    pub fn remember_station(
        &mut self,
        identity: &str,
        token: &LeaseToken,
    ) -> Result<(), OwnerStateError> {
        let kept = Kept {
            station: Some((identity_key(identity), token.clone())),
            ..self.kept.clone()
        };
        self.write(kept)
    }

    fn write(&mut self, kept: Kept) -> Result<(), OwnerStateError> {
        let io = |source| OwnerStateError::Io {
            path: self.path.clone(),
            source,
        };
        let text = kept.text();
        self.file.set_len(0).map_err(io)?;
        self.file.seek(SeekFrom::Start(0)).map_err(io)?;
        self.file.write_all(text.as_bytes()).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        self.kept = kept;
        Ok(())
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
        first.remember_link(&token).unwrap();
        drop(first);
        let mut next = OwnerState::open(&path).unwrap();
        assert_eq!(next.token(), Some(token));
        let newer = LeaseToken::random();
        let station = LeaseToken::random();
        next.remember_link(&newer).unwrap();
        next.remember_station("ESH 42 serial 7", &station).unwrap();
        assert_eq!(
            next.token(),
            Some(newer.clone()),
            "a newer token replaces it"
        );
        assert_eq!(next.station_token("ESH 42 serial 7"), Some(station.clone()));
        assert_eq!(
            next.station_token("  esh 42   SERIAL 7 "),
            Some(station.clone()),
            "identities compared after normalising case and spaces"
        );
        assert_eq!(next.station_token("another station"), None);
        drop(next);
        let reread = OwnerState::open(&path).unwrap();
        assert_eq!(reread.token(), Some(newer));
        assert_eq!(reread.station_token("ESH 42 serial 7"), Some(station));
    }

    /// Both tokens kept across a crash restart.
    /// Taking the link-owner lease back once wrote its token alone,
    /// and the station's, needed right after HELLO, was gone: the restart then waited for the
    /// station's lease to lapse.
    #[test]
    fn keeping_the_link_owner_token_keeps_the_station_token_beside_it() {
        let scratch = Scratch::new("both");
        let path = scratch.file();
        let (link, station) = (LeaseToken::random(), LeaseToken::random());
        let mut crashed = OwnerState::open(&path).unwrap();
        crashed.remember_link(&link).unwrap();
        crashed.remember_station("HVS-3 ESH1", &station).unwrap();
        drop(crashed);
        let mut restarted = OwnerState::open(&path).unwrap();
        // The restart takes its link-owner lease back first, and keeps the token again.
        restarted.remember_link(&link).unwrap();
        assert_eq!(restarted.station_token("HVS-3 ESH1"), Some(station.clone()));
        drop(restarted);
        let next = OwnerState::open(&path).unwrap();
        assert_eq!(next.token(), Some(link));
        assert_eq!(next.station_token("HVS-3 ESH1"), Some(station));
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

//! The `[audit]` section of the config: where the audit trail is kept and how it rotates.

use std::path::PathBuf;

use serde::Deserialize;

/// The audit trail (`audit/`): rotating files of every request and every change.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// Where the files are kept; empty: `$STATE_DIRECTORY/audit` when systemd gives the
    /// service a state directory, else memory only (lost when the gateway stops).
    pub dir: String,
    /// The size of one file of requests that changed nothing (`audit.log`) before it is
    /// rotated.
    pub file_bytes: u64,
    /// How many of those files are kept, the current one included.
    pub files: u32,
    /// The size of one file of changes (`changes.log`) before it is rotated: changes have a
    /// rotation of their own, so read load never rotates them out.
    pub change_file_bytes: u64,
    /// How many files of changes are kept, the current one included.
    pub change_files: u32,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            dir: String::new(),
            file_bytes: 1024 * 1024,
            files: 20,
            change_file_bytes: 16 * 1024 * 1024,
            change_files: 64,
        }
    }
}

impl AuditConfig {
    /// The directory the trail is written to; `None`: memory only.
    pub fn directory(&self) -> Option<PathBuf> {
        if !self.dir.is_empty() {
            return Some(PathBuf::from(&self.dir));
        }
        std::env::var_os("STATE_DIRECTORY")
            .filter(|dir| !dir.is_empty())
            .map(|dirs| {
                // systemd may list several, separated by colons: the first is ours.
                let first = dirs
                    .to_string_lossy()
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .to_owned();
                PathBuf::from(first).join("audit")
            })
    }
}

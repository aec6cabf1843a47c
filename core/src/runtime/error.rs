//! Why a station could not start.

use crate::lease::link_owner::LinkOwnerError;

/// Why a station's runtime could not start, each naming the configuration key to look at.
#[derive(Debug, thiserror::Error)]
pub enum StationStartError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("lease.backend: {0}")]
    LeaseBackend(crate::lease::LeaseStoreError),
    #[error("cannot resume the control lease from lease.backend: {0}")]
    LeaseResume(crate::lease::LeaseError),
    #[error("audit.dir: cannot open the audit trail: {0}")]
    Audit(std::io::Error),
    #[error("{0}")]
    LinkOwner(#[from] LinkOwnerError),
    #[error("access.rules: {0}")]
    AccessRules(#[from] crate::access_rules::LoadError),
}

//! The gateway's integration tests, one module per area (each says what it covers in its `//!`
//! line), in one test binary: a cold `cargo test` links the gateway into it once instead of once
//! per file. Kept apart, each a binary of its own: the opt-in long runs (`soak`, `failover_run`,
//! `history_archive`), `station_lease_hold` (it runs another crate's binary), `fuzz_corpus` (it
//! includes the fuzz crate's targets) and `http_hostile` (it counts this process's open file
//! descriptors, which tests running beside it would change).

#[path = "../common/mod.rs"]
mod common;

mod access_rules;
mod application;
mod audit;
mod browser;
mod change_ownership;
mod changes_in_doubt;
mod cli;
mod comm;
mod configuration;
mod consuming_reads;
mod deadband;
mod duties;
mod event_resume;
mod events;
mod faults;
mod fidelity;
mod history;
mod http_answers;
mod http_hygiene;
mod http_timeouts;
mod json_types;
mod lab;
mod lease;
mod lease_backends;
mod lease_end;
mod lease_hangup;
mod lease_invariants;
mod legacy;
mod legacy_hostile;
mod link;
mod link_owner;
mod lock_delay;
mod numeric_results;
mod operations;
mod read_back;
mod safe_state_read_back;
mod safe_stop;
mod standby;
mod standby_restart;
mod status_page;

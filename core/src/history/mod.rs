//! The value history: every value the gateway reads, kept per channel in memory
//! (`recorder`, over the pure `ring`), the channels of `[history] channels` read by a task of
//! its own (`task`), the archive in PostgreSQL (`archive`), and what a query asks for: its
//! samples from memory and the archive (`query`), reduced by the pure `bucket`, its times
//! read by `time_arg`.

pub mod archive;
pub mod bucket;
pub mod query;
pub mod recorder;
pub mod ring;
pub mod task;
pub mod time_arg;

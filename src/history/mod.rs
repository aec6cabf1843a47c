//! The value history: every value the gateway reads, kept per channel in memory
//! (`recorder`, over the pure `ring`), the channels of `[history] channels` read by a task of
//! its own (`task`), and the pure reduction a query asks for (`bucket`, `time_arg`).

pub mod bucket;
pub mod recorder;
pub mod ring;
pub mod task;
pub mod time_arg;

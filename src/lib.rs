//! Station Gateway: the one way to a high-voltage test station.
//!
//! See `ARCHITECTURE.md` for the tasks, the channels between them and who owns what.

pub mod api;
pub mod cache;
pub mod config;
pub mod error;
pub mod events;
pub mod gateway;
pub mod http;
pub mod lease;
pub mod legacy;
pub mod link;
pub mod logs;
pub mod metrics;
pub mod station;

pub use config::Config;
pub use gateway::{GatewayHandle, Listeners, run, start};

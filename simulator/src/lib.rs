//! A simulated high-voltage test station speaking the station byte protocol over TCP or a
//! pseudo-terminal, with fault injection and a log of applied writes for tests.
//!
//! Layers:
//! - [`profile`]: the station described as data (`config/station.toml`), validated.
//! - `station`: the station's state and behaviour, computed from elapsed time.
//! - [`devices`], `buses` and `bus`: the devices on the bus channels, their state as the station
//!   holds it, and the BUS operation on them.
//! - `shared`: the state the listener, the ticker, every connection and every handle share
//!   (the station behind its lock, faults, counters, the write log, the connection registry);
//!   `history`: the bound on the write log and the read-batch statistics.
//! - `connection`: one client link: frames in, concurrent requests, paced and faulted replies out.
//! - [`server`]: [`Simulator::start`], the listener, the trip ticker and the [`SimulatorHandle`].
//! - `sampling`: SAMPLE, a NumericResult channel's acquisition streamed as many frames.
//! - `pty`: a pseudo-terminal master as a byte stream, for the serial path.
//! - [`client`]: a small sequential client used by `station-cli` and the tests.
//! - [`control`]: the line-based control interface of `station-sim --control`.

mod bus;
mod buses;
pub mod client;
mod connection;
pub mod control;
pub mod devices;
mod history;
pub mod profile;
mod pty;
mod reset;
mod sampling;
pub mod server;
mod shared;
mod station;

pub use client::{ClientError, StationClient};
pub use history::DEFAULT_HISTORY_LIMIT;
pub use profile::{ChannelModel, ChannelSpec, InvalidProfile, Profile, ProfileError};
pub use server::{ConnectionId, Simulator, SimulatorHandle, WriteRecord};

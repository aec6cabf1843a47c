//! The simulator: a TCP listener, a trip-checking ticker, and the cloneable [`SimulatorHandle`]
//! through which tests and the control interface inject faults and observe what reached the
//! "hardware". The state they share is `shared.rs`'s.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use station_protocol::{ChangeType, ChannelDescriptor, Notify};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::connection::{self, LinkOptions};
use crate::history::History;
use crate::profile::{ChannelSpec, Profile};
use crate::shared::{Faults, ListenerCommand, Shared, Stats, lock};
use crate::station::Station;

pub use crate::shared::{ConnectionId, WriteRecord};

/// Starts simulators.
pub struct Simulator;

impl Simulator {
    /// Serves `profile` on TCP at `addr` (port 0 picks a free port; see
    /// [`SimulatorHandle::local_addr`]), many connections at once.
    pub async fn start(profile: Profile, addr: SocketAddr) -> io::Result<SimulatorHandle> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (shared, control_rx) = Simulator::shared(profile, local_addr);
        tokio::spawn(run_listener(shared.clone(), listener, control_rx));
        tokio::spawn(run_ticker(shared.clone()));
        tracing::info!(%local_addr, "station simulator listening");
        Ok(SimulatorHandle { shared })
    }

    /// A simulator with no listening socket, served only through
    /// [`SimulatorHandle::serve_stream_as`]: in-process pipes, as the deterministic simulation
    /// of the lab uses (nothing of it touches the network). Its address is `0.0.0.0:0`.
    pub fn in_process(profile: Profile) -> SimulatorHandle {
        let (shared, _control) = Simulator::shared(profile, SocketAddr::from(([0, 0, 0, 0], 0)));
        tokio::spawn(run_ticker(shared.clone()));
        SimulatorHandle { shared }
    }

    fn shared(
        profile: Profile,
        local_addr: SocketAddr,
    ) -> (Arc<Shared>, mpsc::Receiver<ListenerCommand>) {
        let now = Instant::now();
        let (control_tx, control_rx) = mpsc::channel(4);
        let shared = Arc::new(Shared {
            station: Mutex::new(Station::power_on(&profile, now)),
            faults: Faults {
                processing: Mutex::new(profile.station.processing),
                ..Faults::default()
            },
            profile,
            started: now,
            stats: Stats::default(),
            connections: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(0),
            write_log: Mutex::new(History::default()),
            ptys: Mutex::new(HashMap::new()),
            local_addr,
            listener_control: control_tx,
            shutdown: CancellationToken::new(),
            acquiring: crate::shared::Acquiring::default(),
        });
        (shared, control_rx)
    }

    /// Starts a simulator (also on TCP, at a free loopback port) and serves it on a new
    /// pseudo-terminal with window 1; returns the slave device path to open as a serial port.
    pub async fn start_pty(
        profile: Profile,
        baud: Option<u32>,
    ) -> io::Result<(SimulatorHandle, PathBuf)> {
        let handle = Simulator::start(profile, SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let path = handle.attach_pty(baud)?;
        Ok((handle, path))
    }
}

async fn run_listener(
    shared: Arc<Shared>,
    first: TcpListener,
    mut control: mpsc::Receiver<ListenerCommand>,
) {
    let mut listener = Some(first);
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            command = control.recv() => {
                let Some(command) = command else { break };
                let result = if !command.accept {
                    listener = None;
                    Ok(())
                } else if listener.is_some() {
                    Ok(())
                } else {
                    TcpListener::bind(shared.local_addr).await.map(|l| {
                        listener = Some(l);
                    })
                };
                let _ = command.done.send(result);
            }
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let options = LinkOptions {
                        window: shared.profile.station.tcp_window,
                        baud: None,
                        peer: peer.to_string(),
                        stop: None,
                    };
                    tokio::spawn(connection::serve(shared.clone(), stream, options));
                }
                Err(error) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Checks the outputs for trips even when nobody reads them, so NOTIFYs go out on time.
async fn run_ticker(shared: Arc<Shared>) {
    let mut ticks = tokio::time::interval(shared.profile.station.tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // In order: a deterministic simulation replays the same choice.
            biased;
            _ = shared.shutdown.cancelled() => break,
            _ = ticks.tick() => {
                shared.lock_station().advance(Instant::now());
                shared.flush_notifies();
            }
        }
    }
}

/// A cheap, cloneable handle on a running simulator: fault controls and observations.
#[derive(Clone)]
pub struct SimulatorHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SimulatorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatorHandle")
            .field("local_addr", &self.shared.local_addr)
            .finish_non_exhaustive()
    }
}

impl SimulatorHandle {
    /// The TCP address the simulator listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// The profile the simulator was started with.
    pub fn profile(&self) -> &Profile {
        &self.shared.profile
    }

    /// Serves any byte stream (a pipe, a pty, a duplex) as one connection with `window`
    /// requests in flight. The task ends when the stream closes or the connection is dropped.
    pub fn serve_stream<S>(&self, stream: S, window: u16) -> JoinHandle<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let options = LinkOptions {
            window,
            baud: None,
            peer: "stream".to_owned(),
            stop: None,
        };
        tokio::spawn(connection::serve(self.shared.clone(), stream, options))
    }

    /// [`SimulatorHandle::serve_stream`], with `peer` as the write log's name for whoever is
    /// on the other end (a simulated gateway's name).
    pub fn serve_stream_as<S>(&self, stream: S, window: u16, peer: &str) -> JoinHandle<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let options = LinkOptions {
            window,
            baud: None,
            peer: peer.to_owned(),
            stop: None,
        };
        tokio::spawn(connection::serve(self.shared.clone(), stream, options))
    }

    /// Opens a pseudo-terminal and serves it (window 1, paced at `baud` when given);
    /// returns the slave device path. Clients may open and close the slave as often as they like.
    /// [`SimulatorHandle::detach_pty`] closes it again.
    pub fn attach_pty(&self, baud: Option<u32>) -> io::Result<PathBuf> {
        let (master, path) = crate::pty::PtyPort::open()?;
        let shared = self.shared.clone();
        let detached = shared.shutdown.child_token();
        lock(&shared.ptys).insert(path.clone(), detached.clone());
        let master_path = path.clone();
        tokio::spawn(async move {
            // A dropped connection or restart ends a session; the pty stays and is served again
            // until it is detached. The master (the last clone) is closed when this task ends.
            while !detached.is_cancelled() {
                let options = LinkOptions {
                    window: 1,
                    baud,
                    peer: "pty".to_owned(),
                    stop: Some(detached.clone()),
                };
                match master.try_clone() {
                    Ok(port) => connection::serve(shared.clone(), port, options).await,
                    Err(error) => {
                        tracing::warn!("cannot serve the pty {}: {error}", master_path.display())
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Ok(path)
    }

    /// The serial device disappears: ends the pty's session and closes its master, so the
    /// slave device at `path` goes away and a client that has it open sees the line hang up.
    /// False when no pty is attached at `path`. Call [`SimulatorHandle::attach_pty`] for a new one.
    pub fn detach_pty(&self, path: &std::path::Path) -> bool {
        match lock(&self.shared.ptys).remove(path) {
            Some(detached) => {
                detached.cancel();
                true
            }
            None => false,
        }
    }

    /// Closes every open connection now (a pty session restarts, empty).
    pub fn drop_connections(&self) {
        self.shared.drop_connections();
    }

    /// While stalled the station reads requests and ignores them, and sends nothing.
    pub fn set_stall(&self, stalled: bool) {
        self.shared.faults.stalled.store(stalled, Ordering::SeqCst);
    }

    /// Flips one byte of the next reply frame (on any connection) so its CRC fails.
    pub fn corrupt_next_reply(&self) {
        self.shared
            .faults
            .corrupt_next
            .store(true, Ordering::SeqCst);
    }

    /// Flips one byte of the next WRITE reply frame (on any connection) so its CRC fails;
    /// other replies meanwhile stay whole.
    pub fn corrupt_next_write_reply(&self) {
        self.shared
            .faults
            .corrupt_next_write_reply
            .store(true, Ordering::SeqCst);
    }

    /// Holds every reply back this long after it is ready.
    pub fn set_reply_delay(&self, delay: Duration) {
        *lock(&self.shared.faults.reply_delay) = delay;
    }

    /// While `Some(n)`, every BUS reply carries at most `n` of the bytes the bus received: a
    /// short read, as an out-of-date agent gives one.
    pub fn set_bus_read_limit(&self, limit: Option<usize>) {
        *lock(&self.shared.faults.bus_read_limit) = limit;
    }

    /// Time every request takes before it is answered (the profile's `processing_ms`).
    pub fn set_processing_time(&self, processing: Duration) {
        *lock(&self.shared.faults.processing) = processing;
    }

    /// Time every CONFIGURE inquiry (a CONFIGURE without settings) takes before it is
    /// answered: a station slow to say how its channels are configured.
    pub fn set_inquiry_delay(&self, delay: Duration) {
        *lock(&self.shared.faults.inquiry_delay) = delay;
    }

    /// The next WRITE (on any connection) that touches `channel` takes `extra` longer than it
    /// would; later ones do not. One slow request among many, e.g. longer than two of the
    /// gateway's timeouts.
    pub fn delay_next_write_to(&self, channel: &str, extra: Duration) {
        *lock(&self.shared.faults.next_write_extra) = Some((channel.to_owned(), extra));
    }

    /// Whether the delay [`SimulatorHandle::delay_next_write_to`] armed still waits for its
    /// write (no write to its channel has reached the station since).
    pub fn write_delay_armed(&self) -> bool {
        lock(&self.shared.faults.next_write_extra).is_some()
    }

    /// While `true`, the station ignores SPEC.md §4: a request still being worked on when its
    /// connection closes is carried out anyway (a write applied late, its answer never sent),
    /// and the closing connection does not wait for it. A faulty station, for tests of what
    /// the gateway does when a change lands after it reset the link.
    pub fn set_ignores_close(&self, ignores: bool) {
        self.shared
            .faults
            .ignores_close
            .store(ignores, Ordering::SeqCst);
    }

    /// Closes the listening socket (connection attempts are refused) or opens it again on the
    /// same address. Open connections are not touched; see [`SimulatorHandle::power_off`].
    pub async fn set_refuse_connections(&self, refuse: bool) -> io::Result<()> {
        let (done, result) = oneshot::channel();
        let command = ListenerCommand {
            accept: !refuse,
            done,
        };
        let stopped = || io::Error::new(io::ErrorKind::NotConnected, "the simulator has stopped");
        self.shared
            .listener_control
            .send(command)
            .await
            .map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }

    /// The station goes down: connections are dropped and new ones refused.
    pub async fn power_off(&self) -> io::Result<()> {
        self.set_refuse_connections(true).await?;
        self.drop_connections();
        Ok(())
    }

    /// The station comes back from a power cycle: state reset, connections accepted again.
    pub async fn power_on(&self) -> io::Result<()> {
        self.reset_station();
        self.set_refuse_connections(false).await
    }

    /// RESETs the station carried out (SPEC.md §6.10).
    pub fn resets(&self) -> u64 {
        self.shared.stats.resets.load(Ordering::SeqCst)
    }

    /// Requests abandoned because their connection closed before they were carried out
    /// (SPEC.md §4).
    pub fn requests_abandoned(&self) -> u64 {
        self.shared.stats.abandoned.load(Ordering::SeqCst)
    }

    /// Requests the station has read and is still working on (not yet carried out, answered
    /// or abandoned), a closed connection's included: a test waits on this for "the request is
    /// at the station now" before it breaks the link.
    pub fn requests_in_progress(&self) -> u64 {
        self.shared.stats.working.load(Ordering::SeqCst)
    }

    /// A power cycle: every connection dropped, the station back to its power-on state
    /// (outputs off, settings at their defaults, channel list as in the profile).
    pub fn restart(&self) {
        self.drop_connections();
        self.reset_station();
    }

    fn reset_station(&self) {
        let fresh = Station::power_on(&self.shared.profile, Instant::now());
        let mut station = self.shared.lock_station();
        let old = std::mem::replace(&mut *station, fresh);
        station.carry_read_counts_from(old);
    }

    /// Removes a channel and tells every connection (NOTIFY ConfigurationChanged, Removed).
    /// False when there is no such channel.
    pub fn remove_channel(&self, name: &str) -> bool {
        let removed = self.shared.lock_station().remove_channel(name);
        if removed {
            self.shared.broadcast(Notify::ConfigurationChanged {
                change: ChangeType::Removed,
                message: format!("channel {name} removed"),
            });
        }
        removed
    }

    /// Sets an input channel's value, as the hardware would (the door interlock); false when
    /// there is no such stored channel.
    pub fn set_input(&self, name: &str, value: station_protocol::Value) -> bool {
        self.shared.lock_station().set_input(name, value)
    }

    /// The door interlock's channel on the default station.
    pub const DOOR_CLOSED: &'static str = "Interlock.DOOR_CLOSED";

    /// Adds a channel at the end of the list and tells every connection (NOTIFY
    /// ConfigurationChanged, Added). False when the name is taken.
    pub fn add_channel(&self, spec: ChannelSpec) -> bool {
        let name = spec.descriptor.name.clone();
        let added = self.shared.lock_station().add_channel(spec);
        if added {
            self.shared.broadcast(Notify::ConfigurationChanged {
                change: ChangeType::Added,
                message: format!("channel {name} added"),
            });
        }
        added
    }

    /// Adds a plain stored-value channel described by `descriptor`; see [`Self::add_channel`].
    pub fn add_setting_channel(&self, descriptor: ChannelDescriptor) -> bool {
        self.add_channel(ChannelSpec::setting(descriptor))
    }

    /// The writes the station applied, oldest first: every one, unless more than the
    /// history limit ([`crate::DEFAULT_HISTORY_LIMIT`], [`Self::set_history_limit`]) were applied
    /// since the log was cleared; then the newest ([`Self::writes_dropped`] says how many
    /// older ones are gone).
    pub fn write_log(&self) -> Vec<WriteRecord> {
        lock(&self.shared.write_log).to_vec()
    }

    /// How many applied writes the write log dropped to stay within its limit.
    pub fn writes_dropped(&self) -> u64 {
        lock(&self.shared.write_log).dropped()
    }

    /// Empties the write log (and its count of dropped writes).
    pub fn clear_write_log(&self) {
        lock(&self.shared.write_log).clear();
    }

    /// Keeps at most `limit` entries in the write log and in the read-batch statistics
    /// (the oldest beyond it are dropped at once and counted).
    pub fn set_history_limit(&self, limit: usize) {
        lock(&self.shared.write_log).set_limit(limit);
        lock(&self.shared.stats.read_batches).set_limit(limit);
    }

    /// Hardware reads of one channel: READ items and TRANSACT reads.
    pub fn reads_of(&self, name: &str) -> u64 {
        self.shared.lock_station().reads_of(name)
    }

    /// READ frames answered.
    pub fn read_frames(&self) -> u64 {
        self.shared.stats.read_frames.load(Ordering::SeqCst)
    }

    /// The number of names in each READ frame answered, oldest first (the newest, within
    /// the history limit, as [`Self::write_log`]).
    pub fn read_batch_sizes(&self) -> Vec<usize> {
        lock(&self.shared.stats.read_batches).to_vec()
    }

    /// How many READ frames' sizes the read-batch statistics dropped to stay within the limit.
    pub fn read_batches_dropped(&self) -> u64 {
        lock(&self.shared.stats.read_batches).dropped()
    }

    /// Connections open now (a served pty counts as one).
    pub fn connection_count(&self) -> usize {
        lock(&self.shared.connections).len()
    }

    /// Connections (and pty sessions) ever opened.
    pub fn connections_accepted(&self) -> u64 {
        self.shared
            .stats
            .connections_accepted
            .load(Ordering::SeqCst)
    }

    /// Stops listening, closes every connection and ends the simulator's tasks.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
        self.shared.drop_connections();
    }
}

#[cfg(test)]
mod history_tests {
    use std::net::SocketAddr;

    use station_protocol::Value;

    use super::*;
    use crate::station::AppliedWrite;

    /// More than the default history holds, as a demo or a CI soak left running writes.
    const WRITES: usize = 130_000;

    async fn simulator() -> SimulatorHandle {
        Simulator::start(
            Profile::default_station(),
            SocketAddr::from(([127, 0, 0, 1], 0)),
        )
        .await
        .unwrap()
    }

    fn write(n: usize) -> Vec<AppliedWrite> {
        vec![AppliedWrite {
            channel: "0.4.ESH10000662.VSET1".to_owned(),
            value: Value::Integer(i64::try_from(n).unwrap()),
        }]
    }

    #[tokio::test]
    async fn the_write_log_and_the_read_batches_keep_the_newest_entries_and_count_the_dropped() {
        let sim = simulator().await;
        for n in 0..WRITES {
            sim.shared.log_writes(write(n), ConnectionId(1), "soak");
            sim.shared.record_batch(n % 7 + 1);
        }
        let log = sim.write_log();
        assert_eq!(
            log.len(),
            100_000,
            "the write log grew with every write: {} entries",
            log.len()
        );
        assert_eq!(
            log.last().map(|w| w.value.render()),
            Some((WRITES - 1).to_string())
        );
        assert_eq!(
            log.first().map(|w| w.value.render()),
            Some((WRITES - 100_000).to_string()),
            "the oldest were dropped"
        );
        assert_eq!(sim.writes_dropped(), (WRITES - 100_000) as u64);
        let batches = sim.read_batch_sizes();
        assert_eq!(batches.len(), 100_000, "the read-batch statistics grew");
        assert_eq!(sim.read_batches_dropped(), (WRITES - 100_000) as u64);
        assert_eq!(crate::DEFAULT_HISTORY_LIMIT, 100_000);
        // A smaller limit, as the control port's `history N` sets it, trims at once.
        sim.set_history_limit(10);
        assert_eq!(sim.write_log().len(), 10);
        assert_eq!(sim.writes_dropped(), (WRITES - 10) as u64);
        assert_eq!(sim.read_batch_sizes().len(), 10);
        sim.clear_write_log();
        assert_eq!((sim.write_log().len(), sim.writes_dropped()), (0, 0));
        sim.shutdown();
    }
}

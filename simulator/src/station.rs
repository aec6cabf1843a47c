//! The simulated station's state and behaviour: what a read returns and what a write does.
//!
//! Everything is computed from the elapsed time passed in as `now`, so the model has no task of
//! its own and unit tests can step time exactly. The server holds one [`Station`] behind a
//! mutex and touches it only in short, non-async sections.

use std::collections::{HashMap, VecDeque};
use std::f64::consts::TAU;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use station_protocol::{ChannelDescriptor, ErrorCode, Notify, StationError, Value, ValueType};
use tokio::time::Instant;

mod configure;

use crate::profile::{
    AnalogModel, ChannelModel, ChannelSpec, HvRole, OutputSpec, Profile, STAT_OPTIONS, numeric,
};

/// The largest receive buffer a bus channel keeps; older bytes are dropped beyond it.
const RECEIVE_BUFFER_LIMIT: usize = 4096;

/// A VMON this close to its target counts as arrived (STAT `On`).
const ARRIVED_TOLERANCE_V: f64 = 0.0005;

/// One high-voltage output's state.
#[derive(Debug, Clone)]
struct OutputState {
    spec: OutputSpec,
    vset: f64,
    iset: f64,
    ramp: f64,
    on: bool,
    tripped: bool,
    /// The noiseless voltage at `anchor`; later voltages follow from the ramp.
    volts_at_anchor: f64,
    anchor: Instant,
}

impl OutputState {
    fn new(spec: &OutputSpec, now: Instant) -> OutputState {
        OutputState {
            spec: spec.clone(),
            vset: spec.vset,
            iset: spec.iset,
            ramp: spec.ramp,
            on: false,
            tripped: false,
            volts_at_anchor: 0.0,
            anchor: now,
        }
    }

    fn target(&self) -> f64 {
        if self.on { self.vset } else { 0.0 }
    }

    /// The noiseless output voltage at `now`.
    fn volts(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.anchor).as_secs_f64();
        let step = self.ramp * elapsed;
        let target = self.target();
        if self.volts_at_anchor < target {
            (self.volts_at_anchor + step).min(target)
        } else {
            (self.volts_at_anchor - step).max(target)
        }
    }

    /// Fixes the ramp's starting point at `now`, before a parameter changes.
    fn settle(&mut self, now: Instant) {
        self.volts_at_anchor = self.volts(now);
        self.anchor = now;
    }

    fn trip_volts(&self) -> f64 {
        self.iset * self.spec.load_mohm
    }

    /// Trips the output if its current has gone above ISET by `now`; true when it tripped.
    ///
    /// The trip happens at the moment the ramp crossed the trip voltage, not when it was noticed,
    /// so the result does not depend on how often this is called.
    fn check_trip(&mut self, now: Instant) -> bool {
        if !self.on || self.tripped {
            return false;
        }
        let trip_volts = self.trip_volts();
        if self.volts(now) <= trip_volts {
            return false;
        }
        if self.volts_at_anchor < trip_volts && self.ramp > 0.0 {
            let to_trip = (trip_volts - self.volts_at_anchor) / self.ramp;
            self.anchor += Duration::from_secs_f64(to_trip);
            self.volts_at_anchor = trip_volts;
        } else {
            self.settle(now);
        }
        self.on = false;
        self.tripped = true;
        true
    }

    fn status(&self, now: Instant) -> &'static str {
        let volts = self.volts(now);
        if self.tripped {
            STAT_OPTIONS[3]
        } else if (volts - self.target()).abs() > ARRIVED_TOLERANCE_V {
            STAT_OPTIONS[1]
        } else if self.on {
            STAT_OPTIONS[2]
        } else {
            STAT_OPTIONS[0]
        }
    }
}

/// The changing part of one channel.
#[derive(Debug, Clone)]
enum ChannelState {
    Stateless,
    Stored(Value),
    I2c {
        registers: Box<[u8; 256]>,
        queue: VecDeque<u8>,
    },
    Uart {
        /// Written characters not yet ended by a newline.
        pending_line: String,
        receive: String,
    },
}

#[derive(Debug, Clone)]
struct Channel {
    spec: ChannelSpec,
    state: ChannelState,
    /// Phase and period factor of the analog model's drift, distinct per channel name.
    phase: f64,
    period_factor: f64,
    /// What CONFIGURE may change beyond the descriptor (`configure.rs`).
    config: station_protocol::ChannelConfig,
}

impl Channel {
    fn new(spec: ChannelSpec) -> Channel {
        let state = match &spec.model {
            ChannelModel::Setting { default, .. } => ChannelState::Stored(default.clone()),
            ChannelModel::I2c { registers } => {
                let mut all = Box::new([0u8; 256]);
                all[..registers.len()].copy_from_slice(registers);
                ChannelState::I2c {
                    registers: all,
                    queue: VecDeque::new(),
                }
            }
            ChannelModel::Uart { .. } => ChannelState::Uart {
                pending_line: String::new(),
                receive: String::new(),
            },
            _ => ChannelState::Stateless,
        };
        let hash = name_hash(&spec.descriptor.name);
        Channel {
            config: configure::initial(&spec),
            phase: (hash % 10_000) as f64 / 10_000.0 * TAU,
            period_factor: 0.75 + ((hash / 10_000) % 1_000) as f64 / 2_000.0,
            spec,
            state,
        }
    }
}

/// FNV-1a: a stable hash so a channel's drift looks the same on every run.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Rounds to `decimals` places so the value renders as the station would print it.
fn quantise(x: f64, decimals: u32) -> f64 {
    let text = format!("{x:.prec$}", prec = decimals as usize);
    let rounded = text.parse().unwrap_or(x);
    if rounded == 0.0 { 0.0 } else { rounded }
}

/// A write the station applied, as the station knows it (the server adds who sent it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AppliedWrite {
    pub channel: String,
    pub value: Value,
}

/// The whole simulated station.
pub(crate) struct Station {
    powered_on: Instant,
    channels: Vec<Channel>,
    by_name: HashMap<String, usize>,
    outputs: Vec<OutputState>,
    rng: StdRng,
    /// Notifications produced by the last operations, for the server to send.
    pending_notifies: Vec<Notify>,
    /// Hardware reads per channel name, READ items and TRANSACT reads alike.
    read_counts: HashMap<String, u64>,
    /// The devices on the bus channels, for BUS (`bus.rs`).
    pub(crate) buses: crate::buses::Buses,
}

fn unknown_channel(name: &str) -> StationError {
    StationError::new(
        ErrorCode::UnknownChannel,
        format!("no such channel: {name}"),
    )
}

impl Station {
    /// The station as it is at power-on.
    pub(crate) fn power_on(profile: &Profile, now: Instant) -> Station {
        let rng = match profile.station.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        let mut station = Station {
            powered_on: now,
            channels: Vec::new(),
            by_name: HashMap::new(),
            outputs: profile
                .outputs
                .iter()
                .map(|spec| OutputState::new(spec, now))
                .collect(),
            rng,
            pending_notifies: Vec::new(),
            read_counts: HashMap::new(),
            buses: crate::buses::Buses::new(&profile.buses),
        };
        for spec in &profile.channels {
            station.push_channel(spec.clone());
        }
        station
    }

    fn push_channel(&mut self, spec: ChannelSpec) {
        self.by_name
            .insert(spec.descriptor.name.clone(), self.channels.len());
        self.channels.push(Channel::new(spec));
    }

    fn reindex(&mut self) {
        self.by_name = self
            .channels
            .iter()
            .enumerate()
            .map(|(i, c)| (c.spec.descriptor.name.clone(), i))
            .collect();
    }

    /// Adds a channel at the end of the list; false when the name is taken.
    pub(crate) fn add_channel(&mut self, spec: ChannelSpec) -> bool {
        if self.by_name.contains_key(&spec.descriptor.name) {
            return false;
        }
        self.push_channel(spec);
        true
    }

    /// Removes a channel; false when there is none of that name.
    pub(crate) fn remove_channel(&mut self, name: &str) -> bool {
        let Some(index) = self.by_name.get(name).copied() else {
            return false;
        };
        self.channels.remove(index);
        self.reindex();
        true
    }

    /// Sets a stored channel's value as its hardware would (an input like the door
    /// interlock), whatever its access; false when there is no stored channel of that name.
    pub(crate) fn set_input(&mut self, name: &str, value: Value) -> bool {
        let Some(&index) = self.by_name.get(name) else {
            return false;
        };
        let channel = &mut self.channels[index];
        if !matches!(channel.spec.model, ChannelModel::Setting { .. }) {
            return false;
        }
        channel.state = ChannelState::Stored(value);
        true
    }

    pub(crate) fn channel_count(&self) -> usize {
        self.channels.len()
    }

    pub(crate) fn descriptor_at(&self, index: usize) -> Option<&ChannelDescriptor> {
        self.channels.get(index).map(|c| &c.spec.descriptor)
    }

    /// Extra time a request touching `name` takes (zero for unknown names).
    pub(crate) fn latency_of(&self, name: &str) -> Duration {
        self.by_name
            .get(name)
            .map(|&i| self.channels[i].spec.latency)
            .unwrap_or_default()
    }

    /// Keeps the read counters of the station this one replaces (they are test observations,
    /// not station state).
    pub(crate) fn carry_read_counts_from(&mut self, old: Station) {
        self.read_counts = old.read_counts;
    }

    pub(crate) fn reads_of(&self, name: &str) -> u64 {
        self.read_counts.get(name).copied().unwrap_or(0)
    }

    /// Notifications produced since the last call.
    pub(crate) fn take_notifies(&mut self) -> Vec<Notify> {
        std::mem::take(&mut self.pending_notifies)
    }

    /// Brings every output up to `now`, tripping those whose current went above the limit.
    pub(crate) fn advance(&mut self, now: Instant) {
        for index in 0..self.outputs.len() {
            let output = &mut self.outputs[index];
            if !output.check_trip(now) {
                continue;
            }
            let message = format!(
                "output {} tripped: current above the {} µA limit at {} V",
                output.spec.name,
                output.iset,
                quantise(output.volts_at_anchor, 3)
            );
            let channel = self
                .channels
                .iter()
                .find(|c| {
                    matches!(c.spec.model,
                        ChannelModel::Hv { output: o, role: HvRole::On, .. } if o == index)
                })
                .map(|c| c.spec.descriptor.name.clone())
                .unwrap_or_else(|| self.outputs[index].spec.name.clone());
            self.pending_notifies
                .push(Notify::OutputTripped { channel, message });
        }
    }

    fn noise(&mut self, amplitude: f64) -> f64 {
        if amplitude > 0.0 {
            self.rng.gen_range(-amplitude..=amplitude)
        } else {
            0.0
        }
    }

    fn lookup(&self, name: &str) -> Result<usize, StationError> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| unknown_channel(name))
    }

    /// Reads one channel as the hardware would at `now`; a consuming channel's read empties it.
    pub(crate) fn read(&mut self, name: &str, now: Instant) -> Result<Value, StationError> {
        self.advance(now);
        let index = self.lookup(name)?;
        if !self.channels[index].spec.descriptor.readable {
            return Err(StationError::new(
                ErrorCode::Unsupported,
                format!("{name} is write only"),
            ));
        }
        *self.read_counts.entry(name.to_owned()).or_default() += 1;
        self.value_of(index, name, now)
    }

    /// The descriptor and model of channel `name`.
    pub(crate) fn spec_of(&self, name: &str) -> Result<&ChannelSpec, StationError> {
        Ok(&self.channels[self.lookup(name)?].spec)
    }

    /// What a NumericResult channel's converter sees on `name` at `at`: the channel's own model
    /// (noise, drift, a ramping output), without counting a read or advancing the outputs.
    pub(crate) fn sample(&mut self, name: &str, at: Instant) -> Result<f64, StationError> {
        let index = self.lookup(name)?;
        let value = self.value_of(index, name, at)?;
        crate::profile::numeric(&value).ok_or_else(|| {
            StationError::new(
                ErrorCode::BadValue,
                format!("{name} is not a number and cannot be sampled"),
            )
        })
    }

    fn value_of(&mut self, index: usize, name: &str, now: Instant) -> Result<Value, StationError> {
        let elapsed = now.saturating_duration_since(self.powered_on);
        let channel = &self.channels[index];
        let value = match channel.spec.model.clone() {
            ChannelModel::Constant(value) => value,
            ChannelModel::Uptime => Value::String(render_uptime(elapsed)),
            ChannelModel::Analog(model) => {
                let (phase, factor) = (channel.phase, channel.period_factor);
                Value::Float(self.analog(&model, phase, factor, elapsed))
            }
            ChannelModel::Setting { .. } => match &channel.state {
                ChannelState::Stored(value) => value.clone(),
                _ => return Err(internal(name)),
            },
            ChannelModel::Hv { output, role, .. } => self.read_output(output, role, now),
            ChannelModel::SupplyCurrent {
                idle,
                per_kv,
                noise,
                decimals,
            } => {
                let kilovolts: f64 = self.outputs.iter().map(|o| o.volts(now) / 1000.0).sum();
                let amps = idle + per_kv * kilovolts + self.noise(noise);
                Value::Float(quantise(amps.max(0.0), decimals))
            }
            ChannelModel::I2c { .. } => match &mut self.channels[index].state {
                ChannelState::I2c { queue, .. } => Value::Bytes(queue.drain(..).collect()),
                _ => return Err(internal(name)),
            },
            ChannelModel::Uart { .. } => match &mut self.channels[index].state {
                ChannelState::Uart { receive, .. } => Value::String(std::mem::take(receive)),
                _ => return Err(internal(name)),
            },
            ChannelModel::NumericResult {
                default_samples, ..
            } => Value::Integer(i64::from(default_samples)),
        };
        Ok(value)
    }

    fn analog(&mut self, model: &AnalogModel, phase: f64, factor: f64, elapsed: Duration) -> f64 {
        let period = model.period_s * factor;
        let drift = model.drift * (TAU * elapsed.as_secs_f64() / period + phase).sin();
        let x = model.nominal + drift + self.noise(model.noise);
        quantise(x, model.decimals)
    }

    fn read_output(&mut self, index: usize, role: HvRole, now: Instant) -> Value {
        let output = &self.outputs[index];
        match role {
            HvRole::Vset => Value::Float(output.vset),
            HvRole::Iset => Value::Float(output.iset),
            HvRole::Ramp => Value::Float(output.ramp),
            HvRole::On => Value::Bool(output.on),
            HvRole::Stat => Value::Enum(output.status(now).to_owned()),
            HvRole::Vmon => {
                let (volts, noise) = (output.volts(now), output.spec.noise_v);
                let noisy = volts + self.noise(noise);
                Value::Float(quantise(noisy.max(0.0), 3))
            }
            HvRole::Imon => {
                let volts = output.volts(now);
                let (load, noise) = (output.spec.load_mohm, output.spec.noise_ua);
                let micro_amps = volts / load + self.noise(noise);
                Value::Float(quantise(micro_amps.max(0.0), 3))
            }
        }
    }

    /// Applies one write at `now`; returns the value as applied (canonical spelling).
    pub(crate) fn write(
        &mut self,
        name: &str,
        value: Value,
        now: Instant,
    ) -> Result<AppliedWrite, StationError> {
        self.advance(now);
        let index = self.lookup(name)?;
        let descriptor = &self.channels[index].spec.descriptor;
        if !descriptor.writable {
            return Err(StationError::new(
                ErrorCode::ReadOnly,
                format!("{name} is read only"),
            ));
        }
        let value = coerce(descriptor, value)?;
        let unit = descriptor.unit.clone();
        let check_range = |range: Option<(f64, f64)>, value: &Value| {
            if let (Some((min, max)), Some(x)) = (range, numeric(value))
                && !(min..=max).contains(&x)
            {
                let unit = if unit.is_empty() {
                    String::new()
                } else {
                    format!(" {unit}")
                };
                return Err(StationError::new(
                    ErrorCode::BadValue,
                    format!(
                        "{name}: {} is outside {} to {}{unit}",
                        value.render(),
                        Value::Float(min).render(),
                        Value::Float(max).render()
                    ),
                ));
            }
            Ok(())
        };
        match self.channels[index].spec.model.clone() {
            ChannelModel::Setting { range, .. } => {
                check_range(range, &value)?;
                self.channels[index].state = ChannelState::Stored(value.clone());
            }
            ChannelModel::Hv {
                output,
                role,
                range,
            } => {
                check_range(range, &value)?;
                self.write_output(output, role, &value, now);
            }
            ChannelModel::I2c { .. } => {
                if let (ChannelState::I2c { registers, queue }, Value::Bytes(bytes)) =
                    (&mut self.channels[index].state, &value)
                {
                    i2c_write(registers, queue, bytes);
                }
            }
            ChannelModel::Uart { replies, unknown } => {
                if let (
                    ChannelState::Uart {
                        pending_line,
                        receive,
                    },
                    Value::String(text),
                ) = (&mut self.channels[index].state, &value)
                {
                    uart_write(pending_line, receive, text, &replies, &unknown);
                }
            }
            _ => {
                return Err(StationError::new(
                    ErrorCode::ReadOnly,
                    format!("{name} cannot be written"),
                ));
            }
        }
        self.advance(now);
        Ok(AppliedWrite {
            channel: name.to_owned(),
            value,
        })
    }

    fn write_output(&mut self, index: usize, role: HvRole, value: &Value, now: Instant) {
        let output = &mut self.outputs[index];
        output.settle(now);
        match (role, value) {
            (HvRole::Vset, Value::Float(x)) => output.vset = *x,
            (HvRole::Iset, Value::Float(x)) => output.iset = *x,
            (HvRole::Ramp, Value::Float(x)) => output.ramp = *x,
            (HvRole::On, Value::Bool(on)) => {
                output.on = *on;
                output.tripped = false;
            }
            _ => {}
        }
    }

    /// The instrument on UART channel `name`: its pending line and receive buffer, its replies
    /// and its answer to an unknown command.
    #[allow(clippy::type_complexity)]
    pub(crate) fn uart_parts(
        &mut self,
        name: &str,
    ) -> Option<(
        &mut String,
        &mut String,
        &std::collections::BTreeMap<String, String>,
        &str,
    )> {
        let index = *self.by_name.get(name)?;
        let channel = &mut self.channels[index];
        match (&channel.spec.model, &mut channel.state) {
            (
                ChannelModel::Uart { replies, unknown },
                ChannelState::Uart {
                    pending_line,
                    receive,
                },
            ) => Some((pending_line, receive, replies, unknown.as_str())),
            _ => None,
        }
    }

    /// Writes then reads `name` as one step.
    pub(crate) fn transact(
        &mut self,
        name: &str,
        value: Value,
        now: Instant,
    ) -> Result<(AppliedWrite, Value), StationError> {
        let applied = self.write(name, value, now)?;
        let read = self.read(name, now)?;
        Ok((applied, read))
    }
}

fn internal(name: &str) -> StationError {
    StationError::new(
        ErrorCode::Internal,
        format!("{name}: channel state does not match its model"),
    )
}

/// Checks a written value against the channel's type, converting numbers where that is exact.
fn coerce(descriptor: &ChannelDescriptor, value: Value) -> Result<Value, StationError> {
    let name = &descriptor.name;
    let wanted = descriptor.value_type;
    let mismatch = |value: &Value| {
        StationError::new(
            ErrorCode::BadValue,
            format!(
                "{name} takes a {wanted} value, not a {} ({})",
                value.value_type(),
                value.render()
            ),
        )
    };
    match (wanted, value) {
        (ValueType::Float, Value::Float(x)) if x.is_finite() => Ok(Value::Float(x)),
        (ValueType::Float, Value::Integer(i)) => Ok(Value::Float(i as f64)),
        (ValueType::Integer, Value::Float(x)) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
            Ok(Value::Integer(x as i64))
        }
        (ValueType::Enum, Value::Enum(text) | Value::String(text)) => descriptor
            .options
            .iter()
            .find(|o| o.eq_ignore_ascii_case(&text))
            .map(|o| Value::Enum(o.clone()))
            .ok_or_else(|| {
                StationError::new(
                    ErrorCode::BadValue,
                    format!(
                        "{name}: {text} is not one of {}",
                        descriptor.options.join(", ")
                    ),
                )
            }),
        (ValueType::Bytes, Value::String(text)) => Ok(Value::Bytes(Bytes::from(text.into_bytes()))),
        (wanted, value) if value.value_type() == wanted && wanted != ValueType::Float => Ok(value),
        (_, value) => Err(mismatch(&value)),
    }
}

/// A register device: `[r]` queues register r's byte; `[r, b…]` stores b… from register r on.
fn i2c_write(registers: &mut [u8; 256], queue: &mut VecDeque<u8>, bytes: &[u8]) {
    match bytes {
        [] => {}
        [register] => queue.push_back(registers[usize::from(*register)]),
        [register, data @ ..] => {
            for (offset, byte) in data.iter().enumerate() {
                registers[(usize::from(*register) + offset) % 256] = *byte;
            }
        }
    }
    while queue.len() > RECEIVE_BUFFER_LIMIT {
        queue.pop_front();
    }
}

/// An instrument on a UART: every complete line written queues its reply line.
pub(crate) fn uart_write(
    pending_line: &mut String,
    receive: &mut String,
    text: &str,
    replies: &std::collections::BTreeMap<String, String>,
    unknown: &str,
) {
    for c in text.chars() {
        if c != '\n' {
            pending_line.push(c);
            continue;
        }
        let command = pending_line.trim().to_owned();
        pending_line.clear();
        if command.is_empty() {
            continue;
        }
        let reply = replies
            .iter()
            .find(|(asked, _)| asked.eq_ignore_ascii_case(&command))
            .map(|(_, reply)| reply.as_str())
            .unwrap_or(unknown);
        receive.push_str(reply);
        receive.push('\n');
    }
    if receive.len() > RECEIVE_BUFFER_LIMIT {
        let mut cut = receive.len() - RECEIVE_BUFFER_LIMIT;
        while !receive.is_char_boundary(cut) {
            cut += 1;
        }
        receive.drain(..cut);
    }
    if pending_line.len() > RECEIVE_BUFFER_LIMIT {
        pending_line.clear();
    }
}

/// Time since power-on as the station prints it: `0d 01:02:03`.
fn render_uptime(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs();
    format!(
        "{}d {:02}:{:02}:{:02}",
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const VSET1: &str = "0.4.ESH10000662.VSET1";
    const VMON1: &str = "0.4.ESH10000662.VMON1";
    const IMON1: &str = "0.4.ESH10000662.IMON1";
    const ON1: &str = "0.4.ESH10000662.ON1";
    const ISET1: &str = "0.4.ESH10000662.ISET1";
    const STAT1: &str = "0.4.ESH10000662.STAT1";

    fn quiet_station(now: Instant) -> Station {
        let mut profile = Profile::default_station();
        for output in &mut profile.outputs {
            output.noise_v = 0.0;
            output.noise_ua = 0.0;
        }
        Station::power_on(&profile, now)
    }

    fn float(value: Value) -> f64 {
        match value {
            Value::Float(x) => x,
            other => panic!("not a float: {other:?}"),
        }
    }

    #[test]
    fn vmon_ramps_toward_vset_while_on_and_back_while_off() {
        let t0 = Instant::now();
        let mut station = quiet_station(t0);
        station.write(VSET1, Value::Float(500.0), t0).unwrap();
        station.write(ON1, Value::Bool(true), t0).unwrap();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(float(station.read(VMON1, at(2)).unwrap()), 100.0);
        assert_eq!(
            station.read(STAT1, at(2)).unwrap(),
            Value::Enum("Ramping".into())
        );
        assert_eq!(float(station.read(IMON1, at(2)).unwrap()), 10.0);
        assert_eq!(float(station.read(VMON1, at(20)).unwrap()), 500.0);
        assert_eq!(
            station.read(STAT1, at(20)).unwrap(),
            Value::Enum("On".into())
        );
        station.write(ON1, Value::Bool(false), at(20)).unwrap();
        assert_eq!(float(station.read(VMON1, at(22)).unwrap()), 400.0);
        assert_eq!(float(station.read(VMON1, at(40)).unwrap()), 0.0);
        assert_eq!(
            station.read(STAT1, at(40)).unwrap(),
            Value::Enum("Off".into())
        );
    }

    #[test]
    fn current_above_the_limit_trips_the_output_until_on_is_written() {
        let t0 = Instant::now();
        let mut station = quiet_station(t0);
        station.write(ISET1, Value::Float(10.0), t0).unwrap();
        station.write(VSET1, Value::Float(500.0), t0).unwrap();
        station.write(ON1, Value::Bool(true), t0).unwrap();
        // 10 µA through 10 MΩ is 100 V, reached after 2 s at 50 V/s.
        station.advance(t0 + Duration::from_secs(3));
        let notifies = station.take_notifies();
        assert!(matches!(&notifies[..],
            [Notify::OutputTripped { channel, .. }] if channel == ON1));
        let later = t0 + Duration::from_secs(3);
        assert_eq!(
            station.read(STAT1, later).unwrap(),
            Value::Enum("Trip".into())
        );
        assert_eq!(station.read(ON1, later).unwrap(), Value::Bool(false));
        // Tripped at 100 V at 2 s, then 1 s down at 50 V/s.
        assert_eq!(float(station.read(VMON1, later).unwrap()), 50.0);
        station.write(ON1, Value::Bool(true), later).unwrap();
        assert_eq!(
            station.read(STAT1, later).unwrap(),
            Value::Enum("Ramping".into())
        );
    }

    #[test]
    fn errors_are_clear() {
        let t0 = Instant::now();
        let mut station = quiet_station(t0);
        let error = station.read("No.Such.Channel", t0).unwrap_err();
        assert_eq!(error.code, ErrorCode::UnknownChannel);
        assert_eq!(error.message, "no such channel: No.Such.Channel");
        let error = station.write(VSET1, Value::Float(3500.0), t0).unwrap_err();
        assert_eq!(error.code, ErrorCode::BadValue);
        assert_eq!(
            error.message,
            "0.4.ESH10000662.VSET1: 3500 is outside 0 to 3000 V"
        );
        let error = station.write(VMON1, Value::Float(1.0), t0).unwrap_err();
        assert_eq!(error.code, ErrorCode::ReadOnly);
        let error = station.write(ON1, Value::Float(1.0), t0).unwrap_err();
        assert_eq!(error.code, ErrorCode::BadValue);
        let error = station
            .write("0.11.ESH10000355.A1", Value::Enum("Mauve".into()), t0)
            .unwrap_err();
        assert!(
            error.message.contains("not one of Black, Red"),
            "{}",
            error.message
        );
    }

    #[test]
    fn bus_channels_consume_what_they_read() {
        let t0 = Instant::now();
        let mut station = quiet_station(t0);
        let i2c = "0.ESH10000023.I2C09";
        station
            .write(i2c, Value::Bytes(Bytes::from_static(&[0])), t0)
            .unwrap();
        assert_eq!(
            station.read(i2c, t0).unwrap(),
            Value::Bytes(Bytes::from_static(&[0x5A]))
        );
        assert_eq!(station.read(i2c, t0).unwrap(), Value::Bytes(Bytes::new()));
        station
            .write(
                i2c,
                Value::Bytes(Bytes::from_static(&[0x20, 0xAB, 0xCD])),
                t0,
            )
            .unwrap();
        let (_, read) = station
            .transact(i2c, Value::Bytes(Bytes::from_static(&[0x21])), t0)
            .unwrap();
        assert_eq!(read, Value::Bytes(Bytes::from_static(&[0xCD])));

        let uart = "0.ESH10000023.UART01";
        let (_, reply) = station
            .transact(uart, Value::String("*IDN?\n".into()), t0)
            .unwrap();
        assert_eq!(
            reply,
            Value::String("Simulated Station,HV4,ESH10000662,6.4.2\n".into())
        );
        station.write(uart, Value::String("*I".into()), t0).unwrap();
        assert_eq!(
            station.read(uart, t0).unwrap(),
            Value::String(String::new())
        );
        station
            .write(uart, Value::String("DN?\nBOGUS\n".into()), t0)
            .unwrap();
        let Value::String(text) = station.read(uart, t0).unwrap() else {
            panic!("not a string");
        };
        assert!(text.ends_with("6.4.2\nERR unknown command\n"), "{text:?}");
    }

    #[test]
    fn measurements_are_near_nominal_and_quantised() {
        let t0 = Instant::now();
        let mut station = Station::power_on(&Profile::default_station(), t0);
        for _ in 0..100 {
            let x = float(station.read("0.1.ESH10000158.MON_3V3", t0).unwrap());
            assert!((3.28..=3.32).contains(&x), "{x}");
            assert!(Value::Float(x).render().len() <= 5, "{x}");
        }
        let later = t0 + Duration::from_secs(3725);
        assert_eq!(
            station.read("Engine.Uptime", later).unwrap(),
            Value::String("0d 01:02:05".into())
        );
        let a = float(station.read("0.8.ESH10000590.ADC01", later).unwrap());
        let b = float(station.read("0.8.ESH10000590.ADC02", later).unwrap());
        assert!((a - b).abs() > 0.01, "{a} {b}");
    }

    #[test]
    fn channels_can_be_removed_and_added() {
        let t0 = Instant::now();
        let mut station = quiet_station(t0);
        let before = station.channel_count();
        assert!(station.remove_channel(VMON1));
        assert!(!station.remove_channel(VMON1));
        assert_eq!(station.channel_count(), before - 1);
        assert_eq!(
            station.read(VMON1, t0).unwrap_err().code,
            ErrorCode::UnknownChannel
        );
        assert!(station.read(ON1, t0).is_ok());
    }
}

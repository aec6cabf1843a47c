//! The devices on the simulated station's buses, as the station profile's `[[bus]]` tables
//! define them: an EEPROM and a temperature sensor on I2C, an ADC on SPI, and the line
//! settings of the instrument on a UART. `bus.rs` runs BUS transactions against them.

use serde::Deserialize;
use station_protocol::ValueType;

use crate::profile::{ChannelModel, ChannelSpec, InvalidProfile, TYPE_FLAGS};

/// The lowest and highest address an I2C scan probes (the rest are reserved).
pub const SCAN_FIRST: u8 = 0x08;
pub const SCAN_LAST: u8 = 0x77;

/// One `[[bus]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBus {
    channel: String,
    kind: String,
    /// I2C: attempts after a NAK when the request asks for the station's own limit.
    retries: Option<u8>,
    /// UART: the baud rate of the instrument on the line.
    baud: Option<u32>,
    #[serde(default)]
    device: Vec<RawDevice>,
}

/// One `[[bus.device]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    model: String,
    address: Option<u8>,
    size: Option<usize>,
    page: Option<usize>,
    /// EEPROM: its contents from byte 0 on, as hex (the rest reads `FF`).
    contents: Option<String>,
    /// Temperature sensor: the channel whose temperature it reads.
    follows: Option<String>,
    /// ADC: the voltage on each input.
    inputs: Option<Vec<f64>>,
    /// ADC: the reference voltage (full scale).
    vref: Option<f64>,
}

/// What kind of bus a channel is, with its bus-wide settings.
#[derive(Debug, Clone, PartialEq)]
pub enum BusKind {
    I2c { retries: u8 },
    Uart { baud: u32 },
    Spi,
}

/// One device on a bus.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceSpec {
    /// A 24Cxx-style EEPROM: one address byte, writes wrap within a page, reads wrap at the end.
    Eeprom {
        address: u8,
        contents: Vec<u8>,
        page: usize,
    },
    /// An LM75-style sensor: register 0 is the temperature of `follows`, 0.5 °C a step.
    TempSensor { address: u8, follows: String },
    /// A 12-bit ADC: the first byte clocked in selects the input, the next two clock out its
    /// conversion (`0000hhhh llllllll`).
    Adc { inputs: Vec<f64>, vref: f64 },
}

impl DeviceSpec {
    /// Its I2C address, for devices on I2C.
    pub fn address(&self) -> Option<u8> {
        match self {
            DeviceSpec::Eeprom { address, .. } | DeviceSpec::TempSensor { address, .. } => {
                Some(*address)
            }
            DeviceSpec::Adc { .. } => None,
        }
    }
}

/// One bus channel and the devices on it.
#[derive(Debug, Clone, PartialEq)]
pub struct BusSpec {
    pub channel: String,
    pub kind: BusKind,
    pub devices: Vec<DeviceSpec>,
}

/// Builds the buses of a profile; `bad(index, key, message)` makes the error for the `index`th
/// `[[bus]]` table.
pub(crate) fn build_buses(
    raw: Vec<RawBus>,
    channels: &[ChannelSpec],
    bad: impl Fn(usize, &str, String) -> InvalidProfile,
) -> Result<Vec<BusSpec>, InvalidProfile> {
    let flag = |name: &str| {
        TYPE_FLAGS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, bit)| *bit)
    };
    let mut buses: Vec<BusSpec> = Vec::with_capacity(raw.len());
    for (index, bus) in raw.into_iter().enumerate() {
        let bad =
            |key: &str, message: String| bad(index, key, format!("bus {}: {message}", bus.channel));
        let Some(channel) = channels.iter().find(|c| c.descriptor.name == bus.channel) else {
            return Err(bad("channel", "no channel has this name".into()));
        };
        if buses.iter().any(|b| b.channel == bus.channel) {
            return Err(bad("channel", "is defined twice".into()));
        }
        let (kind, type_name) = match bus.kind.as_str() {
            "i2c" => (
                BusKind::I2c {
                    retries: bus.retries.unwrap_or(3),
                },
                "I2C",
            ),
            "uart" => {
                let baud = bus.baud.unwrap_or(9600);
                if baud == 0 {
                    return Err(bad("baud", "must be above 0".into()));
                }
                if !matches!(channel.model, ChannelModel::Uart { .. }) {
                    return Err(bad(
                        "kind",
                        "a uart bus needs a channel of model \"uart\" (its instrument)".into(),
                    ));
                }
                (BusKind::Uart { baud }, "UART")
            }
            "spi" => (BusKind::Spi, "SPI"),
            other => {
                return Err(bad(
                    "kind",
                    format!("unknown kind {other:?}; known: i2c, uart, spi"),
                ));
            }
        };
        if channel.descriptor.type_flags & flag(type_name) == 0 {
            return Err(bad(
                "kind",
                format!("the channel's types do not include {type_name}"),
            ));
        }
        let mut devices: Vec<DeviceSpec> = Vec::with_capacity(bus.device.len());
        for device in &bus.device {
            let device = build_device(device, &kind, channels).map_err(|m| bad("device", m))?;
            if let Some(address) = device.address()
                && devices.iter().any(|d| d.address() == Some(address))
            {
                return Err(bad(
                    "device",
                    format!("two devices at address 0x{address:02X}"),
                ));
            }
            devices.push(device);
        }
        if kind == BusKind::Spi && devices.len() > 1 {
            return Err(bad(
                "device",
                "an SPI bus here has one chip select: one device".into(),
            ));
        }
        buses.push(BusSpec {
            channel: bus.channel.clone(),
            kind,
            devices,
        });
    }
    Ok(buses)
}

fn build_device(
    raw: &RawDevice,
    kind: &BusKind,
    channels: &[ChannelSpec],
) -> Result<DeviceSpec, String> {
    let i2c_address = || -> Result<u8, String> {
        let address = raw
            .address
            .ok_or_else(|| format!("device {:?} needs `address`", raw.model))?;
        if !(SCAN_FIRST..=SCAN_LAST).contains(&address) {
            return Err(format!(
                "address 0x{address:02X} is outside 0x08 to 0x77 (the rest are reserved)"
            ));
        }
        Ok(address)
    };
    match (raw.model.as_str(), kind) {
        ("eeprom", BusKind::I2c { .. }) => {
            let size = raw.size.unwrap_or(256);
            let page = raw.page.unwrap_or(8);
            if !(1..=256).contains(&size) {
                return Err(format!(
                    "an EEPROM with one address byte holds 1 to 256 bytes, not {size}"
                ));
            }
            if page == 0 || !size.is_multiple_of(page) {
                return Err(format!("page {page} does not divide size {size}"));
            }
            let mut contents = vec![0xFF; size];
            if let Some(hex) = &raw.contents {
                let bytes = station_protocol::Value::parse_as(ValueType::Bytes, hex, &[])
                    .map_err(|error| format!("contents: {error}"))?;
                let station_protocol::Value::Bytes(bytes) = bytes else {
                    return Err("contents must be hex".into());
                };
                if bytes.len() > size {
                    return Err(format!(
                        "contents of {} bytes exceed size {size}",
                        bytes.len()
                    ));
                }
                contents[..bytes.len()].copy_from_slice(&bytes);
            }
            Ok(DeviceSpec::Eeprom {
                address: i2c_address()?,
                contents,
                page,
            })
        }
        ("temperature", BusKind::I2c { .. }) => {
            let follows = raw
                .follows
                .clone()
                .ok_or("a temperature sensor needs `follows` (a channel)")?;
            let followed = channels
                .iter()
                .find(|c| c.descriptor.name == follows)
                .ok_or_else(|| format!("follows {follows}: no channel has this name"))?;
            if followed.descriptor.value_type != ValueType::Float {
                return Err(format!("follows {follows}: not a float channel"));
            }
            Ok(DeviceSpec::TempSensor {
                address: i2c_address()?,
                follows,
            })
        }
        ("adc", BusKind::Spi) => {
            let inputs = raw.inputs.clone().unwrap_or_default();
            let vref = raw.vref.unwrap_or(4.096);
            if inputs.is_empty() || inputs.len() > 8 {
                return Err("an ADC has 1 to 8 `inputs`".into());
            }
            if !(vref.is_finite() && vref > 0.0) {
                return Err(format!("vref {vref} must be above 0"));
            }
            Ok(DeviceSpec::Adc { inputs, vref })
        }
        (model, kind) => Err(format!(
            "no device model {model:?} on this kind of bus ({kind:?}); i2c takes eeprom and \
             temperature, spi takes adc, a uart's instrument is its channel's model"
        )),
    }
}

/// An EEPROM's state: its memory and address pointer.
#[derive(Debug, Clone)]
pub(crate) struct Eeprom {
    pub memory: Vec<u8>,
    pub page: usize,
    pub pointer: usize,
}

impl Eeprom {
    /// A write: the first byte sets the pointer, the rest are stored from it on, wrapping
    /// within the pointer's page.
    pub fn write(&mut self, data: &[u8]) {
        let Some((&address, bytes)) = data.split_first() else {
            return;
        };
        let size = self.memory.len();
        let start = usize::from(address) % size;
        let page_start = start - start % self.page;
        let mut offset = start - page_start;
        for byte in bytes {
            self.memory[page_start + offset] = *byte;
            offset = (offset + 1) % self.page;
        }
        self.pointer = page_start + offset;
    }

    /// A sequential read from the pointer, wrapping at the end of the memory.
    pub fn read(&mut self, count: usize) -> Vec<u8> {
        let size = self.memory.len();
        let out = (0..count)
            .map(|i| self.memory[(self.pointer + i) % size])
            .collect();
        self.pointer = (self.pointer + count) % size;
        out
    }
}

/// A temperature sensor's registers (LM75 layout).
#[derive(Debug, Clone)]
pub(crate) struct TempSensor {
    pub follows: String,
    pub pointer: u8,
    pub config: u8,
    pub hysteresis: [u8; 2],
    pub overtemp: [u8; 2],
}

impl TempSensor {
    pub fn new(follows: String) -> TempSensor {
        TempSensor {
            follows,
            pointer: 0,
            config: 0,
            hysteresis: encode_celsius(75.0),
            overtemp: encode_celsius(80.0),
        }
    }

    /// A write: the first byte selects the register, the rest are stored in it (register 0,
    /// the temperature, is read only).
    pub fn write(&mut self, data: &[u8]) {
        let Some((&pointer, bytes)) = data.split_first() else {
            return;
        };
        self.pointer = pointer & 0x03;
        match (self.pointer, bytes) {
            (1, [config, ..]) => self.config = *config,
            (2, [msb, lsb, ..]) => self.hysteresis = [*msb, *lsb],
            (3, [msb, lsb, ..]) => self.overtemp = [*msb, *lsb],
            _ => {}
        }
    }

    /// A read of the selected register, repeated as long as the master clocks.
    pub fn read(&self, count: usize, celsius: f64) -> Vec<u8> {
        let register: Vec<u8> = match self.pointer {
            0 => encode_celsius(celsius).to_vec(),
            1 => vec![self.config],
            2 => self.hysteresis.to_vec(),
            _ => self.overtemp.to_vec(),
        };
        register.iter().copied().cycle().take(count).collect()
    }
}

/// A temperature as an LM75 register: two's complement, 0.5 °C in bit 7 of the second byte.
pub fn encode_celsius(celsius: f64) -> [u8; 2] {
    let halves = (celsius * 2.0).round().clamp(-110.0, 250.0) as i16;
    ((halves << 7) as u16).to_be_bytes()
}

/// The temperature an LM75 register holds.
pub fn decode_celsius(register: [u8; 2]) -> f64 {
    f64::from(i16::from_be_bytes(register) >> 7) / 2.0
}

/// An ADC's answer to the bytes clocked out to it: the first byte selects the input (its low
/// three bits), the next two clock out the 12-bit conversion, the rest `00`.
pub fn adc_transfer(inputs: &[f64], vref: f64, mosi: &[u8]) -> Vec<u8> {
    let input = mosi.first().map_or(0, |b| usize::from(b & 0x07));
    let volts = inputs.get(input).copied().unwrap_or(0.0);
    let [high, low] = adc_code(volts, vref).to_be_bytes();
    (0..mosi.len())
        .map(|i| match i {
            1 => high,
            2 => low,
            _ => 0,
        })
        .collect()
}

/// The code an ADC gives for `volts`.
pub fn adc_code(volts: f64, vref: f64) -> u16 {
    (volts / vref * 4096.0).round().clamp(0.0, 4095.0) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eeprom() -> Eeprom {
        Eeprom {
            memory: (0..=255).collect(),
            page: 8,
            pointer: 0,
        }
    }

    #[test]
    fn an_eeprom_reads_back_what_was_written_and_wraps_within_its_page() {
        let mut rom = eeprom();
        rom.write(&[0x10, 0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(rom.pointer, 0x14);
        rom.write(&[0x10]);
        assert_eq!(rom.read(4), vec![0xDE, 0xAD, 0xBE, 0xEF]);
        // A write past the end of its page wraps to the page's start.
        rom.write(&[0x06, 1, 2, 3, 4]);
        rom.write(&[0x00]);
        assert_eq!(rom.read(8), vec![3, 4, 2, 3, 4, 5, 1, 2]);
    }

    #[test]
    fn an_eeprom_read_past_the_end_wraps_to_the_start() {
        let mut rom = eeprom();
        rom.write(&[0xFE]);
        assert_eq!(rom.read(4), vec![0xFE, 0xFF, 0x00, 0x01]);
        assert_eq!(rom.pointer, 2);
        assert_eq!(
            rom.read(1),
            vec![2],
            "a read continues where the last ended"
        );
    }

    #[test]
    fn the_temperature_register_follows_in_half_degrees() {
        assert_eq!(encode_celsius(25.0), [0x19, 0x00]);
        assert_eq!(encode_celsius(25.2), [0x19, 0x00]);
        assert_eq!(encode_celsius(25.5), [0x19, 0x80]);
        assert_eq!(encode_celsius(-0.5), [0xFF, 0x80]);
        assert_eq!(encode_celsius(-25.0), [0xE7, 0x00]);
        for t in [-40.0, -0.5, 0.0, 45.5, 125.0] {
            assert_eq!(decode_celsius(encode_celsius(t)), t);
        }
        let mut sensor = TempSensor::new("T".into());
        assert_eq!(sensor.read(2, 45.2), vec![0x2D, 0x00]);
        sensor.write(&[1, 0x60]);
        assert_eq!(sensor.read(2, 45.2), vec![0x60, 0x60]);
        sensor.write(&[3]);
        assert_eq!(
            decode_celsius([sensor.read(2, 0.0)[0], sensor.read(2, 0.0)[1]]),
            80.0
        );
        sensor.write(&[0]);
        assert_eq!(sensor.read(3, 45.6), vec![0x2D, 0x80, 0x2D]);
    }

    #[test]
    fn the_adc_clocks_out_the_selected_inputs_conversion() {
        let inputs = [2.5, 1.65, 0.0, 5.0];
        assert_eq!(adc_code(2.5, 4.096), 2500);
        assert_eq!(
            adc_transfer(&inputs, 4.096, &[0, 0, 0]),
            vec![0, 0x09, 0xC4]
        );
        assert_eq!(
            adc_transfer(&inputs, 4.096, &[1, 0, 0]),
            vec![0, 0x06, 0x72]
        );
        // Above full scale it saturates; an input it does not have reads 0.
        assert_eq!(
            adc_transfer(&inputs, 4.096, &[3, 0, 0]),
            vec![0, 0x0F, 0xFF]
        );
        assert_eq!(
            adc_transfer(&inputs, 4.096, &[6, 0, 0, 0]),
            vec![0, 0, 0, 0]
        );
        assert_eq!(adc_transfer(&inputs, 4.096, &[0]), vec![0]);
    }
}

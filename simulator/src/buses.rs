//! The state of the simulated station's buses and of the devices on them, by bus channel, as
//! the station profile's `[[bus]]` tables define them. The station holds it; `bus.rs` runs BUS
//! transactions on it.

use std::collections::HashMap;

use crate::devices::{BusKind, BusSpec, DeviceSpec, Eeprom, TempSensor};

/// One I2C device's state.
#[derive(Debug, Clone)]
pub(crate) enum I2cDevice {
    Eeprom(Eeprom),
    Temp(TempSensor),
}

/// One bus's state.
#[derive(Debug, Clone)]
pub(crate) enum BusState {
    I2c {
        retries: u8,
        devices: Vec<(u8, I2cDevice)>,
    },
    Uart {
        baud: u32,
    },
    Spi {
        adc: Option<(Vec<f64>, f64)>,
    },
}

/// Every bus of the station, by channel name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Buses {
    pub by_channel: HashMap<String, BusState>,
}

impl Buses {
    pub(crate) fn new(specs: &[BusSpec]) -> Buses {
        let by_channel = specs
            .iter()
            .map(|spec| {
                let state = match &spec.kind {
                    BusKind::I2c { retries } => BusState::I2c {
                        retries: *retries,
                        devices: spec
                            .devices
                            .iter()
                            .filter_map(|device| match device {
                                DeviceSpec::Eeprom {
                                    address,
                                    contents,
                                    page,
                                } => Some((
                                    *address,
                                    I2cDevice::Eeprom(Eeprom {
                                        memory: contents.clone(),
                                        page: *page,
                                        pointer: 0,
                                    }),
                                )),
                                DeviceSpec::TempSensor { address, follows } => Some((
                                    *address,
                                    I2cDevice::Temp(TempSensor::new(follows.clone())),
                                )),
                                DeviceSpec::Adc { .. } => None,
                            })
                            .collect(),
                    },
                    BusKind::Uart { baud } => BusState::Uart { baud: *baud },
                    BusKind::Spi => BusState::Spi {
                        adc: spec.devices.iter().find_map(|device| match device {
                            DeviceSpec::Adc { inputs, vref } => Some((inputs.clone(), *vref)),
                            _ => None,
                        }),
                    },
                };
                (spec.channel.clone(), state)
            })
            .collect();
        Buses { by_channel }
    }
}

//! Bus transaction counters (`api/comm/*`): transactions by bus kind, action and result, and
//! the bytes they moved. Every label set is known up front, so an observation is an index.

use std::fmt::Write as _;

use station_protocol::BusAction;

use super::instruments::{Counter, PREFIX, header};

/// The kinds of bus a transaction goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusKind {
    I2c,
    Uart,
    Spi,
}

impl BusKind {
    pub const ALL: [BusKind; 3] = [BusKind::I2c, BusKind::Uart, BusKind::Spi];

    /// As people write it.
    pub fn label(self) -> &'static str {
        match self {
            BusKind::I2c => "I2C",
            BusKind::Uart => "UART",
            BusKind::Spi => "SPI",
        }
    }

    /// The channel type flag of such a bus (SPEC.md §9).
    pub fn type_flag(self) -> u32 {
        match self {
            BusKind::I2c => 32_768,
            BusKind::Uart => 8_192,
            BusKind::Spi => 16_384,
        }
    }
}

const ACTIONS: usize = 5;

/// Counters per bus kind and action.
#[derive(Debug, Default)]
pub struct CommMetrics {
    ok: [[Counter; ACTIONS]; 3],
    failed: [[Counter; ACTIONS]; 3],
    bytes_sent: [Counter; 3],
    bytes_received: [Counter; 3],
}

impl CommMetrics {
    /// One transaction that went to the station: `Some((sent, received))` when it succeeded.
    pub fn observe(&self, kind: BusKind, action: BusAction, moved: Option<(usize, usize)>) {
        let (k, a) = (kind as usize, action as usize - 1);
        match moved {
            Some((sent, received)) => {
                self.ok[k][a].inc();
                self.bytes_sent[k].add(sent as u64);
                self.bytes_received[k].add(received as u64);
            }
            None => self.failed[k][a].inc(),
        }
    }

    /// Transactions counted for a kind, action and result.
    pub fn transactions(&self, kind: BusKind, action: BusAction, succeeded: bool) -> u64 {
        let table = if succeeded { &self.ok } else { &self.failed };
        table[kind as usize][action as usize - 1].get()
    }

    pub(super) fn render(&self, out: &mut String) {
        header(
            out,
            "comm_transactions_total",
            "counter",
            "Bus transactions sent to the station (api/comm/*), by bus, action and result.",
        );
        for kind in BusKind::ALL {
            for action in BusAction::ALL {
                for (result, succeeded) in [("ok", true), ("error", false)] {
                    let _ = writeln!(
                        out,
                        "{PREFIX}comm_transactions_total{{bus=\"{}\",action=\"{}\",result=\"{result}\"}} {}",
                        kind.label(),
                        action.name(),
                        self.transactions(kind, *action, succeeded)
                    );
                }
            }
        }
        header(
            out,
            "comm_bytes_total",
            "counter",
            "Bytes bus transactions sent and received, by bus.",
        );
        for kind in BusKind::ALL {
            for (direction, counter) in [
                ("sent", &self.bytes_sent[kind as usize]),
                ("received", &self.bytes_received[kind as usize]),
            ] {
                let _ = writeln!(
                    out,
                    "{PREFIX}comm_bytes_total{{bus=\"{}\",direction=\"{direction}\"}} {}",
                    kind.label(),
                    counter.get()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_count_by_bus_action_and_result() {
        let m = CommMetrics::default();
        m.observe(BusKind::I2c, BusAction::Scan, Some((0, 2)));
        m.observe(BusKind::I2c, BusAction::Scan, None);
        m.observe(BusKind::Uart, BusAction::ClearBuffers, Some((0, 0)));
        assert_eq!(m.transactions(BusKind::I2c, BusAction::Scan, true), 1);
        assert_eq!(m.transactions(BusKind::I2c, BusAction::Scan, false), 1);
        assert_eq!(
            m.transactions(BusKind::Uart, BusAction::ClearBuffers, true),
            1
        );
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains(
            "station_gateway_comm_transactions_total{bus=\"I2C\",action=\"Scan\",result=\"ok\"} 1"
        ));
        assert!(
            out.contains("station_gateway_comm_bytes_total{bus=\"I2C\",direction=\"received\"} 2")
        );
    }
}

//! Station link addresses: `tcp://HOST:PORT` and `serial:///dev/ttyUSB0?baud=115200&...`.

use std::fmt;

/// Where the station is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StationUrl {
    Tcp { host: String, port: u16 },
    Serial(SerialSettings),
}

/// A serial line's settings; 8N1 at 115 200 baud unless the URL says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialSettings {
    pub path: String,
    pub baud: u32,
    pub data_bits: u8,
    pub parity: Parity,
    pub stop_bits: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parity {
    None,
    Odd,
    Even,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{url:?}: {why}")]
pub struct UrlError {
    url: String,
    why: String,
}

impl StationUrl {
    pub fn parse(url: &str) -> Result<StationUrl, UrlError> {
        let fail = |why: &str| UrlError {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        if let Some(rest) = url.strip_prefix("tcp://") {
            let rest = rest.trim_end_matches('/');
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| fail("a TCP station needs a port, as in tcp://10.0.0.5:4000"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(fail("the host is missing"));
            }
            let port = port
                .parse()
                .map_err(|_| fail("the port must be a number 1 to 65535"))?;
            if port == 0 {
                return Err(fail("the port must be a number 1 to 65535"));
            }
            return Ok(StationUrl::Tcp {
                host: host.to_owned(),
                port,
            });
        }
        if let Some(rest) = url.strip_prefix("serial://") {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            if !path.starts_with('/') {
                return Err(fail(
                    "a serial station needs a device path, as in serial:///dev/ttyUSB0",
                ));
            }
            let mut settings = SerialSettings {
                path: path.to_owned(),
                baud: 115_200,
                data_bits: 8,
                parity: Parity::None,
                stop_bits: 1,
            };
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                let (key, value) = pair
                    .split_once('=')
                    .ok_or_else(|| fail("query parts must be key=value"))?;
                match key {
                    "baud" => {
                        settings.baud = value
                            .parse()
                            .ok()
                            .filter(|b| *b > 0)
                            .ok_or_else(|| fail("baud must be a positive number"))?
                    }
                    "data_bits" => {
                        settings.data_bits = value
                            .parse()
                            .ok()
                            .filter(|b| (5..=8).contains(b))
                            .ok_or_else(|| fail("data_bits must be 5 to 8"))?
                    }
                    "stop_bits" => {
                        settings.stop_bits = value
                            .parse()
                            .ok()
                            .filter(|b| *b == 1 || *b == 2)
                            .ok_or_else(|| fail("stop_bits must be 1 or 2"))?
                    }
                    "parity" => {
                        settings.parity = match value {
                            "none" => Parity::None,
                            "odd" => Parity::Odd,
                            "even" => Parity::Even,
                            _ => return Err(fail("parity must be none, odd or even")),
                        }
                    }
                    _ => return Err(fail(&format!("unknown serial setting {key:?}"))),
                }
            }
            return Ok(StationUrl::Serial(settings));
        }
        Err(fail("a station URL starts with tcp:// or serial://"))
    }
}

impl fmt::Display for StationUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StationUrl::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            StationUrl::Serial(s) => write!(f, "serial://{}?baud={}", s.path, s.baud),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_kinds() {
        assert_eq!(
            StationUrl::parse("tcp://127.0.0.1:4000").unwrap(),
            StationUrl::Tcp {
                host: "127.0.0.1".into(),
                port: 4000
            }
        );
        let StationUrl::Serial(s) =
            StationUrl::parse("serial:///dev/ttyUSB0?baud=9600&parity=even&stop_bits=2").unwrap()
        else {
            panic!("not serial")
        };
        assert_eq!(
            (s.path.as_str(), s.baud, s.parity, s.stop_bits, s.data_bits),
            ("/dev/ttyUSB0", 9600, Parity::Even, 2, 8)
        );
    }

    #[test]
    fn refuses_with_a_reason() {
        assert!(
            StationUrl::parse("tcp://host")
                .unwrap_err()
                .to_string()
                .contains("port")
        );
        assert!(
            StationUrl::parse("serial:///dev/x?baud=fast")
                .unwrap_err()
                .to_string()
                .contains("baud")
        );
        assert!(
            StationUrl::parse("http://x")
                .unwrap_err()
                .to_string()
                .contains("tcp://")
        );
    }
}

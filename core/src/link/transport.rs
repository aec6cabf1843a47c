//! Opening the byte stream to the station: a TCP socket or a serial line.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_serial::SerialPortBuilderExt;

use super::error::OpenError;
use crate::config::station_url::{Parity, StationUrl};

/// A byte stream to the station, whatever carries it.
pub trait StationStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> StationStream for T {}

/// Opens the byte stream some other way than the station's URL says: an in-process pipe to a
/// simulated station (the deterministic simulation of the lab). Called once per connection.
pub type StationOpener =
    Arc<dyn Fn() -> BoxFuture<'static, std::io::Result<Box<dyn StationStream>>> + Send + Sync>;

/// Opens the stream `opener` gives, or else the one `url` names, within `timeout`.
pub async fn open_with(
    opener: Option<&StationOpener>,
    url: &StationUrl,
    timeout: Duration,
) -> Result<Box<dyn StationStream>, OpenError> {
    match opener {
        Some(opener) => opener().await.map_err(|source| OpenError::Connect {
            target: url.to_string(),
            source,
        }),
        None => open(url, timeout).await,
    }
}

/// Opens the stream `url` names, within `timeout`.
pub async fn open(
    url: &StationUrl,
    timeout: Duration,
) -> Result<Box<dyn StationStream>, OpenError> {
    match url {
        StationUrl::Tcp { host, port } => {
            let connect = TcpStream::connect((host.as_str(), *port));
            let stream = tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| OpenError::ConnectTimeout {
                    target: format!("{host}:{port}"),
                    timeout,
                })?
                .map_err(|source| OpenError::Connect {
                    target: format!("{host}:{port}"),
                    source,
                })?;
            let _ = stream.set_nodelay(true);
            Ok(Box::new(stream))
        }
        StationUrl::Serial(settings) => {
            let builder = tokio_serial::new(&settings.path, settings.baud)
                .data_bits(match settings.data_bits {
                    5 => tokio_serial::DataBits::Five,
                    6 => tokio_serial::DataBits::Six,
                    7 => tokio_serial::DataBits::Seven,
                    _ => tokio_serial::DataBits::Eight,
                })
                .parity(match settings.parity {
                    Parity::None => tokio_serial::Parity::None,
                    Parity::Odd => tokio_serial::Parity::Odd,
                    Parity::Even => tokio_serial::Parity::Even,
                })
                .stop_bits(if settings.stop_bits == 2 {
                    tokio_serial::StopBits::Two
                } else {
                    tokio_serial::StopBits::One
                })
                .flow_control(tokio_serial::FlowControl::None);
            let port = builder
                .open_native_async()
                .map_err(|source| OpenError::Serial {
                    path: settings.path.clone(),
                    source,
                })?;
            Ok(Box::new(port))
        }
    }
}

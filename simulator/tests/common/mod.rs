//! Helpers shared by the simulator's integration tests: start a simulator on a free port,
//! connect clients, speak raw frames.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use station_protocol::{RawFrame, Request, Response, StationCodec};
use station_simulator::{Profile, Simulator, SimulatorHandle, StationClient};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

pub const VSET1: &str = "0.4.ESH10000662.VSET1";
pub const VMON1: &str = "0.4.ESH10000662.VMON1";
pub const IMON1: &str = "0.4.ESH10000662.IMON1";
pub const ISET1: &str = "0.4.ESH10000662.ISET1";
pub const ON1: &str = "0.4.ESH10000662.ON1";
pub const RAMP1: &str = "0.4.ESH10000662.RAMP1";
pub const STAT1: &str = "0.4.ESH10000662.STAT1";
pub const MON_3V3: &str = "0.1.ESH10000158.MON_3V3";
pub const LED_A1: &str = "0.11.ESH10000355.A1";
pub const I2C09: &str = "0.ESH10000023.I2C09";
pub const UART01: &str = "0.ESH10000023.UART01";

pub fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

pub async fn start_default() -> SimulatorHandle {
    Simulator::start(Profile::default_station(), any_port())
        .await
        .expect("simulator starts")
}

pub async fn client(sim: &SimulatorHandle) -> StationClient<TcpStream> {
    let mut client = StationClient::connect(sim.local_addr())
        .await
        .expect("connects");
    client.set_timeout(Duration::from_secs(3));
    client
}

pub type RawLink = Framed<TcpStream, StationCodec>;

pub async fn raw_link(sim: &SimulatorHandle) -> RawLink {
    let stream = TcpStream::connect(sim.local_addr())
        .await
        .expect("connects");
    Framed::new(stream, StationCodec::new())
}

pub async fn send(link: &mut RawLink, request_id: u32, request: &Request) {
    let frame = request.to_frame(request_id).expect("fits a frame");
    link.send(frame).await.expect("sends");
}

/// The next frame that is not a NOTIFY, within two seconds.
pub async fn next_reply(link: &mut RawLink) -> (u32, Response) {
    loop {
        let frame: RawFrame = tokio::time::timeout(Duration::from_secs(2), link.next())
            .await
            .expect("a reply in time")
            .expect("link open")
            .expect("readable");
        if frame.request_id == 0 {
            continue;
        }
        let response = Response::from_frame(&frame).expect("a valid response");
        return (frame.request_id, response);
    }
}

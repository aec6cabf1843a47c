//! The clients the scenarios drive: REST requests over one keep-alive connection, and reads and
//! writes straight to a station (simulator or legacy listener) over the byte protocol.

use std::net::SocketAddr;

use anyhow::{Context, bail};
use bytes::Bytes;
use station_protocol::Value;
use station_simulator::StationClient;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::http::LoadConnection;
use crate::load::Worker;

/// `POST` of a fixed JSON body on one keep-alive connection, expecting 200.
pub struct RestWorker {
    pub connection: LoadConnection,
    /// The whole request, built once.
    pub request: Bytes,
}

impl RestWorker {
    pub async fn open(addr: SocketAddr, path: &str, body: &[u8]) -> anyhow::Result<RestWorker> {
        Ok(RestWorker {
            connection: LoadConnection::open(addr).await?,
            request: LoadConnection::post_request(addr, path, body),
        })
    }
}

impl Worker for RestWorker {
    async fn call(&mut self) -> anyhow::Result<()> {
        self.connection.call(&self.request).await?;
        Ok(())
    }
}

/// A READ of fixed names, every item expected to succeed.
pub struct DirectReadWorker<S> {
    pub client: StationClient<S>,
    pub names: Vec<String>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Worker for DirectReadWorker<S> {
    async fn call(&mut self) -> anyhow::Result<()> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let results = self.client.read(&names).await.context("READ")?;
        if results.len() != names.len() {
            bail!("READ answered {} items for {}", results.len(), names.len());
        }
        for result in results {
            result.context("READ item")?;
        }
        Ok(())
    }
}

/// A WRITE of fixed items, every item expected to succeed.
pub struct DirectWriteWorker<S> {
    pub client: StationClient<S>,
    pub items: Vec<(String, Value)>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Worker for DirectWriteWorker<S> {
    async fn call(&mut self) -> anyhow::Result<()> {
        let results = self
            .client
            .write(self.items.clone())
            .await
            .context("WRITE")?;
        for result in results {
            result.context("WRITE item")?;
        }
        Ok(())
    }
}

//! One reader of the event stream (`GET api/events`) for every test: parses events as the
//! reference client does, with a deadline on every wait.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value as Json;
use tokio::time::Instant;

use super::Rig;

/// One server-sent event.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: u64,
    pub name: String,
    pub data: Json,
}

/// A reader of `GET api/events`, parsing as the reference client does.
pub struct Sse {
    response: reqwest::Response,
    buf: Vec<u8>,
    /// Comment lines (`: ping`) seen so far.
    pub pings: usize,
    /// The id of the last event read that had one (a resumed stream's `hello` has none).
    pub last_id: u64,
}

/// How many events a stream can number: an id's last ten digits are the event's place in its
/// stream (docs/events.md, "Ids").
pub const SEQUENCE_SPAN: u64 = 10_000_000_000;

impl Sse {
    pub async fn open(rig: &Rig) -> Result<Sse> {
        Sse::open_at(&rig.http, &rig.gateway.base_url()).await
    }

    /// Opens `GET api/events` of the gateway at `base_url` (`http://ADDR`).
    pub async fn open_at(http: &reqwest::Client, base_url: &str) -> Result<Sse> {
        Sse::open_with(http, base_url, None).await
    }

    /// Opens `GET api/events` with the API key `key` and reads its hello.
    pub async fn open_keyed(rig: &Rig, key: &str) -> Result<Sse> {
        let mut sse = Sse::open_with(&rig.http, &rig.gateway.base_url(), Some(key)).await?;
        let hello = sse
            .next(Duration::from_secs(2))
            .await?
            .context("the stream ended before hello")?;
        assert_eq!(hello.name, "hello");
        Ok(sse)
    }

    async fn open_with(http: &reqwest::Client, base_url: &str, key: Option<&str>) -> Result<Sse> {
        Sse::open_url(http, &format!("{base_url}/api/events"), key).await
    }

    /// Opens the event stream at `url` (the lab's, `http://ADDR/v1/stations/events`).
    pub async fn open_url(http: &reqwest::Client, url: &str, key: Option<&str>) -> Result<Sse> {
        let headers: Vec<(&str, &str)> = key.map(|key| ("X-Api-Key", key)).into_iter().collect();
        Sse::open_with_headers(http, url, &headers).await
    }

    /// Opens the event stream at `url` with `headers` (a `Last-Event-ID`, an API key).
    pub async fn open_with_headers(
        http: &reqwest::Client,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Sse> {
        let mut request = http.get(url).header("Accept", "text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await?;
        if response.status() != 200 {
            bail!(
                "GET events: {} {}",
                response.status(),
                response.text().await?
            );
        }
        let content_type = response.headers()["content-type"].to_str()?.to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Ok(Sse {
            response,
            buf: Vec::new(),
            pings: 0,
            last_id: 0,
        })
    }

    /// Opens a stream and reads its hello.
    pub async fn open_hello(rig: &Rig) -> Result<(Sse, Json)> {
        let mut sse = Sse::open(rig).await?;
        let hello = sse
            .next(Duration::from_secs(2))
            .await?
            .context("the stream ended before hello")?;
        assert_eq!(hello.name, "hello");
        assert_eq!(hello.id % SEQUENCE_SPAN, 1, "a new stream's first event");
        Ok((sse, hello.data))
    }

    /// The next event; `None` when the stream ended; an error after `within` without one.
    pub async fn next(&mut self, within: Duration) -> Result<Option<Event>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(block)?;
                let (mut id, mut name, mut data) = (0, String::from("message"), Vec::new());
                for line in text.lines() {
                    if line.starts_with(':') {
                        continue;
                    }
                    let (key, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match key {
                        "id" => id = value.parse()?,
                        "event" => name = value.to_owned(),
                        "data" => data.push(value.to_owned()),
                        _ => {}
                    }
                }
                if data.is_empty() {
                    self.pings += 1;
                    continue;
                }
                assert_eq!(data.len(), 1, "one data line per event: {text}");
                if id != 0 {
                    self.last_id = id;
                }
                return Ok(Some(Event {
                    id,
                    name,
                    data: serde_json::from_str(&data[0])?,
                }));
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => bail!("no event within {within:?}"),
                Ok(Err(error)) => return Err(error.into()),
                Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
            }
        }
    }

    /// The next event called `name`, skipping others.
    pub async fn next_named(&mut self, name: &str, within: Duration) -> Result<Event> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .next(left)
                .await
                .with_context(|| format!("waiting for a {name} event"))?
            {
                Some(event) if event.name == name => return Ok(event),
                Some(_) => {}
                None => bail!("the stream ended while waiting for a {name} event"),
            }
        }
    }
}

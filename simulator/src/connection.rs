//! One client connection: frames in, requests answered concurrently up to the window, replies
//! and notifications out through one writer that applies the link's faults and pacing. When
//! the connection closes, its requests not yet carried out are abandoned (SPEC.md §4).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use station_protocol::frame::{HEADER_LEN, TRAILER_LEN};
use station_protocol::{
    ErrorCode, HelloReply, PROTOCOL_VERSION, PayloadError, RawFrame, Request, Response,
    StationCodec, StationError,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::shared::{ConnectionId, Shared};

/// Frames waiting for the writer; NOTIFYs are dropped when a slow client lets it fill up.
const OUTGOING_QUEUE: usize = 256;

/// The longest a closing connection waits for its requests being carried out (a bus
/// transaction waiting for its bus, an acquisition) to end.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);

/// The largest LIST page payload: one frame's payload less the page header.
const LIST_PAGE_BUDGET: usize = station_protocol::MAX_PAYLOAD - 16;

/// How a stream is served.
#[derive(Debug, Clone)]
pub(crate) struct LinkOptions {
    /// Requests in flight at once; HELLO reports it.
    pub window: u16,
    /// Pace replies as a serial line of this many bits per second would (10 bits a byte).
    pub baud: Option<u32>,
    /// Who is on the other end, for the write log.
    pub peer: String,
    /// Ends the connection when cancelled (a detached pty), besides the usual ways.
    pub stop: Option<CancellationToken>,
}

/// Serves `stream` until the client leaves, the connection is dropped or the simulator stops.
pub(crate) async fn serve<S>(shared: Arc<Shared>, stream: S, options: LinkOptions)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (id, cancel, outgoing_tx, outgoing_rx) = shared.register(OUTGOING_QUEUE);
    if let Some(stop) = options.stop.clone() {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                // In order: a deterministic simulation replays the same choice.
                biased;
                _ = stop.cancelled() => cancel.cancel(),
                _ = cancel.cancelled() => {}
            }
        });
    }
    tracing::debug!(connection = id.0, peer = %options.peer, "connection opened");
    let (read_half, write_half) = tokio::io::split(stream);
    // Acquisitions' frames: taken only when no other answer waits, one at a time, so an
    // answer waits at most for the data frame on the line (SPEC.md §6.12).
    let (stream_tx, stream_rx) = mpsc::channel::<RawFrame>(1);
    // The writer closes the station's side only once every request is carried out or
    // abandoned (SPEC.md §4), so it has a token of its own.
    let writer_stop = CancellationToken::new();
    let writer = tokio::spawn(write_frames(
        shared.clone(),
        write_half,
        outgoing_rx,
        stream_rx,
        options.baud,
        writer_stop.clone(),
    ));
    let mut frames = FramedRead::new(read_half, StationCodec::new());
    let in_flight = Arc::new(Semaphore::new(usize::from(options.window.max(1))));
    // On a paced line a request is whole only when its last byte has crossed the line; the
    // client handed over all of it at once, so count its wire time from when it was read.
    let mut line_in_free_at = Instant::now();
    loop {
        let frame = tokio::select! {
            // In order: a deterministic simulation replays the same choice.
            biased;
            _ = cancel.cancelled() => break,
            frame = frames.next() => frame,
        };
        let frame = match frame {
            Some(Ok(frame)) => frame,
            Some(Err(error)) => {
                tracing::debug!(connection = id.0, %error, "read failed");
                break;
            }
            None => break,
        };
        if shared.faults.stalled.load(Ordering::SeqCst) {
            continue;
        }
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            let busy = StationError::new(
                ErrorCode::Busy,
                format!(
                    "the station takes {} requests at once and has that many in flight",
                    options.window
                ),
            );
            let _ = outgoing_tx.try_send(error_frame(frame.request_id, busy));
            continue;
        };
        let arrived = options.baud.map(|baud| {
            line_in_free_at = line_in_free_at.max(Instant::now())
                + wire_time(HEADER_LEN + frame.payload.len() + TRAILER_LEN, baud);
            line_in_free_at
        });
        let shared = shared.clone();
        let outgoing = outgoing_tx.clone();
        let options = options.clone();
        let stream = stream_tx.clone();
        let closed = cancel.clone();
        tokio::spawn(async move {
            let _working = crate::shared::Working::start(shared.clone());
            let parsed = Request::from_frame(&frame);
            // A malformed request is answered at once; SAMPLE's channel latency is its rate's.
            let work = match &parsed {
                Ok(Request::Sample(_)) => shared.faults.processing(),
                Ok(request) => {
                    shared.faults.processing()
                        + shared.latency_of(request)
                        + shared.faults.take_next_write_extra(request)
                }
                Err(_) => Duration::ZERO,
            };
            let sample = match parsed {
                Ok(Request::Sample(request)) => Some(request),
                _ => None,
            };
            // Until its work is done the request has not been carried out: a close abandons it.
            let work = async {
                if let Some(arrived) = arrived {
                    pace_until(arrived).await;
                }
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
            };
            tokio::pin!(work);
            tokio::select! {
                biased;
                _ = closed.cancelled() => {
                    if !shared.faults.ignores_close.load(Ordering::SeqCst) || sample.is_some() {
                        shared.stats.abandoned.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    // A station that ignores SPEC.md §4: the closing connection does not wait,
                    // and the request is carried out behind its back, never answered.
                    drop(permit);
                    work.await;
                    let _ = answer(&shared, &frame, id, &options).await;
                    return;
                }
                _ = &mut work => {}
            }
            if let Some(request) = sample {
                crate::sampling::acquire_owned(shared, frame.request_id, request, stream, permit)
                    .await;
                return;
            }
            let reply = answer(&shared, &frame, id, &options).await;
            let delay = shared.faults.reply_delay();
            if !delay.is_zero() {
                tokio::select! {
                    // In order: a deterministic simulation replays the same choice.
                    biased;
                    _ = closed.cancelled() => {}
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            drop(permit);
            // A closed connection's requests are not answered.
            if !closed.is_cancelled() {
                let _ = outgoing.send(reply).await;
            }
        });
    }
    cancel.cancel();
    // Every request of this connection is carried out or abandoned before the connection is
    // gone (SPEC.md §4): each gives its window slot back when it is.
    let window = u32::from(options.window.max(1));
    let _ = tokio::time::timeout(CLOSE_LIMIT, in_flight.acquire_many(window)).await;
    writer_stop.cancel();
    drop(outgoing_tx);
    drop(stream_tx);
    let _ = writer.await;
    shared.unregister(id);
    tracing::debug!(connection = id.0, "connection closed");
}

fn error_frame(request_id: u32, error: StationError) -> RawFrame {
    let fallback = || RawFrame::new(station_protocol::Opcode::Error, request_id, Vec::new());
    Response::Error(error)
        .to_frame(request_id)
        .unwrap_or_else(|_| fallback())
}

/// Writes frames in order, applying stall, corruption and baud pacing.
async fn write_frames<W>(
    shared: Arc<Shared>,
    mut sink: W,
    mut frames: mpsc::Receiver<RawFrame>,
    mut stream: mpsc::Receiver<RawFrame>,
    baud: Option<u32>,
    cancel: CancellationToken,
) where
    W: AsyncWrite + Unpin,
{
    let mut line_free_at = Instant::now();
    loop {
        // Answers and notifications first; an acquisition's next frame only when none waits.
        let frame = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            frame = frames.recv() => frame,
            Some(frame) = stream.recv() => Some(frame),
        };
        let Some(frame) = frame else { break };
        if shared.faults.stalled.load(Ordering::SeqCst) {
            continue;
        }
        let Ok(mut bytes) = frame.to_bytes() else {
            continue;
        };
        let is_reply = frame.request_id != 0;
        let corrupt = |fault: &std::sync::atomic::AtomicBool| fault.swap(false, Ordering::SeqCst);
        let is_write_reply = frame.opcode == station_protocol::Opcode::WriteReply as u8;
        if is_reply
            && (corrupt(&shared.faults.corrupt_next)
                || (is_write_reply && corrupt(&shared.faults.corrupt_next_write_reply)))
        {
            // A payload byte, or the frame CRC when there is no payload: the header stays
            // intact, so the client's codec sees a whole frame whose CRC fails.
            let at = if bytes.len() > HEADER_LEN + 4 {
                HEADER_LEN
            } else {
                bytes.len() - 1
            };
            bytes[at] ^= 0xFF;
        }
        let written = match baud {
            None => sink.write_all(&bytes).await,
            Some(baud) => write_paced(&mut sink, &bytes, baud, &mut line_free_at).await,
        };
        if written.and(sink.flush().await).is_err() {
            break;
        }
        // The application restarts once its RESET reply is out (SPEC.md §6.10).
        if crate::reset::is_reset_reply(&frame) {
            crate::reset::restart(&shared);
        }
    }
    let _ = sink.shutdown().await;
}

/// Writes `bytes` no faster than a serial line of `baud` bits per second would carry them: the
/// frame is handed over when its last byte would have crossed the line. (Handing it over in
/// pieces would model no more: the client can do nothing with part of a frame, and every
/// piece would add a timer's rounding.)
async fn write_paced<W>(
    sink: &mut W,
    bytes: &[u8],
    baud: u32,
    line_free_at: &mut Instant,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    *line_free_at = (*line_free_at).max(Instant::now()) + wire_time(bytes.len(), baud);
    pace_until(*line_free_at).await;
    sink.write_all(bytes).await?;
    sink.flush().await
}

/// How long `bytes` take on a serial line of `baud` bits per second: 10 bits a byte (start,
/// 8 data, stop).
fn wire_time(bytes: usize, baud: u32) -> Duration {
    Duration::from_secs_f64(bytes as f64 * 10.0 / f64::from(baud))
}

/// Waits until `deadline` to within about 0.1 ms. tokio's timer rounds up to the next
/// millisecond, which on a frame of 3 ms would add a sixth; the last stretch is slept on a
/// blocking thread with the operating system's finer timer instead.
async fn pace_until(deadline: Instant) {
    const COARSE_SLACK: Duration = Duration::from_millis(2);
    let now = Instant::now();
    if deadline > now + COARSE_SLACK {
        tokio::time::sleep_until(deadline - COARSE_SLACK).await;
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    if !remaining.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(remaining)).await;
    }
}

/// The reply frame for one request frame.
async fn answer(
    shared: &Shared,
    frame: &RawFrame,
    id: ConnectionId,
    options: &LinkOptions,
) -> RawFrame {
    let request_id = frame.request_id;
    let request = match Request::from_frame(frame) {
        Ok(request) => request,
        Err(error) => {
            let code = match error {
                PayloadError::UnknownOpcode(_) | PayloadError::NotARequest(_) => {
                    ErrorCode::Unsupported
                }
                _ => ErrorCode::Malformed,
            };
            return error_frame(request_id, StationError::new(code, error.to_string()));
        }
    };
    let response = match request {
        Request::Bus(bus) => crate::bus::answer(shared, &bus, id, &options.peer).await,
        request => respond(shared, request, id, options),
    };
    match response.to_frame(request_id) {
        Ok(frame) => frame,
        Err(error) => error_frame(
            request_id,
            StationError::new(
                ErrorCode::BadValue,
                format!("the reply would not fit in one frame ({error}); ask for less at once"),
            ),
        ),
    }
}

fn respond(shared: &Shared, request: Request, id: ConnectionId, options: &LinkOptions) -> Response {
    let now = Instant::now();
    match request {
        Request::Hello(hello) => {
            if hello.version != PROTOCOL_VERSION {
                return Response::Error(StationError::new(
                    ErrorCode::Unsupported,
                    format!(
                        "protocol version {} is not supported; this station speaks {PROTOCOL_VERSION}",
                        hello.version
                    ),
                ));
            }
            let info = &shared.profile.station;
            Response::Hello(HelloReply {
                version: PROTOCOL_VERSION,
                station: info.name.clone(),
                firmware: info.firmware.clone(),
                serial: info.serial.clone(),
                window: options.window,
            })
        }
        Request::System => Response::System(shared.profile.modules.clone()),
        Request::List { offset, limit } => {
            let station = shared.lock_station();
            let total = station.channel_count();
            let limit = if limit == 0 {
                usize::MAX
            } else {
                usize::from(limit)
            };
            let mut channels = Vec::new();
            let mut budget = LIST_PAGE_BUDGET;
            let mut index = offset as usize;
            while channels.len() < limit {
                let Some(descriptor) = station.descriptor_at(index) else {
                    break;
                };
                let size = descriptor.encoded_len();
                if size > budget {
                    break;
                }
                budget -= size;
                channels.push(descriptor.clone());
                index += 1;
            }
            Response::List {
                total: u32::try_from(total).unwrap_or(u32::MAX),
                offset,
                channels,
            }
        }
        Request::Read { names } => {
            shared.stats.read_frames.fetch_add(1, Ordering::SeqCst);
            shared.record_batch(names.len());
            let results = {
                let mut station = shared.lock_station();
                names.iter().map(|name| station.read(name, now)).collect()
            };
            shared.flush_notifies();
            Response::Read(results)
        }
        Request::Write { items } => {
            let mut applied = Vec::new();
            let results = {
                let mut station = shared.lock_station();
                items
                    .into_iter()
                    .map(|(name, value)| {
                        station.write(&name, value, now).map(|write| {
                            applied.push(write);
                        })
                    })
                    .collect()
            };
            shared.log_writes(applied, id, &options.peer);
            shared.flush_notifies();
            Response::Write(results)
        }
        Request::Transact { name, value } => {
            let result = shared.lock_station().transact(&name, value, now);
            let response = match result {
                Ok((applied, read)) => {
                    shared.log_writes(vec![applied], id, &options.peer);
                    Response::Transact(read)
                }
                Err(error) => Response::Error(error),
            };
            shared.flush_notifies();
            response
        }
        Request::Ping { nonce } => Response::Ping { nonce },
        Request::Reset(reset) => crate::reset::respond(shared, &reset),
        Request::Configure(configure) => {
            let result = shared
                .lock_station()
                .configure(&configure.name, &configure.settings);
            // The NOTIFY goes out before the reply (SPEC.md §6.13).
            shared.flush_notifies();
            match result {
                Ok(reply) => Response::Configure(Box::new(reply)),
                Err(error) => Response::Error(error),
            }
        }
        // Served by `sampling` before it gets here; only a request it could not read comes.
        Request::Sample(_) => Response::Error(StationError::new(
            ErrorCode::Internal,
            "SAMPLE is answered by its own stream",
        )),
        // Answered by `bus::answer`, which may wait on the bus; never reached from `answer`.
        Request::Bus(bus) => match crate::bus::transact(&mut shared.lock_station(), &bus, now) {
            Ok(outcome) => Response::Bus(outcome.received),
            Err(error) => Response::Error(error),
        },
    }
}

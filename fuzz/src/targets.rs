//! The fuzz targets' bodies, shared by the cargo-fuzz binaries (`fuzz/fuzz_targets/`) and the
//! stable-Rust corpus run (`tests/fuzz_corpus.rs`), so both exercise exactly the same code.
//!
//! Each function must never panic, whatever the bytes; the properties checked inside (round
//! trips, bounded buffers) panic when they fail, which the fuzzer reports as a crash.

use bytes::BytesMut;
use station_gateway::http::LeaseNeed;
use station_gateway::http::body::JsonBody;
use station_protocol::{RawFrame, Request, Response, StationCodec, Value, ValueType};
use tokio_util::codec::{Decoder, Encoder};

/// The frame decoder: `data` as a byte stream fed in chunks, and `data` as one frame's opcode
/// and payload, through `StationCodec` and `Request`/`Response::from_frame`.
pub fn frame_decoder(data: &[u8]) {
    // 1. Arbitrary bytes through the codec, in chunks whose size the first byte picks.
    let chunk = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let mut codec = StationCodec::new();
    let mut buffer = BytesMut::new();
    let mut chunked = Vec::new();
    for piece in data.chunks(chunk) {
        buffer.extend_from_slice(piece);
        while let Some(frame) = codec.decode(&mut buffer).expect("decode never errs") {
            chunked.push(frame);
        }
        // Garbage is dropped as it comes: never more than one frame's worth is kept.
        assert!(buffer.len() <= station_protocol::MAX_PAYLOAD + 64 + piece.len());
    }
    let mut whole_codec = StationCodec::new();
    let mut whole = BytesMut::from(data);
    let mut at_once = Vec::new();
    while let Some(frame) = whole_codec.decode(&mut whole).expect("decode never errs") {
        at_once.push(frame);
    }
    assert_eq!(chunked, at_once, "chunking changed what was decoded");
    for frame in &chunked {
        messages(frame);
    }

    // 2. The same bytes as a valid frame (opcode, payload), so the message parsers see them.
    if let Some((&opcode, payload)) = data.split_first() {
        let frame = RawFrame {
            opcode,
            request_id: 7,
            payload: bytes::Bytes::copy_from_slice(payload),
        };
        let mut wire = BytesMut::new();
        if codec.encode(frame.clone(), &mut wire).is_ok() {
            let decoded = StationCodec::new()
                .decode(&mut wire)
                .expect("decode never errs")
                .expect("an encoded frame decodes");
            assert_eq!(decoded, frame);
            assert!(wire.is_empty());
        }
        messages(&frame);
    }
}

/// Parses a frame as a request and as a response; whatever parses must survive a round trip.
fn messages(frame: &RawFrame) {
    if let Ok(request) = Request::from_frame(frame)
        && let Ok(again) = request.to_frame(frame.request_id)
    {
        let back = Request::from_frame(&again).expect("a request we encoded parses");
        assert_eq!(format!("{back:?}"), format!("{request:?}"));
    }
    if let Ok(response) = Response::from_frame(frame)
        && let Ok(again) = response.to_frame(frame.request_id)
    {
        let back = Response::from_frame(&again).expect("a response we encoded parses");
        assert_eq!(format!("{back:?}"), format!("{response:?}"));
    }
}

const TYPES: [ValueType; 6] = [
    ValueType::Float,
    ValueType::Integer,
    ValueType::Bool,
    ValueType::Enum,
    ValueType::String,
    ValueType::Bytes,
];

/// Request bodies: `JsonBody::parse`, the typed requests the routes read them as (the
/// resources', leases', subscriptions', bus transactions', channel configurations'), what each
/// tells the request entry (a change's `asked=`, a cached read), the lease decision, and
/// `Value::parse_as` on the raw text and on every value the body carries.
pub fn request_body(data: &[u8]) {
    use station_gateway::http::requests::{
        RequestBody, access::AccessExplainRequest, channel_config::ChannelConfigRequest,
        channels::ChannelLookupRequest, comm::BusTransactionRequest,
        config_files::ConfigFileRequest, events::SubscriptionBody, lease::LeaseAcquireRequest,
        lease::LeaseRenewRequest, lease::NamedLeaseAcquireRequest, lease::NamedLeaseRenewRequest,
        numeric::NumericAcquireRequest, numeric::NumericMeasureRequest,
        resources::ResourceNameRequest, resources::ResourceValueRequest,
        resources::ResourceValuesRequest, resources::ResourceValuesSetRequest,
    };

    if let Ok(text) = std::str::from_utf8(data) {
        values(text);
    }
    let Ok(body) = JsonBody::parse(data) else {
        return;
    };
    /// What a typed body tells the request entry, if it types.
    fn told<T: RequestBody>(typed: Result<T, impl Sized>) -> bool {
        typed.is_ok_and(|typed| typed.asked().is_some() | typed.cached())
    }
    let _ = body.typed::<ResourceNameRequest>();
    let cached = body
        .typed::<ResourceValuesRequest>()
        .is_ok_and(|request| request.cached());
    let _ = told(body.typed::<LeaseAcquireRequest>());
    let _ = told(body.typed::<BusTransactionRequest>());
    let _ = told(body.typed::<NumericAcquireRequest>());
    let _ = told(body.typed::<NumericMeasureRequest>());
    let _ = told(body.typed::<ResourceValueRequest>());
    let _ = told(body.typed::<ResourceValuesSetRequest>());
    let _ = told(body.typed::<ConfigFileRequest>());
    let _ = body.typed::<LeaseRenewRequest>();
    let _ = body.typed::<NamedLeaseAcquireRequest>();
    let _ = body.typed::<NamedLeaseRenewRequest>();
    let _ = body.typed::<SubscriptionBody>();
    let _ = body.typed::<ChannelConfigRequest>();
    let _ = body.typed::<ChannelLookupRequest>();
    let _ = body.typed::<AccessExplainRequest>();
    for need in [
        LeaseNeed::ByMaxAge,
        LeaseNeed::Change,
        LeaseNeed::ForcedRead,
    ] {
        let _ = need.access(cached);
    }
    if let Ok(Ok((_, text))) = body.typed::<ResourceValueRequest>().map(|r| r.checked()) {
        values(&text.0);
    }
    if let Ok(asked) = body.typed::<ResourceValuesSetRequest>() {
        for text in asked
            .resources
            .into_values()
            .filter_map(|sent| sent.value.checked().ok())
        {
            values(&text.0);
        }
    }
}

/// `Value::parse_as` for every type; a parsed value renders to text that parses back to it.
fn values(text: &str) {
    let options = ["Red".to_owned(), "Green".to_owned(), "Blue".to_owned()];
    for wanted in TYPES {
        for options in [&options[..], &[]] {
            let Ok(value) = Value::parse_as(wanted, text, options) else {
                continue;
            };
            assert_eq!(value.value_type(), wanted);
            let rendered = value.render();
            if wanted == ValueType::String {
                continue; // string text is unescaped on the way in, not escaped on the way out
            }
            let again = Value::parse_as(wanted, &rendered, options)
                .unwrap_or_else(|e| panic!("{value:?} rendered as {rendered:?}: {e}"));
            assert_eq!(again, value, "{text:?} -> {rendered:?}");
        }
    }
}

//! cargo-fuzz target: the frame decoder (StationCodec, Request/Response::from_frame).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| station_fuzz::targets::frame_decoder(data));

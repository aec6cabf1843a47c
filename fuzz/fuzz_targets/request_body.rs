//! cargo-fuzz target: request bodies (JsonBody::parse, field binding, Value::parse_as).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| station_fuzz::targets::request_body(data));

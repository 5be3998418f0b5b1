#![no_main]
//! wire::Request::from_bytes; canonical round trip, and read-only requests dispatched to a fixture server (see cairn_fuzz::wire).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::wire::run_wire_request(data));

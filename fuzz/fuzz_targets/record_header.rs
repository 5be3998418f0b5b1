#![no_main]
//! RecordHeader::decode; a decoded header must re-encode to exactly the input.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::capsule::run_record_header(data));

#![no_main]
//! FObject::from_chunk; a decoded object must re-encode to exactly the input.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::run_fobject(data));

#![no_main]
//! One side of a real anti-entropy session driven by the input (see cairn_fuzz::wire::run_sync_session).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::wire::run_sync_session(data));

#![no_main]
//! SyncMsg::from_bytes; a decoded message must re-encode to exactly the input (see cairn_fuzz::wire).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::wire::run_sync_msg(data));

#![no_main]
//! cairn_net::frame: read_frame and FrameDecoder agree on arbitrary streams and limits (see cairn_fuzz::wire).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::wire::run_frame(data));

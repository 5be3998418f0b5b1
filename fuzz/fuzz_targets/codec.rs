#![no_main]
//! Decoder read sequences chosen by the input; Hash::from_bytes and Hash's FromStr.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::codec::run(data));

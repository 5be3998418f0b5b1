#![no_main]
//! merkle::verify_inclusion / verify_consistency, raw and as edits of a log's proofs (see cairn_fuzz::merkle).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::merkle::run(data));

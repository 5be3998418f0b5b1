#![no_main]
//! Checkable Diff and LCA answers over hostile chunks (see cairn_fuzz::evidence).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::evidence::run(data));

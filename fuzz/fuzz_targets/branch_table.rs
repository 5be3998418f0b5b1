#![no_main]
//! BranchTable::decode; a decoded table must re-encode to exactly the input.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::run_branch_table(data));

#![no_main]
//! Mutation::decode (a bucket record's body) must be canonical (see cairn_fuzz::bucket).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::bucket::run_mutation(data));

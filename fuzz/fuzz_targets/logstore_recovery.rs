#![no_main]
//! LogStore::open over damaged copies of a real store (see cairn_fuzz::logstore).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::logstore::run(data));

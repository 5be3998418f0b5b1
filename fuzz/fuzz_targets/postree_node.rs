#![no_main]
//! POS-tree nodes through the public readers (see cairn_fuzz::postree for the layout).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::postree::run(data));

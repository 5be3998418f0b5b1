#![no_main]
//! CapsuleMetadata::decode; decoded metadata must re-encode to exactly the input.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::capsule::run_capsule_metadata(data));

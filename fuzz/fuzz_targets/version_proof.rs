#![no_main]
//! VersionProof::from_bytes + verify, raw and as mutations of valid proofs (see
//! cairn_fuzz::bucket).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::bucket::run_version_proof(data));

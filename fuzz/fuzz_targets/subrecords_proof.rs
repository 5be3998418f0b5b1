#![no_main]
//! SubrecordsProof::decode + verify_with (multiproofs), raw and as mutations of valid
//! proofs (see cairn_fuzz::capsule).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fuzz::capsule::run_subrecords_proof(data));

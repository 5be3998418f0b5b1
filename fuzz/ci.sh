#!/usr/bin/env bash
# Runs every cargo-fuzz target of Cairn briefly.
#
#   fuzz/ci.sh                      # all targets, 20 s each
#   FUZZ_SECONDS=180 fuzz/ci.sh     # longer
#   fuzz/ci.sh postree_node codec   # some targets
#
# Environment: FUZZ_SECONDS (default 20), CARGO_TARGET_DIR (default
# ~/.cache/cairn-fuzz-target), FUZZ_LAX=1 to relax the byte-exact branch-table check to a
# semantic round trip.
# Exits 0 with "skipped: no nightly toolchain" when `cargo +nightly` is unavailable, 1 when a
# target crashed (its input is saved under fuzz/artifacts/<target>/).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "skipped: no nightly toolchain (cargo +nightly --version failed)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

secs="${FUZZ_SECONDS:-20}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cairn-fuzz-target}"
# BranchTable::decode is canonical now (the finding in README.md is fixed): the byte-exact
# round trip is checked unless FUZZ_LAX=1.
if [[ "${FUZZ_LAX:-0}" == 1 ]]; then
    export CAIRN_FUZZ_LAX_BRANCH_TABLE=1
fi
all=(codec fobject branch_table postree_node logstore_recovery
     capsule_metadata record_header record_proof subrecord_proof subrecords_proof merkle_proofs
     sync_msg sync_session wire_request wire_response frame bucket_mutation version_proof
     evidence)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")

echo "== building (nightly, release + debug assertions, ASan)"
cargo +nightly fuzz build -O -a
bin="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"

echo "== generating seeds"
gen="$CARGO_TARGET_DIR/cairn-fuzz-seeds"
rm -rf "$gen"
cargo +nightly run -q --release --example gen_seeds -- "$gen"

failed=()
summary=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    if [[ -d "regressions/$t" ]] && compgen -G "regressions/$t/*" >/dev/null; then
        echo "== $t: replaying regressions/$t"
        if ! "$bin/$t" -rss_limit_mb=2048 regressions/$t/* >"artifacts/$t/regressions.log" 2>&1; then
            echo "   a regression input fails (see fuzz/artifacts/$t/regressions.log)"
            failed+=("$t(regression)")
        fi
    fi
    echo "== $t: fuzzing ${secs}s"
    log="artifacts/$t/run.log"
    seeds=("$gen/$t")
    [[ -d "seeds/$t" ]] && seeds+=("seeds/$t")
    set +e
    "$bin/$t" "corpus/$t" "${seeds[@]}" \
        -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=30 \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1
    rc=$?
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    if [[ $rc -ne 0 ]]; then
        failed+=("$t")
        summary+=("$t: FAILED rc=$rc after ${execs:-?} execs; see fuzz/$log")
        grep -E "panicked|ERROR|Test unit written" "$log" | head -5 || true
    else
        summary+=("$t: ok, ${execs:-?} execs, ${speed:-?} exec/s, ${cov:-?}")
    fi
done

echo "== summary"
printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "failed: ${failed[*]}"
    exit 1
fi

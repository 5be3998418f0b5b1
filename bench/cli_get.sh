#!/usr/bin/env bash
# A/B of `cairn --server get` between two builds of the cairn binary, against one node.
#
#   bench/cli_get.sh BEFORE_BIN AFTER_BIN [TURNS]
#
# Starts `AFTER_BIN serve` (default config, group durability) on 127.0.0.1:7979 over a
# fresh data directory under $BENCH_DIR (default /tmp/cairn-cli-get), puts a 100 MB and a
# 1 GiB file of random bytes, then per turn, file and build: one untimed read whose output
# is compared with the file (`cmp`), then a timed "warm" read (the page cache holds the
# node's data), then a timed "cold" read after `sync; echo 3 > /proc/sys/vm/drop_caches`
# (needs root); timed reads write to /dev/null. The two builds take turns going first
# (before first on odd turns, after first on even ones). Prints wall milliseconds. Run it
# under the benchmark lock (`flock /tmp/cairn-bench.lock bench/cli_get.sh ...`) with
# nothing else running.
set -euo pipefail
before=$(realpath "$1")
after=$(realpath "$2")
turns="${3:-4}"
dir="${BENCH_DIR:-/tmp/cairn-cli-get}"
rm -rf "$dir/node" "$dir/cfg"
mkdir -p "$dir/cfg"
export XDG_CONFIG_HOME="$dir/cfg"
[[ -f "$dir/big.bin" ]] || head -c 1073741824 /dev/urandom > "$dir/big.bin"
[[ -f "$dir/mid.bin" ]] || head -c 100000000 /dev/urandom > "$dir/mid.bin"
"$after" --data "$dir/node" serve --listen 127.0.0.1:7979 > "$dir/node.log" 2>&1 &
node=$!
trap 'kill $node' EXIT
for _ in $(seq 50); do
    curl -sf http://127.0.0.1:7979/healthz > /dev/null && break
    sleep 0.1
done
server=http://127.0.0.1:7979
"$after" --server $server put big --file "$dir/big.bin" > /dev/null
"$after" --server $server put mid --file "$dir/mid.bin" > /dev/null
# Wall milliseconds of `BIN --server ... get KEY > /dev/null`.
ms() {
    local t0 t1
    t0=$(date +%s%N)
    "$1" --server $server get "$2" > /dev/null
    t1=$(date +%s%N)
    echo $(( (t1 - t0) / 1000000 ))
}
echo "turn file build warm_ms cold_ms"
for turn in $(seq "$turns"); do
    order="before after"
    (( turn % 2 == 0 )) && order="after before"
    for key in mid big; do
        file="$dir/$key.bin"
        for build in $order; do
            bin=$before
            [[ $build == after ]] && bin=$after
            # Untimed: warms the cache, and checks this build's output.
            "$bin" --server $server get $key | cmp - "$file"
            warm=$(ms "$bin" $key)
            sync
            echo 3 > /proc/sys/vm/drop_caches
            cold=$(ms "$bin" $key)
            echo "$turn $key $build $warm $cold"
        done
    done
done
echo "every untimed read's output equalled its file"

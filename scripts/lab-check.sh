#!/usr/bin/env bash
# The lab check, runnable by anyone: two simulated stations (two station-sim
# processes) behind one gateway process. It checks that two holders hold the two stations'
# leases at once, that a change reaches its own station and never the other, that a station
# stopped with SIGSTOP slows nobody else (the other's forced reads and lease renewal answer
# while the stopped one's read hangs), and that /v1/stations, /metrics and /readyz show both.
#
#   bash scripts/lab-check.sh
#
# It builds the two binaries with cargo first; GATEWAY_BIN and SIM_BIN name built ones instead.
# Every step prints "ok: ..."; the first that fails prints "FAILED: ..." and exits 1.
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ -z "${GATEWAY_BIN:-}" || -z "${SIM_BIN:-}" ]]; then
    cargo build --quiet -p station-gateway --bin station-gateway -p station-simulator --bin station-sim
    GATEWAY_BIN=${GATEWAY_BIN:-target/debug/station-gateway}
    SIM_BIN=${SIM_BIN:-target/debug/station-sim}
fi
command -v curl > /dev/null || { echo "FAILED: the check needs curl on PATH"; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill -CONT "$pid" 2> /dev/null || true
        kill "$pid" 2> /dev/null || true
    done
    wait 2> /dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "FAILED: $*"
    if [[ -f "$work/gateway.log" ]]; then
        echo "--- the gateway's log:"
        tail -n 30 "$work/gateway.log"
    fi
    exit 1
}
ok() { echo "ok: $*"; }

# The text after WHAT in FILE's first line holding it, waiting up to 30 s for it.
wait_for() {
    local file=$1 what=$2
    for _ in $(seq 1 300); do
        if grep -q "$what" "$file" 2> /dev/null; then
            grep -m1 "$what" "$file" | sed "s|.*$what||" | awk '{print $1}'
            return 0
        fi
        sleep 0.1
    done
    fail "no '$what' in $file within 30 s"
}

VSET1=0.4.ESH10000662.VSET1
V='{"Names": ["'$VSET1'"], "MaxAgeMs": 0}'

# Two stations, two identities: the default profile with a serial of each station's own (two
# simulators of one serial are one physical station to the gateway, which serves it once).
"$SIM_BIN" --print-default-profile > "$work/profile.toml"
grep -q '^serial = "ESH10000023"$' "$work/profile.toml" || fail "the default profile's serial is not ESH10000023"
for n in 1 2; do
    sed "0,/^serial = \"ESH10000023\"\$/s//serial = \"ESH1000002$n-LAB\"/" "$work/profile.toml" > "$work/profile$n.toml"
    "$SIM_BIN" --listen 127.0.0.1:0 --profile "$work/profile$n.toml" > "$work/sim$n.out" 2>&1 &
    pids+=($!)
    eval "sim${n}_pid=$!"
done
sim1=$(wait_for "$work/sim1.out" "listening ")
sim2=$(wait_for "$work/sim2.out" "listening ")
ok "two simulated stations: st1 at $sim1, st2 at $sim2"

cat > "$work/lab.toml" <<EOF
[http]
listen = "127.0.0.1:0"

[config_files]
dir = "$work/files"

[[station]]
id = "st1"
url = "tcp://$sim1"
request_timeout_ms = 20000

[[station]]
id = "st2"
url = "tcp://$sim2"
EOF
RUST_LOG=info NO_COLOR=1 "$GATEWAY_BIN" --config "$work/lab.toml" 2> "$work/gateway.log" &
pids+=($!)
gw=http://$(wait_for "$work/gateway.log" "HTTP listening on http://")
for _ in $(seq 1 300); do
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "$gw/readyz")" == 200 ]] && break
    sleep 0.1
done
[[ "$(curl -s -o /dev/null -w '%{http_code}' "$gw/readyz")" == 200 ]] || fail "/readyz: $(curl -s "$gw/readyz")"
ok "one gateway at $gw serves both: $(curl -s "$gw/readyz")"

# POST to a station's path: "STATUS BODY".
post() {
    local path=$1 body=$2 lease=${3:-}
    curl -s --max-time "${TIMEOUT:-5}" -w ' %{http_code}' -H 'Content-Type: application/json' \
        ${lease:+-H "X-Lease-Id: $lease"} -X "${METHOD:-POST}" -d "$body" "$gw$path" || echo " 000"
}
status_of() { echo "${1##* }"; }
lease_id() { sed -n 's/.*"leaseId":"\([0-9a-f]*\)".*/\1/p' <<< "$1"; }

one=$(post /stations/st1/api/lease '{"Owner": "bench one", "TtlMs": 60000}')
two=$(post /stations/st2/api/lease '{"Owner": "bench two", "TtlMs": 60000}')
[[ $(status_of "$one") == 200 && $(status_of "$two") == 200 ]] || fail "two holders: $one / $two"
lease1=$(lease_id "$one")
lease2=$(lease_id "$two")
ok "two holders at once: bench one holds st1, bench two holds st2"

answer=$(post /stations/st1/api/resources/value/set '{"Name": "'$VSET1'", "Value": "123"}' "$lease1")
[[ $(status_of "$answer") == 200 ]] || fail "bench one's change to st1: $answer"
answer=$(post /stations/st2/api/resources/value/set '{"Name": "'$VSET1'", "Value": "5"}' "$lease1")
[[ $(status_of "$answer") == 423 ]] || fail "bench one's lease at st2 must be refused: $answer"
on1=$(post /stations/st1/api/resources/values/get "$V" "$lease1")
on2=$(post /stations/st2/api/resources/values/get "$V" "$lease2")
grep -q '"123' <<< "$on1" || fail "st1 does not read back 123: $on1"
grep -q '"123' <<< "$on2" && fail "the change reached st2: $on2"
ok "bench one's change reached st1 (read from the hardware: 123) and never st2"

# Request frames st1's link has sent so far (from /metrics).
st1_frames() {
    curl -s "$gw/metrics" | sed -n 's/^station_gateway_link_requests_total{station="st1"} //p'
}

# st1 stops (SIGSTOP): its forced read hangs; st2's are answered meanwhile.
kill -STOP "$sim1_pid"
before=$(st1_frames)
TIMEOUT=30 post /stations/st1/api/resources/values/get "$V" "$lease1" > "$work/hung" &
hung=$!
for _ in $(seq 1 300); do
    [[ $(st1_frames) -gt $before ]] && break
    sleep 0.01
done
[[ $(st1_frames) -gt $before ]] || fail "st1's forced read was never sent"
started=$(date +%s%N)
for i in 1 2 3 4 5; do
    answer=$(TIMEOUT=2 post /stations/st2/api/resources/values/get "$V" "$lease2")
    [[ $(status_of "$answer") == 200 ]] || fail "st2's forced read $i while st1 is stopped: $answer"
done
answer=$(TIMEOUT=2 METHOD=PUT post "/stations/st2/api/lease/$lease2" '{}')
[[ $(status_of "$answer") == 200 ]] || fail "st2's renewal while st1 is stopped: $answer"
took=$(( ($(date +%s%N) - started) / 1000000 ))
kill -0 "$hung" 2> /dev/null || fail "st1's read ended while st1 was stopped: $(cat "$work/hung")"
ok "st1 stopped (SIGSTOP): st2's 5 forced reads and its renewal answered in $took ms while st1's read waited"
kill -CONT "$sim1_pid"
wait "$hung" || true
ok "st1 resumed: its read answered $(status_of "$(cat "$work/hung")")"

stations=$(curl -s "$gw/v1/stations")
grep -q '"id":"st1"' <<< "$stations" && grep -q '"id":"st2"' <<< "$stations" \
    || fail "/v1/stations: $stations"
grep -q '"holder":"bench one"' <<< "$stations" && grep -q '"holder":"bench two"' <<< "$stations" \
    || fail "/v1/stations names both holders: $stations"
ok "/v1/stations shows both stations and their holders"
metrics=$(curl -s "$gw/metrics")
grep -q 'station_gateway_link_connected{station="st1"} 1' <<< "$metrics" \
    && grep -q 'station_gateway_link_connected{station="st2"} 1' <<< "$metrics" \
    || fail "/metrics has no link_connected of both stations"
ok "/metrics labels both stations' series"
echo "lab check passed"

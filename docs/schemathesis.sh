#!/usr/bin/env bash
# Runs schemathesis against a gateway with its embedded simulator, using the OpenAPI document
# the gateway serves at /openapi.json. Documented run, not part of CI (see RELIABILITY.md).
#   docs/schemathesis.sh [max-examples]        (needs target/*/station-gateway built)
# Checks: no undocumented status (so no 500), response schemas, content types. 502/503/504
# are documented for endpoints that reach the station and are the link's state, not bugs.
set -euo pipefail
examples=${1:-100}
gateway=${GATEWAY_BIN:-${CARGO_TARGET_DIR:-target}/debug/station-gateway}
venv=${SCHEMATHESIS_VENV:-/tmp/st-venv}
[ -x "$venv/bin/st" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q schemathesis; }
log=$(mktemp)
"$gateway" --simulator --http 127.0.0.1:0 --log-format human >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do
    addr=$(grep -o 'HTTP listening on http://[0-9.:]*' "$log" | sed 's/.*http:\/\///' || true)
    [ -n "$addr" ] && break
    sleep 0.1
done
[ -n "$addr" ] || { cat "$log"; exit 1; }
"$venv/bin/st" run "http://$addr/openapi.json" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --max-examples "$examples" --workers 2 --request-timeout 10 \
    --exclude-path /api/events \
    ${SCHEMATHESIS_ARGS:-}

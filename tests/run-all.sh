#!/usr/bin/env bash
# Runs every test of Station Gateway, from a fresh machine: builds the workspace, brings up what
# the tests need (PostgreSQL and Redis for the lease backend tests, Chromium for the status page
# test), runs the Rust tests, sets up a Python virtual environment with the reference client
# (accordionq2) and pytest, runs the reference-client suite against the built gateway, and ends
# with one summary:
#
#   summary: N passed, N failed, N skipped
#
#   bash tests/run-all.sh                      everything
#   bash tests/run-all.sh --with-services CMD  only the services part: brings up PostgreSQL and
#                                              Redis as the full run does, runs CMD with their URLs
#                                              exported, stops them (e.g. CMD = cargo test --test
#                                              gateway lease_backends)
#
# Services: the tests keep to a database of their own on the server they find (PostgreSQL:
# station_gateway_test, created when absent; Redis: database 15), unless LEASE_TEST_POSTGRES_URL
# or LEASE_TEST_REDIS_URL names one. When nothing answers at LEASE_TEST_POSTGRES_URL (default
# postgres://postgres@127.0.0.1:5432/test) or LEASE_TEST_REDIS_URL (default
# redis://127.0.0.1:6379), a private one is started for this run on a free port (Redis without
# persistence; PostgreSQL with initdb in a temporary directory, database `test`), its URL is
# exported to the tests, and it is stopped at the end, also on failure or Ctrl-C. Missing
# binaries (redis-server, initdb, chromium) are installed with apt-get (as root, or with
# passwordless sudo), each announced in one line.
#
# Every suite runs; the script fails at the end if any test failed or could not run. Environment:
#   CARGO_TARGET_DIR     where cargo builds (default: target/); the suite uses its debug build
#   STATION_GATEWAY_BIN  the gateway binary the Python suite runs (default: from CARGO_TARGET_DIR)
#   PYTHON               the Python used to create the venv (default: python3)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac

step() { printf '\n==> %s\n' "$*"; }
say() { printf 'run-all: %s\n' "$*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/run-all.XXXXXX")
services=() # one line each for the summary: what was used or started
redis_pid=""
postgres_dir=""
postgres_bin=""
postgres_user=""

# ---------------------------------------------------------------------------------------------
# Installing what is missing

# Runs a command as root: directly when we are root, else with passwordless sudo.
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        return 1
    fi
}

# apt_install WHY PACKAGE...: installs Debian packages, saying in one line what and why.
apt_install() {
    local why=$1
    shift
    if ! command -v apt-get >/dev/null 2>&1; then
        say "$* missing ($why), and there is no apt-get here: install it yourself"
        return 1
    fi
    if ! as_root true; then
        say "$* missing ($why): installing it needs root or passwordless sudo; install it yourself"
        return 1
    fi
    say "installing $* with apt-get: $why"
    if ! { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq "$@"; } >"$work/apt-$1.log" 2>&1; then
        say "could not install $*: apt-get said: $(tail -1 "$work/apt-$1.log")"
        return 1
    fi
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL and Redis

# The host and port of scheme://[user[:password]@]host[:port][/path][?query]; DEFAULT_PORT when
# the URL has none.
url_host_port() {
    local url=$1 default_port=$2 rest
    rest=${url#*://}
    rest=${rest%%/*}
    rest=${rest%%\?*}
    rest=${rest##*@}
    if [[ $rest == *:* ]]; then
        printf '%s %s\n' "${rest%:*}" "${rest##*:}"
    else
        printf '%s %s\n' "${rest:-127.0.0.1}" "$default_port"
    fi
}

# Whether something accepts TCP connections at HOST PORT (within 3 s).
tcp_open() {
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

redis_reachable() {
    local host port
    read -r host port < <(url_host_port "$1" 6379)
    if command -v redis-cli >/dev/null 2>&1; then
        [[ $(timeout 5 redis-cli -u "$1" ping 2>/dev/null) == PONG ]]
    else
        tcp_open "$host" "$port"
    fi
}

postgres_reachable() {
    local host port
    read -r host port < <(url_host_port "$1" 5432)
    if command -v pg_isready >/dev/null 2>&1; then
        pg_isready -q -t 3 -d "$1" >/dev/null 2>&1
    else
        tcp_open "$host" "$port"
    fi
}

free_port() {
    "${PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits (at most 30 s) until CHECK... succeeds; fails with a message otherwise.
wait_until() {
    local what=$1 deadline=$((SECONDS + 30))
    shift
    until "$@"; do
        if ((SECONDS > deadline)); then
            say "$what did not come up within 30 s"
            return 1
        fi
        sleep 0.1
    done
}

start_private_redis() {
    local configured=$1 port
    if ! command -v redis-server >/dev/null 2>&1; then
        apt_install "nothing answers at $configured and the Redis lease tests need a Redis" \
            redis-server || return 1
    fi
    port=$(free_port)
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
        --dir "$work" --logfile "$work/redis.log" --daemonize no </dev/null &
    redis_pid=$!
    if ! wait_until "redis-server on 127.0.0.1:$port" tcp_open 127.0.0.1 "$port"; then
        say "its log: $(tail -3 "$work/redis.log" 2>/dev/null)"
        return 1
    fi
    export LEASE_TEST_REDIS_URL=redis://127.0.0.1:$port
    services+=("Redis: nothing answered at $configured; started redis-server on 127.0.0.1:$port for this run (no persistence)")
}

# The directory of initdb, pg_ctl and createdb: from PATH, else Debian's /usr/lib/postgresql/*/bin.
find_postgres_bin() {
    local initdb
    if initdb=$(command -v initdb); then
        dirname "$(readlink -f "$initdb")"
        return
    fi
    initdb=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)
    [[ -n $initdb ]] && dirname "$initdb"
}

# Runs a PostgreSQL tool as the unprivileged owner of the private cluster (initdb refuses root).
as_postgres_user() {
    if [[ -n $postgres_user ]]; then
        runuser -u "$postgres_user" -- "$@"
    else
        "$@"
    fi
}

start_private_postgres() {
    local configured=$1 port
    if ! postgres_bin=$(find_postgres_bin); then
        apt_install "nothing answers at $configured and the PostgreSQL lease tests need a PostgreSQL" \
            postgresql || return 1
        postgres_bin=$(find_postgres_bin) || { say "postgresql installed, but no initdb found"; return 1; }
    fi
    if [[ $(id -u) -eq 0 ]]; then
        if id postgres >/dev/null 2>&1; then postgres_user=postgres; else postgres_user=nobody; fi
    fi
    postgres_dir=$(mktemp -d "${TMPDIR:-/tmp}/run-all-postgres.XXXXXX")
    [[ -z $postgres_user ]] || chown "$postgres_user" "$postgres_dir"
    port=$(free_port)
    if ! as_postgres_user "$postgres_bin/initdb" -D "$postgres_dir/data" -U postgres -A trust \
        --no-locale -E UTF8 --no-sync >"$work/initdb.log" 2>&1; then
        say "initdb failed: $(tail -1 "$work/initdb.log")"
        return 1
    fi
    if ! as_postgres_user "$postgres_bin/pg_ctl" -D "$postgres_dir/data" -l "$postgres_dir/server.log" \
        -w -t 30 -o "-p $port -k $postgres_dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        start >"$work/pg_ctl.log" 2>&1; then
        say "PostgreSQL did not start: $(tail -2 "$postgres_dir/server.log" 2>/dev/null)"
        return 1
    fi
    if ! as_postgres_user "$postgres_bin/createdb" -h 127.0.0.1 -p "$port" -U postgres \
        station_gateway_test >"$work/createdb.log" 2>&1; then
        say "createdb station_gateway_test failed: $(tail -1 "$work/createdb.log")"
        return 1
    fi
    export LEASE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$port/station_gateway_test
    services+=("PostgreSQL: nothing answered at $configured; started one on 127.0.0.1:$port for this run (initdb in $postgres_dir, database station_gateway_test)")
}

# On the machine's own PostgreSQL at URL, the tests' own database station_gateway_test (created
# when absent), never the user's: exports LEASE_TEST_POSTGRES_URL. False when it cannot be had.
own_postgres_database() {
    local server=${1%/*} exists
    command -v psql >/dev/null 2>&1 || { say "no psql to create the tests' own database on $1"; return 1; }
    exists=$(psql "$server/postgres" -tAc "SELECT 1 FROM pg_database WHERE datname = 'station_gateway_test'" 2>"$work/psql.log") || {
        say "cannot ask $server for databases: $(tail -1 "$work/psql.log")"
        return 1
    }
    if [[ $exists != 1 ]] && ! psql "$server/postgres" -qc "CREATE DATABASE station_gateway_test" >"$work/psql.log" 2>&1; then
        say "cannot create station_gateway_test on $server: $(tail -1 "$work/psql.log")"
        return 1
    fi
    export LEASE_TEST_POSTGRES_URL=$server/station_gateway_test
}

# Makes LEASE_TEST_POSTGRES_URL and LEASE_TEST_REDIS_URL point at a service that answers: the
# tests' own database on it (PostgreSQL: station_gateway_test; Redis: database 15) unless the URL
# was given, so that they never touch the user's data.
bring_up_services() {
    local redis_url=${LEASE_TEST_REDIS_URL:-redis://127.0.0.1:6379}
    local postgres_url=${LEASE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
    step "services for the lease backend tests"
    if redis_reachable "$redis_url"; then
        if [[ -z ${LEASE_TEST_REDIS_URL:-} ]]; then
            # The machine's own Redis: the tests keep to a database index of their own.
            redis_url=${redis_url%/}/15
            export LEASE_TEST_REDIS_URL=$redis_url
            services+=("Redis: used database 15 of the one at ${redis_url%/15} (the tests' own; set LEASE_TEST_REDIS_URL to choose another)")
        else
            services+=("Redis: used the one at $redis_url")
        fi
    elif ! start_private_redis "$redis_url"; then
        services+=("Redis: nothing answers at $redis_url and none could be started; the Redis lease tests fail")
    fi
    if postgres_reachable "$postgres_url" && { [[ -n ${LEASE_TEST_POSTGRES_URL:-} ]] || own_postgres_database "$postgres_url"; }; then
        services+=("PostgreSQL: used the database at ${LEASE_TEST_POSTGRES_URL:-$postgres_url}")
    elif ! start_private_postgres "$postgres_url"; then
        services+=("PostgreSQL: nothing answers at $postgres_url and none could be started; the PostgreSQL lease tests fail")
    fi
    printf '%s\n' "${services[@]}"
}

stop_services() {
    if [[ -n $redis_pid ]]; then
        kill "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
        redis_pid=""
    fi
    if [[ -n $postgres_dir ]]; then
        if [[ -f $postgres_dir/data/postmaster.pid ]]; then
            as_postgres_user "$postgres_bin/pg_ctl" -D "$postgres_dir/data" -m fast -w stop \
                >/dev/null 2>&1 || true
        fi
        rm -rf "$postgres_dir"
        postgres_dir=""
    fi
}

cleanup() {
    stop_services
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ ${1:-} == --with-services ]]; then
    shift
    [[ $# -gt 0 ]] || { echo "usage: bash tests/run-all.sh --with-services COMMAND [ARG...]" >&2; exit 2; }
    bring_up_services
    step "$*"
    status=0
    "$@" || status=$?
    exit "$status"
fi

# ---------------------------------------------------------------------------------------------
# The full run

# The status page tests (tests/gateway/operations.rs, tests/gateway/status_page.rs) drive headless Chromium and
# fail without it.
have_chromium() {
    local name
    for name in chromium chromium-browser google-chrome; do
        "$name" --version >/dev/null 2>&1 && return 0
    done
    return 1
}
if ! have_chromium; then
    apt_install "the status page test (tests/gateway/operations.rs) drives headless Chromium, and none is installed" \
        chromium || say "without Chromium the status page test fails"
fi

# A failing suite doesn't stop the others: every test runs, and the script fails at the end.
failed=()

step "cargo build --workspace --all-targets"
cargo build --workspace --all-targets || failed+=("cargo build --workspace --all-targets")

bring_up_services

step "cargo test --workspace"
rust_passed=0 rust_failed=0 rust_ignored=0
status=0
cargo test --workspace --no-fail-fast 2>&1 | tee "$work/cargo-test.log" || status=$?
# One `test result: ok. 12 passed; 0 failed; 1 ignored; ...` line per test binary and doc-test run.
while read -r passed failed_count ignored; do
    rust_passed=$((rust_passed + passed))
    rust_failed=$((rust_failed + failed_count))
    rust_ignored=$((rust_ignored + ignored))
done < <(sed -nE 's/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed; ([0-9]+) ignored.*/\1 \2 \3/p' \
    "$work/cargo-test.log")
if ((status != 0)); then
    failed+=("cargo test --workspace (exit $status)")
    # A build error or a test binary that crashed fails without a `test result` line.
    ((rust_failed > 0)) || rust_failed=1
fi

# The lab's deterministic simulation (dst/README.md): a short run of seeds, each counted as a
# test. Its last line: `dst: N seeds, F failed, simulated S s in W s wall`.
step "station-dst --seeds 200 (the lab's deterministic simulation)"
dst_passed=0 dst_failed=0
status=0
"$target_dir/debug/station-dst" --seeds 200 2>&1 | tee "$work/dst.log" || status=$?
if read -r dst_seeds dst_failed < <(sed -nE 's/^dst: ([0-9]+) seeds, ([0-9]+) failed.*/\1 \2/p' "$work/dst.log"); then
    dst_passed=$((dst_seeds - dst_failed))
fi
if ((status != 0)); then
    failed+=("station-dst --seeds 200 (exit $status)")
    ((dst_failed > 0)) || dst_failed=1
fi
rust_passed=$((rust_passed + dst_passed))
rust_failed=$((rust_failed + dst_failed))

py_passed=0 py_failed=0 py_skipped=0
venv=$root/target/pyenv
python_ready=true
if [[ ! -x $venv/bin/python ]]; then
    step "creating the Python virtual environment $venv"
    if ! "${PYTHON:-python3}" -m venv "$venv" 2>"$work/venv.log"; then
        rm -rf "$venv"
        # Debian and Ubuntu ship python3 without venv (ensurepip) unless python3-venv is installed.
        if grep -q ensurepip "$work/venv.log" \
            && apt_install "the Python suite runs in a virtual environment, and python3 cannot make one without it" python3-venv \
            && "${PYTHON:-python3}" -m venv "$venv"; then
            :
        else
            cat "$work/venv.log"
            python_ready=false
            failed+=("python: could not create the virtual environment $venv")
        fi
    fi
fi
if $python_ready; then
    step "installing accordionq2 and pytest into $venv"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check accordionq2==5.28.1 pytest; then
        python_ready=false
        failed+=("python: pip could not install accordionq2==5.28.1 and pytest (PyPI reachable?)")
    fi
fi
if $python_ready; then
    export STATION_GATEWAY_BIN=${STATION_GATEWAY_BIN:-$target_dir/debug/station-gateway}
    export PYTHONDONTWRITEBYTECODE=1
    # Twice: against a one-station gateway, then the unchanged suite against one station of a
    # gateway of two, through its base URL http://ADDR/stations/sim2.
    for lab in "" sim2; do
        if [[ -z $lab ]]; then
            step "pytest tests/python (gateway: $STATION_GATEWAY_BIN)"
        else
            step "pytest tests/python against station $lab of a gateway of two (STATION_GATEWAY_LAB=$lab)"
        fi
        status=0
        STATION_GATEWAY_LAB=$lab "$venv/bin/python" -m pytest tests/python -q 2>&1 | tee "$work/pytest.log" || status=$?
        # pytest's last line: `3 failed, 80 passed, 1 skipped, 2 errors in 41.20s`.
        result=$(grep -E '[0-9]+ (passed|failed|skipped|errors?)' "$work/pytest.log" | tail -1 || true)
        count() { grep -oE "[0-9]+ $1" <<<"$result" | grep -oE '^[0-9]+' || echo 0; }
        py_passed=$((py_passed + $(count passed)))
        run_failed=$(($(count failed) + $(count 'errors?')))
        py_skipped=$((py_skipped + $(count skipped)))
        case $status in
            0) ;;
            5) failed+=("pytest tests/python${lab:+ (station $lab)} (no tests collected)") ;;
            *) failed+=("pytest tests/python${lab:+ (station $lab)} (exit $status)") ;;
        esac
        if ((status != 0 && run_failed == 0)); then run_failed=1; fi
        py_failed=$((py_failed + run_failed))
    done
    # A skip is not a pass: it is counted in the summary as skipped, and none is expected.
fi

step "summary"
# cargo says "ignored" for an opt-in #[ignore] test (the soak test): one word, "skipped", in
# every count here.
printf 'rust (cargo test --workspace, and station-dst seeds): %d passed, %d failed, %d skipped (opt-in #[ignore] tests, such as the soak test)\n' \
    "$rust_passed" "$rust_failed" "$rust_ignored"
if $python_ready; then
    printf 'python (pytest tests/python, one station and station sim2 of two): %d passed, %d failed, %d skipped\n' \
        "$py_passed" "$py_failed" "$py_skipped"
else
    printf 'python (pytest tests/python): did not run\n'
    py_failed=1
fi
printf 'services: %s\n' "${services[@]}"
for failure in "${failed[@]}"; do
    printf 'FAILED: %s\n' "$failure"
done
total_failed=$((rust_failed + py_failed))
if ((${#failed[@]} && total_failed == 0)); then total_failed=1; fi
printf 'summary: %d passed, %d failed, %d skipped\n' \
    "$((rust_passed + py_passed))" "$total_failed" "$((rust_ignored + py_skipped))"
((${#failed[@]} == 0))

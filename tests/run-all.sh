#!/usr/bin/env bash
# Runs every test of Station Gateway, from a fresh machine: builds the workspace, runs the Rust
# tests, sets up a Python virtual environment with the reference client (accordionq2) and
# pytest, and runs the reference-client suite against the built gateway.
#
#   bash tests/run-all.sh
#
# Exits non-zero on any failure. Environment:
#   CARGO_TARGET_DIR     where cargo builds (default: target/); the suite uses its debug build
#   STATION_GATEWAY_BIN  the gateway binary the Python suite runs (default: from CARGO_TARGET_DIR)
#   PYTHON               the Python used to create the venv (default: python3)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac

step() { printf '\n==> %s\n' "$*"; }

# The status page test (tests/operations.rs) drives headless Chromium, and fails under CI
# without it: install it when missing (as root, or with passwordless sudo).
if ! command -v chromium >/dev/null 2>&1; then
    step "installing chromium (for the status page test)"
    sudo=""
    if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; fi
    $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
        || echo "run-all: could not install chromium; the status page test fails under CI without it" >&2
fi

step "cargo build --workspace --all-targets"
cargo build --workspace --all-targets

# A failing suite doesn't stop the others: every test runs, and the script fails at the end.
failed=()

step "cargo test --workspace"
cargo test --workspace --no-fail-fast || failed+=("cargo test --workspace")

venv=$root/target/pyenv
if [[ ! -x $venv/bin/python ]]; then
    step "creating the Python virtual environment $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
step "installing accordionq2 and pytest into $venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check accordionq2==5.28.1 pytest

export STATION_GATEWAY_BIN=${STATION_GATEWAY_BIN:-$target_dir/debug/station-gateway}
export PYTHONDONTWRITEBYTECODE=1
step "pytest tests/python (gateway: $STATION_GATEWAY_BIN)"
status=0
"$venv/bin/python" -m pytest tests/python -q || status=$?
case $status in
    0) ;;
    5) failed+=("pytest tests/python (no tests collected)") ;;
    *) failed+=("pytest tests/python (exit $status)") ;;
esac

if ((${#failed[@]})); then
    printf '\nrun-all: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
step "all tests passed"

"""`station-lease hold` around a Python step that hands its lease to accordionq2, as
docs/leases.md shows it: the step's changes go through with
`default_headers={"X-Lease-Id": os.environ["STATION_LEASE_ID"]}`, another client gets 423
meanwhile, the step's exit status is station-lease's, and the lease is released at the end.

The binary is the lease crate's, built by `cargo build --workspace` (tests/run-all.sh does):
$STATION_LEASE_BIN, else `station-lease` beside the gateway binary."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from accordionq2 import AccordionQ2Client

import station
from gatewayproc import gateway_bin
from station import wait_for

OWNER = "TAT station 3"
TIMEOUT_S = 30.0


def station_lease_bin() -> Path:
    configured = os.environ.get("STATION_LEASE_BIN")
    path = Path(configured) if configured else gateway_bin().parent / "station-lease"
    if not path.exists():
        pytest.fail(
            f"{path} does not exist: build it first (cargo build --workspace, or cargo build -p "
            "station-lease), or point STATION_LEASE_BIN at it"
        )
    return path


SEQUENCE = textwrap.dedent(
    f"""
    import os
    import sys

    from accordionq2 import AccordionQ2ApiError, AccordionQ2Client

    client = AccordionQ2Client(
        os.environ["STATION_GATEWAY_URL"],
        default_headers={{"X-Lease-Id": os.environ["STATION_LEASE_ID"]}},
    )
    client.resources.set_value("{station.VSET1}", "12.5")
    print("set", client.resources.get_value("{station.VSET1}"))
    other = AccordionQ2Client(os.environ["STATION_GATEWAY_URL"])
    try:
        other.resources.set_value("{station.VSET1}", "99")
        print("other went through")
    except AccordionQ2ApiError as error:
        print("other refused", error.status_code)
    print("fence", os.environ["STATION_LEASE_FENCE"])
    sys.exit(7)
    """
)


def test_a_python_step_changes_the_station_with_the_lease_station_lease_holds(
    gateway_url: str, hv1: AccordionQ2Client, tmp_path: Path
) -> None:
    sequence = tmp_path / "sequence.py"
    sequence.write_text(SEQUENCE)
    done = subprocess.run(
        [
            str(station_lease_bin()), "hold", "--gateway", gateway_url, "--owner", OWNER,
            "--ttl-ms", "3000", "--", sys.executable, str(sequence),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 7, f"exit {done.returncode}; stderr:\n{done.stderr}\nstdout:\n{done.stdout}"
    lines = done.stdout.splitlines()
    assert lines[0] in ("set 12.5", "set 12.5000"), lines
    assert lines[1] == "other refused 423", lines
    assert lines[2].startswith("fence ") and int(lines[2].split()[1]) >= 1, lines
    # Released when the step ended: anyone may change the station again.
    wait_for(lambda: not hv1.lease.get().held, 5, "the lease released")
    hv1.resources.set_value(station.VSET1, "0")


def test_a_lease_held_elsewhere_is_exit_75_and_the_step_never_runs(
    client: AccordionQ2Client, gateway_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with client.lease.hold("TAT station 7", ttl_ms=30_000):
        done = subprocess.run(
            [
                str(station_lease_bin()), "hold", "--gateway", gateway_url, "--owner", OWNER,
                "--ttl-ms", "3000", "--wait-ms", "200", "--",
                sys.executable, "-c", f"open({str(marker)!r}, 'w').close()",
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    assert done.returncode == 75, done.stderr
    assert done.stderr.startswith("station-lease: "), done.stderr
    assert "TAT station 7" in done.stderr, done.stderr
    assert not marker.exists()


def test_a_ctrl_c_typed_at_the_terminal_reaches_the_step_and_the_lease_is_released(
    client: AccordionQ2Client, gateway_url: str, tmp_path: Path
) -> None:
    """In a terminal, Ctrl-C goes to the whole foreground process group, the step included, and
    station-lease, which takes it for typed there, does not send it again: the step still gets
    it (a second one often merges with the first, so that part is not asserted)."""
    import pty

    up, interrupts = tmp_path / "up", tmp_path / "interrupts"
    step = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGINT, lambda *_: open({str(interrupts)!r}, 'a').write('int\\n'))\n"
        f"open({str(up)!r}, 'w').close()\n"
        "end = time.monotonic() + 1.0\n"
        "while time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        "sys.exit(4)\n"
    )
    args = [
        str(station_lease_bin()), "hold", "--gateway", gateway_url, "--owner", OWNER,
        "--ttl-ms", "3000", "--", sys.executable, "-c", step,
    ]
    pid, terminal = pty.fork()
    if pid == 0:  # the child: station-lease, with the pty as its controlling terminal
        os.execv(args[0], args)
    try:
        wait_for(up.exists, TIMEOUT_S, "the step to start")
        os.write(terminal, b"\x03")  # Ctrl-C
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 4
    assert interrupts.read_text().count("int") >= 1, "the step never got the Ctrl-C"
    wait_for(lambda: not client.lease.get().held, 5, "the lease released")

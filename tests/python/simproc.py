"""Running the standalone `station-sim` for tests that need a station they can fault.

It is started with `--listen 127.0.0.1:0 --control 127.0.0.1:0` and prints `listening ADDR` and
`control ADDR` on stdout; both are read by a thread, with a deadline (no sleeps for start-up).
`control("drop")`, `control("remove NAME")`, `control("refuse on")`, ... send one line of the
simulator's control interface (simulator/src/control.rs) and return its one-line answer.
"""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

from gatewayproc import REPO_ROOT, START_TIMEOUT_S, STOP_TIMEOUT_S, gateway_bin

_LINE = re.compile(r"^(listening|control) (\S+)$")


def sim_bin() -> Path:
    """`station-sim`, built next to the gateway binary (STATION_GATEWAY_BIN's directory)."""
    return gateway_bin().parent / "station-sim"


class SimProcess:
    """One running station-sim; `addr` is its station TCP address, `control_addr` its control one."""

    def __init__(self, *extra_args: str) -> None:
        binary = sim_bin()
        if not binary.exists():
            raise RuntimeError(
                f"{binary} does not exist: build it first (cargo build -p station-simulator --bins)"
            )
        self.proc = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", *extra_args],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "NO_COLOR": "1"},
        )
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), name="station-sim-output", daemon=True).start()
        self.addr = ""
        self.control_addr = ""
        self._control: socket.socket | None = None
        self._control_file = None
        try:
            self._wait_addresses()
        except BaseException:
            self.kill()
            raise

    def _read(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.output.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _wait_addresses(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        ends = 0
        while not (self.addr and self.control_addr):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"station-sim did not print its addresses within {timeout} s: {self.output}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                ends += 1
                if ends == 2:
                    raise RuntimeError(f"station-sim exited ({self.proc.wait()}) before listening: {self.output}")
                continue
            match = _LINE.match(line.strip())
            if match and match.group(1) == "listening":
                self.addr = match.group(2)
            elif match:
                self.control_addr = match.group(2)

    @property
    def url(self) -> str:
        """The gateway's `--station` value for this simulator."""
        return f"tcp://{self.addr}"

    def control(self, command: str, timeout: float = 10.0) -> str:
        """Sends one control command and returns the answer line; fails on an `error:` answer."""
        if self._control is None:
            host, port = self.control_addr.rsplit(":", 1)
            self._control = socket.create_connection((host, int(port)), timeout=timeout)
            self._control_file = self._control.makefile("rb")
        self._control.settimeout(timeout)
        self._control.sendall(command.encode() + b"\n")
        answer = self._control_file.readline().decode().strip()  # type: ignore[union-attr]
        assert answer.startswith("ok"), f"station-sim control {command!r} answered {answer!r}"
        return answer

    def kill(self) -> None:
        if self._control is not None:
            self._control_file.close()  # type: ignore[union-attr]
            self._control.close()
            self._control = None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)

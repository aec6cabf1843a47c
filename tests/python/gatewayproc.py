"""Starting and stopping a station-gateway process for the tests.

No fixed ports and no sleeps for start-up: the gateway is told `--http 127.0.0.1:0`, and the
address it bound is read from its log line "HTTP listening on http://ADDR" (stderr), by a
thread, with a deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO_ROOT / "target" / "debug" / "station-gateway"

START_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0

_LISTENING = re.compile(r"HTTP listening on http://(\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def gateway_bin() -> Path:
    """The already-built gateway binary: $STATION_GATEWAY_BIN, else target/debug/station-gateway."""
    configured = os.environ.get("STATION_GATEWAY_BIN")
    path = Path(configured) if configured else DEFAULT_BIN
    if not path.is_absolute():
        path = REPO_ROOT / path
    return path


class GatewayProcess:
    """One running station-gateway; its stderr is collected line by line in `log`."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        binary = gateway_bin()
        if not binary.exists():
            raise RuntimeError(
                f"{binary} does not exist: build it first (cargo build --workspace), "
                "or point STATION_GATEWAY_BIN at it"
            )
        full_env = {**os.environ, "NO_COLOR": "1", "RUST_LOG": os.environ.get("RUST_LOG", "info")}
        full_env.update(env or {})
        self.args = [str(binary), *args]
        self.log: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            self.args,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=full_env,
        )
        self._reader = threading.Thread(target=self._read_stderr, name="gateway-stderr", daemon=True)
        self._reader.start()
        self.addr: str | None = None

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            line = _ANSI.sub("", raw.decode("utf-8", errors="replace")).rstrip("\n")
            self.log.append(line)
            self._lines.put(line)
        self._lines.put(None)  # end of stderr: the process is gone or closed it

    def log_text(self) -> str:
        return "\n".join(self.log)

    def wait_listening(self, timeout: float = START_TIMEOUT_S) -> str:
        """The HTTP address from the start-up log; raises with the log when it doesn't come."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RuntimeError(f"no 'HTTP listening on' line within {timeout} s; log:\n{self.log_text()}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                code = self.proc.wait(timeout=STOP_TIMEOUT_S)
                raise RuntimeError(f"the gateway exited ({code}) before listening; log:\n{self.log_text()}")
            match = _LISTENING.search(line)
            if match:
                self.addr = match.group(1)
                return self.addr

    def wait_exit(self, timeout: float = START_TIMEOUT_S) -> int:
        """For a gateway expected to refuse to start: its exit code (kills it if it doesn't exit)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(timeout=STOP_TIMEOUT_S)
        return code

    @property
    def url(self) -> str:
        assert self.addr is not None, "wait_listening() first"
        return f"http://{self.addr}"

    def wait_connected(self, prefix: str = "", timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Polls connection/status until the station link is up (deadline, not a fixed sleep)."""
        host, port = self.addr.rsplit(":", 1)  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            try:
                conn.request("GET", f"{prefix}/api/connection/status")
                response = conn.getresponse()
                last = (response.status, response.read())
                if response.status == 200 and json.loads(last[1]).get("isConnected"):
                    return
            except OSError as error:
                last = error
            finally:
                conn.close()
            time.sleep(0.05)
        raise RuntimeError(f"station link not up within {timeout} s (last answer {last!r}); log:\n{self.log_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> tuple[int, float]:
        """Sends `sig` and waits: (exit code, seconds it took). Raises if it didn't exit in time."""
        if self.proc.poll() is not None:
            return self.proc.returncode, 0.0
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"station-gateway did not exit within {timeout} s of {signal.Signals(sig).name}; "
                f"log:\n{self.log_text()}"
            ) from None
        self._reader.join(timeout=STOP_TIMEOUT_S)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_gateway(*extra_args: str, simulator: bool = True, wait_connected: bool = True,
                  prefix: str = "", stations: int = 1) -> GatewayProcess:
    """A gateway on a port the OS picks, up and (by default) connected to its embedded simulator;
    `stations` > 1: that many simulated stations (`--simulator N`, sim1...simN), and `prefix`
    names the one waited for (e.g. "/stations/sim2")."""
    args = ["--http", "127.0.0.1:0"]
    if simulator:
        args[:0] = ["--simulator"] if stations == 1 else ["--simulator", str(stations)]
    gateway = GatewayProcess([*args, *extra_args])
    try:
        gateway.wait_listening()
        if wait_connected:
            gateway.wait_connected(prefix=prefix)
    except BaseException:
        gateway.kill()
        raise
    return gateway

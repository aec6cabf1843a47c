"""The simulated station's resources the tests use (see ../../../shared/station-profile.md and
config/station.toml), and raw-HTTP helpers for what the reference client can't send."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

# STATION_GATEWAY_LAB=ID (e.g. sim2): the session's gateway serves two simulated stations and
# its clients use station ID's base URL, http://ADDR/stations/ID (conftest.py); "" otherwise.
LAB_STATION = os.environ.get("STATION_GATEWAY_LAB", "")

MON_3V3 = "0.1.ESH10000158.MON_3V3"
MON_1V8 = "0.1.ESH10000158.MON_1V8"
FIRMWARE_REV = "Engine.FirmwareRev"
UPTIME = "Engine.Uptime"
CPU_TEMP = "TempRegulator.CPU_TEMP"
HV = "0.4.ESH10000662"
VSET1, VMON1, ON1, STAT1, IMON1, ISET1 = (f"{HV}.{c}1" for c in ("VSET", "VMON", "ON", "STAT", "IMON", "ISET"))
VSET2, RAMP2 = f"{HV}.VSET2", f"{HV}.RAMP2"
VSET3 = f"{HV}.VSET3"
EXT_VOLT = "0.7.ESH10000183.5V_EXT_VOLT"
ADC = [f"0.8.ESH10000590.ADC0{i}" for i in range(1, 9)]
LED_A1 = "0.11.ESH10000355.A1"
UART = "0.ESH10000023.UART01"
I2C = "0.ESH10000023.I2C09"

# What the station profile says exists (shared/station-profile.md).
PROFILE_NAMES = (
    [UPTIME, FIRMWARE_REV, CPU_TEMP, MON_3V3, MON_1V8, EXT_VOLT, "0.7.ESH10000183.5V_EXT_CURR", UART, I2C]
    + [f"{HV}.{c}{n}" for c in ("VSET", "VMON", "ISET", "IMON", "ON", "RAMP", "STAT") for n in range(1, 5)]
    + ADC
    + [f"0.11.ESH10000355.{letter}1" for letter in "ABCDEF"]
)
MODULE_INDEXES = {1: "ESH10000158", 4: "ESH10000662", 7: "ESH10000183", 8: "ESH10000590", 11: "ESH10000355"}
STAT_OPTIONS = {"Off", "Ramping", "On", "Trip"}
LED_COLOURS = {
    "Black", "Red", "Orange", "Yellow", "Green", "Blue", "Indigo", "Violet", "Cyan", "Magenta",
    "LightBlue", "LimeGreen", "Gold", "HotPink", "White",
}


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Polls `predicate` until it returns something truthy, or fails naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> str:
        """The message the reference client would show (`error`, then `message`, ...)."""
        data = self.json()
        assert isinstance(data, dict), f"error body is not a JSON object: {self.body!r}"
        for key in ("error", "Error", "message", "Message", "detail", "title"):
            if data.get(key):
                return str(data[key])
        raise AssertionError(f"error body has no message: {self.body!r}")

    def __repr__(self) -> str:
        return f"RawResponse({self.status}, {self.body[:300]!r})"


def raw_request(base_url: str, method: str, path: str, body: bytes | str | None = None,
                headers: dict[str, str] | None = None, timeout: float = 10.0) -> RawResponse:
    """One request on a fresh connection, body sent exactly as given."""
    parsed = urlparse(base_url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    if isinstance(body, str):
        body = body.encode()
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    try:
        conn.request(method, parsed.path.rstrip("/") + "/" + path.lstrip("/"), body=body, headers=all_headers)
        response = conn.getresponse()
        return RawResponse(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def lease_takeable(base_url: str) -> bool:
    """Nobody holds the lease and no lock-delay is left (`lockDelayMs` in `GET api/lease`,
    which the client's LeaseDto does not carry): an acquire now is served."""
    seen = json.loads(raw_request(base_url, "GET", "api/lease").body)
    return not seen["held"] and "lockDelayMs" not in seen


def raw_exchange(base_url: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Writes `request` bytes to the server and returns everything it answers until it closes
    (or goes quiet). A server that answers early and closes while we still send is fine: we
    keep what it answered."""
    parsed = urlparse(base_url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            data = b"".join(chunks)
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                length = [
                    int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if length and len(rest) >= length[0]:
                    break
        return b"".join(chunks)


def parse_status(raw: bytes) -> tuple[int, bytes]:
    """(status, body) of a raw HTTP/1.1 answer."""
    assert raw.startswith(b"HTTP/1."), f"not an HTTP answer: {raw[:200]!r}"
    status = int(raw.split(b" ", 2)[1])
    return status, raw.partition(b"\r\n\r\n")[2]

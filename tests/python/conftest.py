"""Fixtures for the reference-client suite.

One gateway for the whole session: the already-built `station-gateway --simulator --http
127.0.0.1:0` (STATION_GATEWAY_BIN, default target/debug/station-gateway). It is stopped with
SIGTERM at the end, and must exit 0 within a few seconds (graceful shutdown).

With STATION_GATEWAY_LAB=ID (e.g. sim2) the session's gateway serves two simulated stations
(`--simulator 2`) and every client of the session uses the station's base URL,
http://ADDR/stations/ID: the unchanged suite against one station of a lab.

Fixtures other test files reuse (the lease and event-stream suites build on these):
- `gateway`         the session's GatewayProcess (`.url`, `.log`, `.proc`)
- `gateway_url`     its base URL, e.g. http://127.0.0.1:41234
- `client`          an AccordionQ2Client on it, closed after the test
- `client_factory`  more clients (a second test station, another thread): `client_factory()`
- `gateway_factory` gateways of a test's own (other flags or config), stopped after the test
- `hv1`             output 1 of the HV supply, switched off and set to 0 V after the test
- `station_sim`     a standalone station-sim the test can fault (simproc.SimProcess: `.url`,
                    `.control("drop")`), for `gateway_factory("--station", sim.url, simulator=False)`
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest
from accordionq2 import AccordionQ2Client

import station
from gatewayproc import STOP_TIMEOUT_S, GatewayProcess, start_gateway
from simproc import SimProcess

CLIENT_TIMEOUT_S = 15.0
LAB_STATION = station.LAB_STATION
LAB_PREFIX = f"/stations/{LAB_STATION}" if LAB_STATION else ""


@pytest.fixture(scope="session")
def gateway() -> Iterator[GatewayProcess]:
    if LAB_STATION:
        process = start_gateway(stations=2, prefix=LAB_PREFIX)
    else:
        process = start_gateway()
    yield process
    code, took = process.stop(signal.SIGTERM, timeout=STOP_TIMEOUT_S)
    assert code == 0, f"station-gateway exited {code} on SIGTERM; log:\n{process.log_text()}"
    assert took < STOP_TIMEOUT_S


@pytest.fixture(scope="session")
def gateway_url(gateway: GatewayProcess) -> str:
    return gateway.url + LAB_PREFIX


@pytest.fixture
def client_factory(gateway_url: str) -> Iterator[Callable[..., AccordionQ2Client]]:
    made: list[AccordionQ2Client] = []

    def make(base_url: str | None = None, **kwargs) -> AccordionQ2Client:
        kwargs.setdefault("timeout", CLIENT_TIMEOUT_S)
        made.append(AccordionQ2Client(base_url or gateway_url, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.fixture
def client(client_factory: Callable[..., AccordionQ2Client]) -> AccordionQ2Client:
    return client_factory()


@pytest.fixture
def gateway_factory() -> Iterator[Callable[..., GatewayProcess]]:
    """`gateway_factory("--config", path, prefix="/p")`: a gateway of the test's own, with the
    embedded simulator, on a port the OS picks; killed after the test if still running."""
    started: list[GatewayProcess] = []

    def make(*args: str, **kwargs) -> GatewayProcess:
        started.append(start_gateway(*args, **kwargs))
        return started[-1]

    yield make
    for process in started:
        process.kill()


@pytest.fixture
def station_sim() -> Iterator[SimProcess]:
    """A station-sim process of the test's own, on ports the OS picks; killed after the test."""
    sim = SimProcess()
    yield sim
    sim.kill()


@pytest.fixture
def hv1(client: AccordionQ2Client) -> Iterator[AccordionQ2Client]:
    """Output 1 starts and ends off at 0 V, whatever the test did."""
    client.resources.set_values({station.ON1: "False", station.VSET1: "0"})
    yield client
    client.resources.set_values({station.ON1: "False", station.VSET1: "0"})

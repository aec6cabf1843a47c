"""Start-up, config and shutdown of station-gateway processes of the tests' own."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from accordionq2 import AccordionQ2Client

import station
from gatewayproc import REPO_ROOT, STOP_TIMEOUT_S, GatewayProcess


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_graceful_shutdown_on_signal(gateway_factory, sig: signal.Signals) -> None:
    gateway = gateway_factory()
    with AccordionQ2Client(gateway.url, timeout=10) as client:
        for _ in range(20):
            assert float(client.resources.get_value(station.MON_3V3)) == pytest.approx(3.3, abs=0.05)
        # The client's keep-alive connection is still open: shutdown must not wait for it forever.
        code, took = gateway.stop(sig)
    assert code == 0, f"exit {code} on {sig.name}; log:\n{gateway.log_text()}"
    assert took < STOP_TIMEOUT_S


def test_the_example_config_file_starts(gateway_factory) -> None:
    gateway = gateway_factory("--config", str(REPO_ROOT / "config" / "gateway.toml"))
    with AccordionQ2Client(gateway.url, timeout=10) as client:
        assert client.connection.get_status().is_connected


def test_a_path_prefix_from_the_config(gateway_factory, tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[http]\npath_prefix = "/station3"\n')
    gateway = gateway_factory("--config", str(config), prefix="/station3")
    with AccordionQ2Client(gateway.url + "/station3", timeout=10) as client:
        assert float(client.resources.get_value(station.MON_3V3)) == pytest.approx(3.3, abs=0.05)
        assert client.application.get_status() == "OK"
    answer = station.raw_request(gateway.url, "GET", "api/resources/names")
    assert answer.status == 404, "the API answered outside its path prefix"


@pytest.mark.parametrize(
    "text, key",
    [
        ('[http]\npath_prefix = "no-slash"\n', "path_prefix"),
        ('[station]\nrequest_timeout_ms = 0\n', "request_timeout_ms"),
        ('[http]\nmax_body_bytes = "lots"\n', "http.max_body_bytes"),
        ('[station]\nno_such_key = 1\n', "no_such_key"),
    ],
)
def test_a_bad_config_stops_start_up_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    gateway = GatewayProcess(["--simulator", "--http", "127.0.0.1:0", "--config", str(config)])
    code = gateway.wait_exit()
    log = gateway.log_text()
    assert code != 0, f"started with a bad config; log:\n{log}"
    assert key in log, f"the message does not name {key}:\n{log}"
    assert "HTTP listening on" not in log

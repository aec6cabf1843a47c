"""Fidelity with a real station's WebApi (issue 17), through accordionq2 the way scripts call it:
the station's network identity, application lists, every documented path answered on purpose
(501 where a gateway in front of a byte-protocol station cannot offer it), the application log
and reset, and the control lease surviving a restart of `--simulator`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlparse

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client

import station


def _sys_mac(interface: str) -> str:
    return Path(f"/sys/class/net/{interface}/address").read_text().strip()


def test_physical_system_is_the_name_and_address_the_client_reached(client: AccordionQ2Client,
                                                                    gateway_url: str) -> None:
    system = client.modules.get_physical_system()
    # Reached as http://127.0.0.1:PORT: that is its host, and its address on loopback.
    assert system.host == urlparse(gateway_url).hostname == "127.0.0.1", system
    assert system.eth_ip_v4 == "127.0.0.1", system
    assert system.mac == _sys_mac("lo"), system
    assert system.network_interfaces.get("lo") == "127.0.0.1", system
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in system.network_interfaces.items())
    assert len(system.modules) == 5


def test_physical_system_host_follows_the_host_header(client_factory, gateway_url: str) -> None:
    port = urlparse(gateway_url).port
    by_name = client_factory(f"http://localhost:{port}").modules.get_physical_system()
    assert by_name.host == "localhost", by_name
    for sent, expected in [(f"station3.local:{port}", "station3"), ("Lab-Gateway.example.com", "Lab-Gateway.example.com")]:
        answer = station.raw_request(gateway_url, "GET", "api/modules/physical-system", headers={"Host": sent})
        assert answer.status == 200, answer
        assert answer.json()["host"] == expected, answer.json()


def test_a_configured_host_name_overrides_the_host_header(gateway_factory, tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[http]\nhost_name = "hv-bench-3"\n')
    gateway = gateway_factory("--config", str(config))
    with AccordionQ2Client(gateway.url, timeout=15.0) as client:
        assert client.modules.get_physical_system().host == "hv-bench-3"


def test_apps_lists_are_empty_lists(client: AccordionQ2Client, gateway_url: str) -> None:
    assert client.modules.get_all_apps() == []
    assert client.modules.get_licensed_apps() == []
    for path in ("api/modules/apps", "api/modules/apps/licensed"):
        answer = station.raw_request(gateway_url, "GET", path)
        assert (answer.status, answer.json()) == (200, []), answer

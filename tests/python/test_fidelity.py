"""Fidelity with a real station's WebApi, through accordionq2 the way scripts call it:
the station's network identity, application lists, every documented path answered on purpose
(404 saying why where a station reached over the byte protocol cannot offer it, as a WebApi
without the group answers), the application log
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


def test_physical_system_host_follows_the_host_header(client_factory, gateway_factory,
                                                      gateway_url: str, tmp_path: Path) -> None:
    parsed = urlparse(gateway_url)
    by_name = client_factory(f"http://localhost:{parsed.port}{parsed.path}").modules.get_physical_system()
    assert by_name.host == "localhost", by_name
    # Names other than the gateway's own are answered once http.allowed_hosts lists them (any
    # other is 421: what a page on a name re-pointed at the gateway would send).
    config = tmp_path / "gateway.toml"
    config.write_text('[http]\nallowed_hosts = ["station3.local", "lab-gateway.example.com"]\n')
    named = gateway_factory("--config", str(config))
    port = urlparse(named.url).port
    for sent, expected in [(f"station3.local:{port}", "station3"), ("Lab-Gateway.example.com", "Lab-Gateway.example.com")]:
        answer = station.raw_request(named.url, "GET", "api/modules/physical-system", headers={"Host": sent})
        assert answer.status == 200, answer
        assert answer.json()["host"] == expected, answer.json()
    refused = station.raw_request(named.url, "GET", "api/modules/physical-system", headers={"Host": "other.example.com"})
    assert refused.status == 421, refused
    assert "http.allowed_hosts" in refused.json()["error"], refused


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


BYTE_PROTOCOL = "is not offered by a station reached over the byte protocol"


def _not_offered_calls(client: AccordionQ2Client):
    """Every client method of an area a byte-protocol station cannot offer."""
    from datetime import datetime, timezone

    from accordionq2.boot import BootGroup
    from accordionq2.models import CalibrationTableDto, ModuleSettingsDto

    boot = BootGroup(client._session)  # the client has no attribute for it yet
    module = ModuleSettingsDto(name="HV4")
    return {
        "files.get_roots": lambda: client.files.get_roots(),
        "files.list": lambda: client.files.list("config", "a"),
        "files.download": lambda: client.files.download("config", "a.txt"),
        "files.upload": lambda: client.files.upload("config", "a.txt", b"x"),
        "files.create_folder": lambda: client.files.create_folder("config", "d"),
        "files.move": lambda: client.files.move("config", "a.txt", "b.txt"),
        "files.delete": lambda: client.files.delete("config", "a.txt"),
        "firmware.get_state": lambda: client.firmware.get_state(),
        "firmware.get_releases": lambda: client.firmware.get_releases(),
        "firmware.set_source": lambda: client.firmware.set_source(None),
        "firmware.start_update": lambda: client.firmware.start_update("6.5.0"),
        "firmware.get_update": lambda: client.firmware.get_update(),
        "firmware.get_update_log": lambda: client.firmware.get_update_log(),
        "firmware.upload_package": lambda: client.firmware.upload_package(b"PK\x03\x04"),
        "firmware.delete_package": lambda: client.firmware.delete_package("rel-6.5.0.zip"),
        "system.get_services": lambda: client.system.get_services(),
        "system.service_action": lambda: client.system.service_action("hwapp", "restart"),
        "system.reboot": lambda: client.system.reboot(),
        "system.get_clock": lambda: client.system.get_clock(),
        "system.set_clock": lambda: client.system.set_clock(datetime.now(timezone.utc)),
        "boot.get": lambda: boot.get(),
        "boot.set_startup": lambda: boot.set_startup(enabled=True),
        "boot.update": lambda: boot.update(enabled=True),
        "media.list_files": lambda: client.media.list_files(),
        "media.download_file": lambda: client.media.download_file("a.wav"),
        "media.upload_file": lambda: client.media.upload_file("a.wav", b"RIFF"),
        "media.delete_file": lambda: client.media.delete_file("a.wav"),
        "calibration.get_channels": lambda: client.calibration.get_channels(),
        "calibration.get_table": lambda: client.calibration.get_table("CAL1"),
        "calibration.set_table": lambda: client.calibration.set_table("CAL1", CalibrationTableDto()),
        "modules.load": lambda: client.modules.load(module),
        "modules.unload": lambda: client.modules.unload(module),
        "modules.configure": lambda: client.modules.configure(module),
        "comm.socket": lambda: client.comm.socket("SOCK1", "Send", host_name="10.0.0.9", port=5025, data_to_send=b"*IDN?\n"),
        "instruments.get_all": lambda: client.instruments.get_all(),
    }


def test_every_unserved_area_answers_404_saying_why(client: AccordionQ2Client) -> None:
    calls, marker = _not_offered_calls(client), BYTE_PROTOCOL
    wrong = {}
    for name, call in calls.items():
        try:
            call()
        except AccordionQ2ApiError as error:
            if error.status_code != 404 or marker not in str(error):
                wrong[name] = (error.status_code, str(error))
        else:
            wrong[name] = "succeeded"
    assert not wrong, wrong


def test_unserved_paths_change_nothing_even_while_another_holds_the_lease(client_factory, gateway_url: str) -> None:
    # A 404 is the answer for everyone: nothing is done, so no lease is needed to hear it.
    holder, other = client_factory(), client_factory()
    holder.lease.acquire("holder", ttl_ms=30000)
    try:
        with pytest.raises(AccordionQ2ApiError) as caught:
            other.system.reboot()
        assert caught.value.status_code == 404 and BYTE_PROTOCOL in str(caught.value), caught.value
    finally:
        holder.lease.release()


def test_capabilities_features_are_what_is_served(gateway_url: str) -> None:
    features = station.raw_request(gateway_url, "GET", "api/capabilities").json()["features"]
    for served in ("resources", "channels", "modules", "maxAge", "events", "subscriptions", "lease", "application",
                   "comm", "numeric-results", "audit"):
        assert served in features, features
    for unserved in ("files", "firmware", "system", "media", "calibration", "instruments", "channels.encoded"):
        assert unserved not in features, features


def test_application_log_is_the_gateways_recent_lines_newest_last(gateway_factory) -> None:
    gateway = gateway_factory()
    with AccordionQ2Client(gateway.url, timeout=15.0) as client:
        everything = client.application.get_system_log(tail=0)
        assert everything and all(isinstance(line, str) for line in everything), everything
        # The start-up and link lines the gateway wrote to stderr, in order.
        assert any("station link up" in line for line in everything), everything
        assert client.application.get_system_log(tail=2) == everything[-2:]
        assert len(client.application.get_system_log()) <= 100
        with pytest.raises(AccordionQ2ApiError) as caught:
            client.application.get_system_log(tail=-1)
        assert caught.value.status_code == 400 and "tail" in str(caught.value), caught.value


def test_a_lab_stations_application_log_holds_its_own_lines_only(gateway_factory) -> None:
    # In a lab each station's tasks log in a span naming it; a station's log is its lines.
    gateway = gateway_factory(stations=2, prefix="/stations/sim2")
    gateway.wait_connected(prefix="/stations/sim1")
    logs = {}
    for sim, other in (("sim1", "sim2"), ("sim2", "sim1")):
        with AccordionQ2Client(f"{gateway.url}/stations/{sim}", timeout=15.0) as client:
            lines = client.application.get_system_log(tail=0)
        assert any("station link up" in line for line in lines), (sim, lines)
        assert all(f'station{{id="{sim}"}}' in line for line in lines), (sim, lines)
        assert not any(f'station{{id="{other}"}}' in line for line in lines), (sim, lines)
        logs[sim] = lines
    assert not set(logs["sim1"]) & set(logs["sim2"])


def test_application_reset_restarts_the_station_and_needs_the_lease(gateway_factory, client_factory) -> None:
    from test_events import Events

    gateway = gateway_factory()
    client, other = client_factory(gateway.url), client_factory(gateway.url)
    events = Events(client.events.open())
    try:
        generation = events.hello["generation"]
        other.lease.acquire("bench operator", ttl_ms=30000)
        with pytest.raises(AccordionQ2ApiError) as caught:
            client.application.reset()
        assert caught.value.status_code == 423 and "bench operator" in str(caught.value), caught.value
        other.application.reset()  # the holder may
        change = events.named("configuration", 15.0)
        assert change["generation"] == generation + 1, change
        assert change["changeType"] == "Changed", change
        station.wait_for(lambda: client.connection.get_status().is_connected, 10.0, "the link back after the reset")
        other.lease.release()
        # Without a lease holder anyone with the control role may reset.
        client.application.reset()
        assert events.named("configuration", 15.0)["generation"] == generation + 2
    finally:
        events.close()


def test_a_station_that_cannot_reset_answers_501(gateway_factory, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    profile = tmp_path / "no-reset.toml"
    profile.write_text((root / "config" / "station.toml").read_text().replace("[station]\n", "[station]\nreset = false\n", 1))
    gateway = gateway_factory("--simulator-profile", str(profile))
    with AccordionQ2Client(gateway.url, timeout=15.0) as client:
        with pytest.raises(AccordionQ2ApiError) as caught:
            client.application.reset()
        assert caught.value.status_code == 501, caught.value
        assert "cannot restart its application" in str(caught.value), caught.value
        assert client.connection.get_status().is_connected


def test_the_control_lease_survives_a_restart_of_simulator_with_sqlite(gateway_factory, tmp_path: Path) -> None:
    # The embedded simulator takes a new port each start: the lease is named after the station
    # (its serial), not its address, so the restarted gateway finds it held.
    backend = f"sqlite:{tmp_path / 'lease.db'}"
    first = gateway_factory("--lease-backend", backend)
    taken = station.raw_request(first.url, "POST", "api/lease", json.dumps({"Owner": "bench 3", "TtlMs": 60000}))
    assert taken.status == 200, taken
    lease_id, fence = taken.json()["leaseId"], taken.json()["fence"]
    code, _ = first.stop()
    assert code == 0, first.log_text()

    second = gateway_factory("--lease-backend", backend)
    status = station.raw_request(second.url, "GET", "api/lease").json()
    assert status["held"] is True and status["owner"] == "bench 3", status
    # The holder's id still works, under the same fence; anyone else is still refused.
    renewed = station.raw_request(second.url, "PUT", f"api/lease/{lease_id}", json.dumps({"TtlMs": 60000}))
    assert renewed.status == 200 and renewed.json()["fence"] == fence, renewed
    with AccordionQ2Client(second.url, timeout=15.0) as other:
        with pytest.raises(AccordionQ2ApiError) as caught:
            other.resources.set_value(station.VSET1, "0")
        assert caught.value.status_code == 423 and "bench 3" in str(caught.value), caught.value
    released = station.raw_request(second.url, "DELETE", f"api/lease/{lease_id}")
    assert released.status == 200, released

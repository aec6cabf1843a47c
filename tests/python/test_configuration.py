"""Channel configuration and station configuration files through
accordionq2: configure and read back with the `configuration` event, a list checked whole,
save / change / load, download / upload / list / delete, bad names and bad files, and 423 for a
non-holder. One gateway of this module's own, its configuration files in a temporary directory."""

from __future__ import annotations

import json
import signal
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client
from accordionq2.enums import DirectionTypes
from accordionq2.models import ChannelConfigRequest

import station
from gatewayproc import STOP_TIMEOUT_S, GatewayProcess, start_gateway
from station import raw_request, wait_for
from test_events import Events

OWNER = "alice@bench-3"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    state = tmp_path_factory.mktemp("config-files")
    config = state / "gateway.toml"
    config.write_text(f'[config_files]\ndir = "{state / "files"}"\nmax_file_bytes = 32768\n')
    process = start_gateway("--config", str(config))
    process.files_dir = state / "files"  # type: ignore[attr-defined]
    yield process
    code, _ = process.stop(signal.SIGTERM, timeout=STOP_TIMEOUT_S)
    assert code == 0, process.log_text()


@pytest.fixture
def make_client(gw: GatewayProcess) -> Iterator[Callable[[], AccordionQ2Client]]:
    made: list[AccordionQ2Client] = []

    def make() -> AccordionQ2Client:
        made.append(AccordionQ2Client(gw.url, timeout=15))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.fixture
def client(make_client) -> AccordionQ2Client:
    return make_client()


def refused(call: Callable[[], object], status: int) -> str:
    with pytest.raises(AccordionQ2ApiError) as caught:
        call()
    assert caught.value.status_code == status, f"{caught.value!r}, expected {status}"
    return str(caught.value)


def channel(client: AccordionQ2Client, name: str):
    return client.channels.get_channel(net_name=name)


def test_configure_a_description_and_unit_reads_back_and_every_stream_sees_a_configuration_event(client) -> None:
    events = Events(client.events.open())
    try:
        client.channels.configure(ChannelConfigRequest(
            net_name="0.1.ESH10000158.MON_1V8", description="Main 1.8 V rail monitor", unit="mV"))
        again = channel(client, "0.1.ESH10000158.MON_1V8")
        assert (again.description, again.unit) == ("Main 1.8 V rail monitor", "mV")
        data = events.named("configuration", 5)
        assert data.get("changeType") == "Changed", data
    finally:
        events.close()
    listed = {c.net_name or c.alias: c for c in client.channels.get_all()}
    assert listed["0.1.ESH10000158.MON_1V8"].unit == "mV"


def test_net_name_locates_and_alias_renames_and_the_other_fields_and_details_apply(client) -> None:
    client.channels.configure(ChannelConfigRequest(
        net_name="0.4.ESH10000662.VSET3", alias="HV3 setpoint", group_name="HV-A", device_name="HV4 card",
        enabled=False, details={"gain": 2.5, "Offset": -0.25}))
    ch = client.channels.get_channel(alias="HV3 setpoint")
    assert (ch.net_name, ch.group_name, ch.device_name, ch.enabled) == ("0.4.ESH10000662.VSET3", "HV-A", "HV4 card", False)
    assert ch.details["gain"] == 2.5 and ch.details["offset"] == -0.25, ch.details
    # Alias alone locates.
    client.channels.configure(ChannelConfigRequest(alias="HV3 setpoint", enabled=True))
    assert client.channels.get_channel(alias="HV3 setpoint").enabled is True
    # A direction within the capability: a digital output can be turned around.
    client.channels.configure(ChannelConfigRequest(net_name="0.4.ESH10000662.ON4", direction=DirectionTypes.IN | DirectionTypes.OUT))
    turned = channel(client, "0.4.ESH10000662.ON4")
    assert turned.direction == DirectionTypes.IN | DirectionTypes.OUT
    # The clients' model: the default stays what it was, and the change shows.
    assert (turned.default_direction, turned.direction_changed) == (DirectionTypes.OUT, True), turned
    client.channels.configure(ChannelConfigRequest(net_name="0.4.ESH10000662.ON4", direction=DirectionTypes.OUT))
    back = channel(client, "0.4.ESH10000662.ON4")
    assert (back.default_direction, back.direction_changed) == (DirectionTypes.OUT, False), back
    # `index` counts within the device, `channelIndex` over the station.
    listed = client.channels.get_all()
    on4 = next(c for c in listed if c.net_name == "0.4.ESH10000662.ON4")
    same_device = [c for c in listed if c.net_name.rsplit(".", 1)[0] == "0.4.ESH10000662"]
    assert on4.index == same_device.index(on4) < on4.channel_index, (on4.index, on4.channel_index)


def test_what_a_channel_cannot_do_is_refused_naming_the_field(client) -> None:
    message = refused(lambda: client.channels.configure(ChannelConfigRequest(
        net_name="0.4.ESH10000662.VSET1", direction=DirectionTypes.IN)), 400)
    assert "Direction" in message, message
    message = refused(lambda: client.channels.configure(ChannelConfigRequest(
        net_name="0.4.ESH10000662.VSET1", details={"pullType": "Up"})), 400)
    assert "Details.pullType" in message, message
    message = refused(lambda: client.channels.configure(ChannelConfigRequest(
        net_name="0.4.ESH10000662.VSET1", details={"gain": "lots"})), 400)
    assert "Details.Gain" in message, message
    # A detail the clients list the names of takes only those (the vendor answers 400 too).
    message = refused(lambda: client.channels.configure(ChannelConfigRequest(
        net_name="0.4.ESH10000662.ON4", details={"pullType": "Sideways"})), 400)
    assert "Details.PullType" in message and "None, Down, Up" in message, message
    refused(lambda: client.channels.configure(ChannelConfigRequest(net_name="NO_SUCH_NET", unit="V")), 404)
    refused(lambda: client.channels.configure(ChannelConfigRequest(unit="V")), 400)


def test_a_list_with_one_bad_entry_changes_nothing(client) -> None:
    before = channel(client, "0.4.ESH10000662.VSET2").description
    # A list entry naming no channel is 404 as the single form is; a bad one 400.
    for bad, status in (
        (ChannelConfigRequest(net_name="0.4.ESH10000662.VSET1", direction=DirectionTypes.IN), 400),
        (ChannelConfigRequest(net_name="NO_SUCH_NET", unit="V"), 404),
        (ChannelConfigRequest(net_name="0.4.ESH10000662.VSET1", details={"baudrate": 9600}), 400),
    ):
        message = refused(lambda: client.channels.configure_many([
            ChannelConfigRequest(net_name="0.4.ESH10000662.VSET2", description="changed by a bad list"),
            bad,
        ]), status)
        assert "entry 2" in message, message
        assert channel(client, "0.4.ESH10000662.VSET2").description == before
    client.channels.configure_many([
        ChannelConfigRequest(net_name="0.4.ESH10000662.VSET2", description="changed by a good list"),
        ChannelConfigRequest(net_name="0.4.ESH10000662.ISET2", unit="nA"),
    ])
    assert channel(client, "0.4.ESH10000662.VSET2").description == "changed by a good list"
    assert channel(client, "0.4.ESH10000662.ISET2").unit == "nA"


def values(client: AccordionQ2Client, *names: str) -> list[float]:
    got = client.resources.get_values(list(names))
    return [float(got[name]) for name in names]


def test_save_change_load_restores_the_values(client, gw) -> None:
    client.resources.set_values({station.VSET2: "250", station.RAMP2: "40", station.ON1: "False"})
    client.application.save_config_file("bench-setup.cfg")
    assert "bench-setup.cfg" in client.application.list_config_files()
    saved = tomllib.loads(client.application.download_config_file("bench-setup.cfg").decode())
    assert saved["format_version"] == 1
    by_name = {entry["name"]: entry for entry in saved["channel"]}
    assert by_name[station.VSET2]["value"] == "250" and by_name[station.RAMP2]["value"] == "40"
    assert "value" not in by_name[station.VMON1], "a measurement's value was saved"
    assert "value" not in by_name[station.UART], "a consuming channel's value was saved"
    assert by_name[station.VMON1]["unit"] == "V", "every channel's configuration is saved"

    client.resources.set_values({station.VSET2: "900", station.RAMP2: "300"})
    assert values(client, station.VSET2, station.RAMP2) == [900, 300]
    client.application.load_config_file("bench-setup.cfg")
    assert values(client, station.VSET2, station.RAMP2) == [250, 40]
    assert client.application.get_loaded_config_files()[-1] == "bench-setup.cfg"
    status = json.loads(raw_request(gw.url, "GET", "/status.json").body)
    assert status["lastConfiguration"]["name"] == "bench-setup.cfg", status["lastConfiguration"]


def test_a_load_reports_its_steps_with_outputs_switched_on_last(client, gw) -> None:
    try:
        client.resources.set_values({station.VSET3: "100", station.ON1: "False"})
        client.application.save_config_file("ordering.cfg")
        text = client.application.download_config_file("ordering.cfg").decode()
        on = text.replace(f'name = "{station.ON1}"\nalias', f'name = "{station.ON1}"\nalias', 1)
        # Turn output 1 on in the file: its ON must come after every set point and limit.
        block_start = on.index(f'name = "{station.ON1}"')
        block_end = on.index("[[channel]]", block_start)
        block = on[block_start:block_end].replace('value = "False"', 'value = "True"')
        on = on[:block_start] + block + on[block_end:]
        client.application.upload_config_file("ordering-on.cfg", on.encode())
        answer = raw_request(gw.url, "POST", "/api/application/config/load", json.dumps({"FileName": "ordering-on.cfg"}))
        assert answer.status == 200, answer
        applied = answer.json()["applied"]
        switch_on = applied.index(f"write {station.ON1} = True")
        assert switch_on == len(applied) - 1, applied
        for setting in (station.VSET1, station.ISET1, f"{station.HV}.RAMP1"):
            assert any(step.startswith(f"write {setting} = ") for step in applied[:switch_on]), (setting, applied)
    finally:
        client.resources.set_values({station.ON1: "False", station.VSET1: "0"})


def test_download_upload_under_another_name_list_and_delete(client) -> None:
    client.application.save_config_file("original.cfg")
    data = client.application.download_config_file("original.cfg")
    client.application.upload_config_file("copy of original.cfg", data)
    names = client.application.list_config_files()
    assert {"original.cfg", "copy of original.cfg"} <= set(names), names
    assert client.application.download_config_file("copy of original.cfg") == data
    client.application.delete_config_file("copy of original.cfg")
    assert "copy of original.cfg" not in client.application.list_config_files()
    assert "not found" in refused(lambda: client.application.download_config_file("copy of original.cfg"), 404)


@pytest.mark.parametrize("name", ["../escape.cfg", "a/b.cfg", "a\\b.cfg", "..", ".hidden", "x" * 65, "tab\tname", ""])
def test_bad_file_names_are_refused(client, gw, name: str) -> None:
    if name:
        assert "bad configuration file name" in refused(lambda: client.application.save_config_file(name), 400)
        refused(lambda: client.application.upload_config_file(name, b"format_version = 1\n"), 400)
        refused(lambda: client.application.load_config_file(name), 400)
    else:
        refused(lambda: client.application.save_config_file(name), 400)
    assert not any(Path(gw.files_dir).parent.glob("escape.cfg"))


def test_unknown_names_are_not_found(client) -> None:
    assert "not found" in refused(lambda: client.application.download_config_file("never-saved.cfg"), 404)
    assert "not found" in refused(lambda: client.application.delete_config_file("never-saved.cfg"), 404)
    assert "not found" in refused(lambda: client.application.load_config_file("never-saved.cfg"), 404)


@pytest.mark.parametrize("content, why", [
    (b"\xff\xfe not text", "UTF-8"),
    (b"format_version = = 1", "TOML"),
    (b"[[channel]]\nname = \"x\"\n", "format_version"),
    (b"format_version = 99\n", "format_version 99"),
    (b"format_version = 1\n[[channel]]\nname = \"x\"\ncolour = \"red\"\n", "colour"),
])
def test_bad_files_are_refused_on_upload_saying_why(client, content: bytes, why: str) -> None:
    message = refused(lambda: client.application.upload_config_file("bad.cfg", content), 400)
    assert why in message, message
    assert "bad.cfg" not in client.application.list_config_files()


def test_a_file_over_the_size_limit_is_refused(client) -> None:
    big = b"format_version = 1\n" + b"# padding\n" * 3300
    refused(lambda: client.application.upload_config_file("big.cfg", big), 413)


@pytest.mark.parametrize("entry, why", [
    ('name = "NO.SUCH.CHANNEL"\nvalue = "1"', "unknown channel NO.SUCH.CHANNEL"),
    (f'name = "{station.VSET2}"\nvalue = "5000"', "out of range"),
    (f'name = "{station.VMON1}"\nvalue = "5"', "read only"),
    (f'name = "{station.UART}"\nvalue = "x"', "consumes data"),
])
def test_a_file_that_does_not_fit_the_station_is_not_loaded_and_nothing_is_sent(client, entry: str, why: str) -> None:
    client.resources.set_values({station.VSET2: "321", station.RAMP2: "55"})
    text = f'format_version = 1\n[[channel]]\nname = "{station.RAMP2}"\nvalue = "77"\n[[channel]]\n{entry}\n'
    client.application.upload_config_file("misfit.cfg", text.encode())
    message = refused(lambda: client.application.load_config_file("misfit.cfg"), 400)
    assert why in message and "nothing was sent" in message, message
    assert values(client, station.VSET2, station.RAMP2) == [321, 55]


def test_a_non_holder_is_refused_configure_and_load_with_423_naming_the_holder(make_client) -> None:
    a, b = make_client(), make_client()
    b.application.save_config_file("for-423.cfg")
    with a.lease.hold(OWNER, ttl_ms=30_000):
        for what, call in [
            ("configure", lambda: b.channels.configure(ChannelConfigRequest(net_name="0.4.ESH10000662.VSET2", unit="kV"))),
            ("configure_many", lambda: b.channels.configure_many([ChannelConfigRequest(net_name="0.4.ESH10000662.VSET2", unit="kV")])),
            ("load", lambda: b.application.load_config_file("for-423.cfg")),
        ]:
            message = refused(call, 423)
            assert OWNER in message, f"{what}: {message}"
        assert channel(b, "0.4.ESH10000662.VSET2").unit != "kV"
        # The holder may.
        a.channels.configure(ChannelConfigRequest(net_name="0.4.ESH10000662.VSET2", unit="kV"))
        a.application.load_config_file("for-423.cfg")
    assert channel(b, "0.4.ESH10000662.VSET2").unit == "V"

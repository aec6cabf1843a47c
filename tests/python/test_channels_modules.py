"""channels, modules, connection and application — through accordionq2."""

from __future__ import annotations


import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client, ChannelDto
from accordionq2.enums import ChannelTypes, DirectionTypes, ModuleStatus, MpioUsageTypes

import station


def channels_by_name(client: AccordionQ2Client) -> dict[str, ChannelDto]:
    channels = client.channels.get_all()
    named = {}
    for ch in channels:
        # As on a station, the alias is the full resource name unless configured otherwise.
        assert ch.alias, f"channel without an alias: {ch}"
        named[ch.alias] = ch
    return named


def test_channels_list_every_resource(client: AccordionQ2Client) -> None:
    channels = client.channels.get_all()
    names = client.resources.get_names()
    assert len(channels) == len(names)
    assert {ch.alias for ch in channels} == set(names)
    assert len({ch.channel_index for ch in channels}) == len(channels), "channelIndex is not unique"
    assert all(ch.enabled for ch in channels)


def test_channel_objects_describe_the_channel(client: AccordionQ2Client) -> None:
    named = channels_by_name(client)

    mon = named[station.MON_3V3]
    assert ChannelTypes.ANALOG in mon.channel_type
    assert mon.direction == DirectionTypes.IN
    assert mon.unit == "V"
    assert mon.alias and mon.net_name and mon.description
    assert mon.device_name == "0.1.ESH10000158"
    assert mon.usage == MpioUsageTypes.READ_ONLY_SYSTEM_CONTROL

    vset = named[station.VSET1]
    assert ChannelTypes.ANALOG in vset.channel_type
    assert vset.direction == DirectionTypes.OUT
    assert vset.usage == MpioUsageTypes.USER_ALLOCATABLE
    assert vset.unit == "V"

    assert ChannelTypes.DIGITAL in named[station.ON1].channel_type
    assert ChannelTypes.CURRENT in named[station.IMON1].channel_type
    assert ChannelTypes.TEMPERATURE in named[station.CPU_TEMP].channel_type

    uart = named[station.UART]
    assert ChannelTypes.UART in uart.channel_type
    assert ChannelTypes.BYTE_STREAM in uart.channel_type
    assert uart.direction == DirectionTypes.IN | DirectionTypes.OUT
    assert uart.usage == MpioUsageTypes.BUS_SIGNAL
    assert ChannelTypes.I2C in named[station.I2C].channel_type
    assert named[station.I2C].usage == MpioUsageTypes.BUS_SIGNAL


def test_channel_json_has_the_contract_keys(gateway_url: str) -> None:
    answer = station.raw_request(gateway_url, "GET", "api/channels")
    assert answer.status == 200, answer
    keys = {
        "channelIndex", "index", "enabled", "usage", "deviceName", "channelType", "channelTypeCapability",
        "alias", "netName", "groupName", "capability", "description", "direction", "directionChanged",
        "defaultDirection", "unit", "isVirtual", "details",
    }
    for ch in answer.json():
        assert keys <= set(ch), f"missing {keys - set(ch)} in {ch}"


def test_get_channel_by_alias_and_by_net_name(client: AccordionQ2Client) -> None:
    named = channels_by_name(client)
    mon = named[station.MON_3V3]
    by_alias = client.channels.get_channel(alias=mon.alias)
    assert by_alias == mon
    by_net = client.channels.get_channel(net_name=mon.net_name)
    assert by_net == mon

    # Every channel can be found by its alias, and by its net name where it has one.
    for name, ch in named.items():
        if ch.alias:
            assert client.channels.get_channel(alias=ch.alias) == ch
        if ch.net_name:
            assert client.channels.get_channel(net_name=ch.net_name) == ch


def test_get_channel_unknown_is_404_naming_it(client: AccordionQ2Client) -> None:
    with pytest.raises(AccordionQ2ApiError) as caught:
        client.channels.get_channel(alias="No such alias")
    assert caught.value.status_code == 404
    assert "No such alias" in str(caught.value)
    with pytest.raises(AccordionQ2ApiError) as caught:
        client.channels.get_channel(net_name="NO_SUCH_NET")
    assert caught.value.status_code == 404
    assert "NO_SUCH_NET" in str(caught.value)


def test_get_channel_without_alias_or_net_name_is_400(client: AccordionQ2Client) -> None:
    with pytest.raises(AccordionQ2ApiError) as caught:
        client.channels.get_channel()
    assert caught.value.status_code == 400
    assert "Alias" in str(caught.value) and "NetName" in str(caught.value)


def test_physical_system(client: AccordionQ2Client) -> None:
    system = client.modules.get_physical_system()
    assert system.firmware.startswith("6."), system.firmware
    assert system.host
    assert len(system.modules) == 5
    assert {m.index: m.product_id for m in system.modules} == station.MODULE_INDEXES
    for m in system.modules:
        assert m.name and m.serial_number, m
        assert isinstance(m.revision, int) and m.revision >= 1, m
    by_index = {m.index: m for m in system.modules}
    assert "HV" in by_index[4].name
    assert client.resources.get_value(station.FIRMWARE_REV) == system.firmware


def test_modules_and_loaded_modules(client: AccordionQ2Client) -> None:
    system = client.modules.get_physical_system()
    modules = client.modules.get_all()
    loaded = client.modules.get_loaded()
    assert len(modules) == 5
    assert {m.name for m in modules} == {m.name for m in system.modules}
    assert all(m.enabled for m in modules)
    assert {m.name for m in loaded} <= {m.name for m in modules}
    assert loaded, "no loaded modules"


def test_connection_status_is_connected(client: AccordionQ2Client) -> None:
    status = client.connection.get_status()
    assert status.is_connected is True


def test_application_status_name_and_identification(client: AccordionQ2Client) -> None:
    assert client.application.get_status() == ModuleStatus.OK
    name = client.application.get_name()
    assert isinstance(name, str) and name
    identification = client.application.get_identification()
    assert isinstance(identification, str) and identification
    system = client.modules.get_physical_system()
    assert system.firmware in identification, identification


def test_capabilities(gateway_url: str) -> None:
    answer = station.raw_request(gateway_url, "GET", "api/capabilities")
    assert answer.status == 200, answer
    body = answer.json()
    assert {"apiVersion", "webApiVersion", "codecVersion", "features"} <= set(body)
    # CapabilitiesDto binds int ApiVersion and int CodecVersion: JSON integers, not "1.0".
    for key in ("apiVersion", "codecVersion"):
        assert isinstance(body[key], int) and not isinstance(body[key], bool), body
    assert isinstance(body["webApiVersion"], str), body
    # What this gateway serves, each named once.
    features = body["features"]
    assert {"resources", "channels", "modules", "maxAge", "events", "subscriptions", "lease"} <= set(features), body
    assert len(features) == len(set(features)), body
    assert answer.headers["content-type"].startswith("application/json")


def test_alias_and_net_name_are_the_full_resource_name(client: AccordionQ2Client) -> None:
    # As on a station: scripts look channels up by the full name, under either field.
    for name in [station.MON_3V3, station.I2C, station.VSET1, station.CPU_TEMP]:
        by_alias = client.channels.get_channel(alias=name)
        assert (by_alias.alias, by_alias.net_name) == (name, name), by_alias
        assert client.channels.get_channel(net_name=name) == by_alias
        # The friendly text is the description's.
        assert by_alias.description, by_alias
    assert "3V3 rail" in client.channels.get_channel(alias=station.MON_3V3).description
    # The names resources/* takes.
    assert float(client.resources.get_value(client.channels.get_channel(net_name=station.MON_3V3).alias)) > 3.0


def test_a_lookup_that_finds_nothing_says_not_found_with_the_name(client: AccordionQ2Client) -> None:
    for kwargs, asked in [({"alias": "3V3 rail"}, "3V3 rail"), ({"net_name": "I2C09"}, "I2C09")]:
        with pytest.raises(AccordionQ2ApiError) as caught:
            client.channels.get_channel(**kwargs)
        assert caught.value.status_code == 404
        assert "not found" in str(caught.value) and asked in str(caught.value), caught.value


def test_channel_type_is_the_whole_integer_and_details_the_types_own_fields(gateway_url: str) -> None:
    answer = station.raw_request(gateway_url, "GET", "api/channels")
    assert answer.status == 200, answer
    for ch in answer.json():
        # The integer carries every flag bit, names or not (protocol/SPEC.md section 9).
        for key in ("channelType", "channelTypeCapability"):
            assert isinstance(ch[key], int) and not isinstance(ch[key], bool), ch
        # ChannelDetailsDto: the type's own fields, or null; never the old {name, valueType, ...}.
        details = ch["details"]
        assert details is None or not {"name", "valueType", "readable", "options"} & set(details), ch
    uart = next(ch for ch in answer.json() if ch["alias"] == station.UART)
    assert uart["channelType"] == int(ChannelTypes.UART | ChannelTypes.BYTE_STREAM), uart

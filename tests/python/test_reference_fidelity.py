"""Answering like a real station's WebApi, through accordionq2 the way
the reference clients document it: aliases accepted everywhere a name is, NetName before Alias in
a lookup, channel details from the start, a cache fed by confirmed writes, the lease on
configuration files, 404 for what a byte-protocol station cannot offer, `isConnected` on every
event that has it, and NumericResult channels in a subscription's errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client
from accordionq2.models import ChannelConfigRequest

import station
from gatewayproc import GatewayProcess
from station import wait_for
from test_events import Events

ADC3 = station.ADC[2]
BASE_NR = "0.1.ESH10000158.NumericResult"


@pytest.fixture
def own_gateway(gateway_factory) -> GatewayProcess:
    """A gateway of the test's own: these tests rename channels and must not leak it."""
    return gateway_factory()


@pytest.fixture
def own_client(own_gateway: GatewayProcess) -> Iterator[AccordionQ2Client]:
    with AccordionQ2Client(own_gateway.url, timeout=15.0) as client:
        yield client


def refused(call, status: int) -> str:
    with pytest.raises(AccordionQ2ApiError) as caught:
        call()
    assert caught.value.status_code == status, f"{caught.value!r}, expected {status}"
    return str(caught.value)


# 1. Aliases are accepted wherever a name is.

def test_an_alias_reads_writes_and_transacts_like_the_net_name(own_client: AccordionQ2Client) -> None:
    client = own_client
    client.channels.configure(ChannelConfigRequest(net_name=ADC3, alias="MyADC3"))
    client.channels.configure(ChannelConfigRequest(net_name=station.VSET3, alias="MyVset3"))
    assert float(client.resources.get_value("MyADC3")) == pytest.approx(float(client.resources.get_value(ADC3)), abs=0.5)
    client.resources.set_value("MyVset3", "12")
    assert float(client.resources.get_value(station.VSET3)) == 12.0
    client.resources.set_values({"MyVset3": "13"})
    assert float(client.resources.get_value("MyVset3")) == 13.0
    assert float(client.resources.transact("MyVset3", "14")) == 14.0
    values = client.resources.get_values(["MyVset3", station.VSET3, "MyADC3"], max_age_ms=0)
    assert float(values["MyVset3"]) == float(values[station.VSET3]) == 14.0, values
    assert set(values) == {"MyVset3", station.VSET3, "MyADC3"}, values
    cached, ages = client.resources.read_values(["MyVset3"], max_age_ms=60000)
    assert float(cached["MyVset3"]) == 14.0 and "MyVset3" in ages, (cached, ages)
    client.resources.set_value("MyVset3", "0")


def test_a_subscription_by_alias_sends_values_under_the_alias(own_client: AccordionQ2Client) -> None:
    client = own_client
    client.channels.configure(ChannelConfigRequest(net_name=ADC3, alias="MyADC3"))
    events = Events(client.events.open())
    try:
        sub = client.subscriptions.create(events.stream.stream_id, ["MyADC3"], 200)
        data = events.named("values", 10.0, lambda d: d.get("subscription") == sub.id)
        assert "MyADC3" in data["values"] and not data.get("errors"), data
    finally:
        events.close()


def test_a_numeric_result_target_by_alias(own_client: AccordionQ2Client) -> None:
    client = own_client
    client.channels.configure(ChannelConfigRequest(net_name=station.MON_3V3, alias="Rail3V3"))
    acquired = client.numeric_results.acquire(BASE_NR, "Rail3V3", samples=10)
    assert acquired.target == station.MON_3V3 and len(acquired.samples) == 10, acquired


def test_an_alias_that_is_another_channels_name_is_refused_naming_both(own_client: AccordionQ2Client) -> None:
    why = refused(lambda: own_client.channels.configure(ChannelConfigRequest(net_name=ADC3, alias=station.ADC[3])), 400)
    assert ADC3 in why and station.ADC[3] in why, why
    own_client.channels.configure(ChannelConfigRequest(net_name=station.ADC[4], alias="Shared"))
    why = refused(lambda: own_client.channels.configure(ChannelConfigRequest(net_name=ADC3, alias="Shared")), 400)
    assert ADC3 in why and station.ADC[4] in why, why
    assert own_client.channels.get_channel(net_name=ADC3).alias != "Shared"


# 2. NetName takes priority over Alias.

def test_a_lookup_by_net_name_and_alias_finds_the_net_name(client: AccordionQ2Client) -> None:
    found = client.channels.get_channel(alias="whatever", net_name=station.ADC[7])
    assert found.net_name == station.ADC[7], found
    assert client.channels.get_channel(alias=station.ADC[7]).net_name == station.ADC[7]


# 5. Configuration files change only with the lease.

def test_config_file_upload_and_delete_need_the_lease_and_are_audited(own_client: AccordionQ2Client,
                                                                       own_gateway: GatewayProcess) -> None:
    holder = own_client
    with AccordionQ2Client(own_gateway.url, timeout=15.0) as other:
        holder.application.save_config_file("kept.cfg")
        data = holder.application.download_config_file("kept.cfg")
        with holder.lease.hold("bench operator", ttl_ms=30_000):
            for call in (lambda: other.application.upload_config_file("kept.cfg", data),
                         lambda: other.application.upload_config_file("new.cfg", data),
                         lambda: other.application.delete_config_file("kept.cfg")):
                assert "bench operator" in refused(call, 423)
            assert other.application.list_config_files() == ["kept.cfg"]
            holder.application.upload_config_file("new.cfg", data)
            holder.application.delete_config_file("new.cfg")
        lines = holder.audit.get_audit_log(tail=0)
        for method, path in (("POST", "api/application/config/upload"), ("DELETE", "api/application/config/")):
            changes = [line for line in lines if f" {method} /{path}" in line]
            assert any("outcome=refused" in line for line in changes), (method, changes)
            assert any("bench operator" in line and "outcome=applied" in line for line in changes), (method, changes)


# 7. Every state event says whether the station is connected.

def test_the_configuration_event_carries_is_connected(own_client: AccordionQ2Client) -> None:
    events = Events(own_client.events.open())
    try:
        own_client.channels.configure(ChannelConfigRequest(net_name=station.VSET2, description="set point 2"))
        change = events.named("configuration", 10.0)
        assert change["isConnected"] is True, change
        assert {"generation", "changeType"} <= set(change), change
    finally:
        events.close()


# 8. NumericResult channels are never served as values.

def test_a_subscription_lists_a_numeric_result_channel_in_errors(client: AccordionQ2Client) -> None:
    events = Events(client.events.open())
    try:
        sub = client.subscriptions.create(events.stream.stream_id, [BASE_NR, station.MON_3V3], 200)
        data = events.named("values", 10.0, lambda d: d.get("subscription") == sub.id)
        assert BASE_NR not in data["values"] and station.MON_3V3 in data["values"], data
        assert "NumericResult" in (data.get("errors") or {}).get(BASE_NR, ""), data
        client.subscriptions.delete(sub.id)
    finally:
        events.close()


# 3. Channel details from the start, and after every change.

def _details(client: AccordionQ2Client) -> dict[str, dict]:
    return {ch.net_name: dict(ch.details) for ch in client.channels.get_all() if ch.details}


def test_details_are_there_from_the_start_and_after_a_configure_and_a_reset(own_client: AccordionQ2Client,
                                                                            own_gateway: GatewayProcess) -> None:
    client = own_client
    total = len(client.channels.get_all())
    first = _details(client)
    # 56: the default station's 55 channels and its door interlock (Interlock.DOOR_CLOSED).
    assert len(first) >= 48 and total == 56, (len(first), total)
    assert first[station.MON_3V3].get("gain") == 1.0, first[station.MON_3V3]
    numeric = first[BASE_NR]
    assert numeric["possibleTargetNames"] == [station.MON_3V3, station.MON_1V8], numeric
    assert numeric["targetNetName"] == station.MON_3V3 and numeric["sampleRate"] == 10_000, numeric
    client.channels.configure(ChannelConfigRequest(net_name=station.VSET2, description="set point 2"))
    wait_for(lambda: len(_details(client)) == len(first), 10.0, "details of every channel after a configure")
    assert _details(client)[station.MON_3V3] == first[station.MON_3V3]
    events = Events(client.events.open())
    try:
        client.application.reset()
        events.named("configuration", 15.0)
    finally:
        events.close()
    wait_for(lambda: client.connection.get_status().is_connected, 10.0, "the link back after the reset")
    after = _details(client)
    assert set(after) == set(first), set(first) ^ set(after)


# 4. A confirmed write feeds the cache through a read-back.

def _cached(client: AccordionQ2Client, names: list[str]):
    """The cached values of `names` (any age), or None while one has nothing cached (423)."""
    try:
        return client.resources.read_values(names, max_age_ms=60_000)
    except AccordionQ2ApiError as error:
        assert error.status_code == 423 and "no cached value" in str(error), error
        return None


def test_a_non_holder_reads_from_the_cache_what_the_holder_just_wrote(own_client: AccordionQ2Client,
                                                                      own_gateway: GatewayProcess) -> None:
    holder = own_client
    with AccordionQ2Client(own_gateway.url, timeout=15.0) as dashboard:
        with holder.lease.hold("sequence", ttl_ms=30_000):
            holder.resources.set_value(station.VSET3, "21")
            # Normally there before the write's answer (the read-back is waited for, briefly);
            # on a loaded machine a moment later, never the value merely asked for.
            values, ages = wait_for(lambda: _cached(dashboard, [station.VSET3]), 5.0, "VSET3 in the cache")
            assert float(values[station.VSET3]) == 21.0 and ages[station.VSET3] < 5_000, (values, ages)
            holder.resources.set_values({station.VSET3: "22", station.RAMP2: "40"})
            values, _ = wait_for(lambda: (v := _cached(dashboard, [station.VSET3, station.RAMP2]))
                                 and float(v[0][station.VSET3]) == 22.0 and v, 5.0, "both in the cache")
            assert (float(values[station.VSET3]), float(values[station.RAMP2])) == (22.0, 40.0), values
            holder.resources.set_value(station.VSET3, "0")

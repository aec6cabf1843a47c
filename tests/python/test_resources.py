"""resources/*: names, forced and cached reads, writes, transact — through accordionq2."""

from __future__ import annotations

import json
import time

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client

import station
from station import wait_for


def fvalue(client: AccordionQ2Client, name: str) -> float:
    return float(client.resources.get_value(name))


def test_names_hold_every_resource_of_the_station(client: AccordionQ2Client) -> None:
    names = client.resources.get_names()
    assert all(isinstance(n, str) and n for n in names)
    assert len(names) == len(set(names)), "duplicate names"
    missing = [n for n in station.PROFILE_NAMES if n not in names]
    assert not missing, f"names lack {missing}"


def test_get_value_of_a_monitor(client: AccordionQ2Client) -> None:
    value = client.resources.get_value(station.MON_3V3)
    assert isinstance(value, str)
    assert float(value) == pytest.approx(3.3, abs=0.05)
    assert float(client.resources.get_value(station.MON_1V8)) == pytest.approx(1.8, abs=0.05)
    assert float(client.resources.get_value(station.EXT_VOLT)) == pytest.approx(5.0, abs=0.3)


def test_get_value_renders_each_kind_in_the_station_format(client: AccordionQ2Client) -> None:
    assert client.resources.get_value(station.FIRMWARE_REV).startswith("6.")
    assert client.resources.get_value(station.ON1) in ("True", "False")
    assert client.resources.get_value(station.STAT1) in station.STAT_OPTIONS
    assert client.resources.get_value(station.LED_A1) in station.LED_COLOURS
    assert 20.0 < float(client.resources.get_value(station.CPU_TEMP)) < 80.0


def test_monitor_reads_are_forced_reads_from_the_hardware(client: AccordionQ2Client) -> None:
    # MON_3V3 carries noise: a forced read each time, never one cached value over and over.
    values = {client.resources.get_value(station.MON_3V3) for _ in range(30)}
    assert len(values) > 1, f"30 forced reads of a noisy monitor all gave {values}"


def test_set_vset_and_on_then_vmon_ramps_toward_vset(hv1: AccordionQ2Client) -> None:
    client = hv1
    client.resources.set_value(station.VSET1, "100")
    assert float(client.resources.get_value(station.VSET1)) == pytest.approx(100.0)
    assert client.resources.get_value(station.ON1) == "False"
    client.resources.set_value(station.ON1, "True")
    assert client.resources.get_value(station.ON1) == "True"

    # 50 V/s by default: past 20 V in well under a second, and still rising.
    def past_20_and_rising() -> tuple[float, float] | None:
        first = fvalue(client, station.VMON1)
        if first <= 20.0:
            return None
        time.sleep(0.1)  # 5 V more at 50 V/s
        second = fvalue(client, station.VMON1)
        return (first, second) if second > first else None

    first, second = wait_for(past_20_and_rising, 10.0, "VMON1 above 20 V and rising")
    assert second <= 100.5
    assert client.resources.get_value(station.STAT1) in ("Ramping", "On")

    settled = wait_for(lambda: abs(fvalue(client, station.VMON1) - 100.0) < 1.0, 10.0, "VMON1 at VSET1 (100 V)")
    assert settled
    assert wait_for(lambda: client.resources.get_value(station.STAT1) == "On", 5.0, "STAT1 On")
    # The load is 10 MΩ: about 10 µA, well below the 100 µA trip level.
    assert float(client.resources.get_value(station.IMON1)) == pytest.approx(10.0, abs=1.0)

    client.resources.set_value(station.ON1, "False")
    wait_for(lambda: fvalue(client, station.VMON1) < 90.0, 5.0, "VMON1 ramping down once off")


def test_get_values_reads_every_name(client: AccordionQ2Client) -> None:
    names = [station.MON_3V3, station.MON_1V8, station.FIRMWARE_REV, *station.ADC]
    values = client.resources.get_values(names)
    assert set(values) == set(names)
    assert float(values[station.MON_3V3]) == pytest.approx(3.3, abs=0.05)
    assert float(values[station.MON_1V8]) == pytest.approx(1.8, abs=0.05)
    assert values[station.FIRMWARE_REV].startswith("6.")
    # Each ADC input is its own signal: 2.5 V nominal, drifting by up to 1 V with a phase of its
    # own (config/station.toml), so eight different readings, each in range.
    adc = [float(values[n]) for n in station.ADC]
    assert all(1.4 <= v <= 3.6 for v in adc), dict(zip(station.ADC, adc))
    assert len(set(adc)) == len(adc), f"ADC inputs share a reading: {dict(zip(station.ADC, adc))}"


def test_read_values_without_max_age_is_a_fresh_read(client: AccordionQ2Client) -> None:
    names = [station.MON_3V3, station.MON_1V8, station.CPU_TEMP]
    values, ages = client.resources.read_values(names)
    assert set(values) == set(names)
    assert set(ages) == set(names), f"ageMs should name every value: {ages}"
    assert all(0.0 <= age < 250.0 for age in ages.values()), f"a forced read is about 0 ms old: {ages}"


def test_read_values_with_max_age_serves_the_cache_and_ages_grow(client: AccordionQ2Client) -> None:
    names = [station.MON_3V3, station.MON_1V8, station.CPU_TEMP, station.ADC[0]]
    first_values, first_ages = client.resources.read_values(names, max_age_ms=60000)
    time.sleep(0.3)  # let the cached values grow older
    second_values, second_ages = client.resources.read_values(names, max_age_ms=60000)
    assert second_values == first_values, "a cached read within max_age_ms must give the cached values"
    for name in names:
        assert second_ages[name] >= first_ages[name] + 250.0, (name, first_ages[name], second_ages[name])
        assert second_ages[name] < 60000.0

    # get_values with max_age_ms: the same cached values, without ages.
    assert client.resources.get_values(names, max_age_ms=60000) == first_values

    # max_age_ms=0: every value read from the hardware, about 0 ms old.
    _, fresh_ages = client.resources.read_values(names, max_age_ms=0)
    assert all(age < 250.0 for age in fresh_ages.values()), fresh_ages
    assert all(fresh_ages[n] < second_ages[n] for n in names)


def test_a_forced_read_feeds_the_cache(client: AccordionQ2Client) -> None:
    value = client.resources.get_value(station.MON_3V3)
    values, ages = client.resources.read_values([station.MON_3V3], max_age_ms=60000)
    assert values[station.MON_3V3] == value
    assert ages[station.MON_3V3] < 5000.0


def test_a_short_max_age_reads_again(client: AccordionQ2Client) -> None:
    client.resources.read_values([station.MON_3V3], max_age_ms=60000)
    time.sleep(0.2)
    _, ages = client.resources.read_values([station.MON_3V3], max_age_ms=50)
    assert ages[station.MON_3V3] < 50.0, f"older than max_age_ms=50: {ages}"


def test_a_write_invalidates_the_cached_value(client: AccordionQ2Client) -> None:
    try:
        client.resources.set_value(station.VSET2, "5")
        client.resources.read_values([station.VSET2], max_age_ms=60000)  # cached at 5
        client.resources.set_value(station.VSET2, "7")
        values, _ = client.resources.read_values([station.VSET2], max_age_ms=60000)
        assert float(values[station.VSET2]) == pytest.approx(7.0), "a cached read after a write gave the old value"
    finally:
        client.resources.set_value(station.VSET2, "0")


def test_set_values_applies_every_value(client: AccordionQ2Client) -> None:
    wanted = {station.VSET2: "12.5", station.RAMP2: "100", station.LED_A1: "Red", station.ON1: "False"}
    try:
        client.resources.set_values(wanted)
        got = client.resources.get_values(list(wanted))
        assert float(got[station.VSET2]) == pytest.approx(12.5)
        assert float(got[station.RAMP2]) == pytest.approx(100.0)
        assert got[station.LED_A1] == "Red"
        assert got[station.ON1] == "False"
        client.resources.set_values({station.LED_A1: "HotPink"})
        assert client.resources.get_value(station.LED_A1) == "HotPink"
    finally:
        client.resources.set_values({station.VSET2: "0", station.RAMP2: "50", station.LED_A1: "Black"})
    assert client.resources.get_values([station.VSET2, station.LED_A1]) == {station.VSET2: "0", station.LED_A1: "Black"}


def test_transact_on_the_uart_answers_idn(client: AccordionQ2Client) -> None:
    client.resources.get_value(station.UART)  # empty the receive buffer
    reply = client.resources.transact(station.UART, "*IDN?\n")
    line = reply.strip()
    fields = line.split(",")
    assert len(fields) >= 4 and all(f.strip() for f in fields), f"not an identity line: {reply!r}"
    assert not line.upper().startswith("ERR"), reply
    # Write and read were one step: the reply was consumed, nothing is left to read.
    assert client.resources.get_value(station.UART) == ""
    # A command the instrument doesn't know gets some other answer, not the identity.
    other = client.resources.transact(station.UART, "NO:SUCH:COMMAND?\n")
    assert other.strip() and other.strip() != line


def test_uart_write_then_read_returns_the_reply_once(client: AccordionQ2Client) -> None:
    client.resources.get_value(station.UART)
    client.resources.set_value(station.UART, "*IDN?\n")
    first = client.resources.get_value(station.UART)
    assert len(first.strip().split(",")) >= 4, first
    assert client.resources.get_value(station.UART) == "", "a UART read consumes what it returned"


def test_request_keys_bind_case_insensitively(gateway_url: str) -> None:
    answer = station.raw_request(gateway_url, "POST", "api/resources/value/get", '{"name": "%s"}' % station.MON_3V3)
    assert answer.status == 200, answer
    assert float(answer.json()["value"]) == pytest.approx(3.3, abs=0.05)
    answer = station.raw_request(
        gateway_url, "POST", "api/resources/values/get", '{"NAMES": ["%s"], "maxagems": 60000}' % station.MON_1V8
    )
    assert answer.status == 200, answer
    assert set(answer.json()["resources"]) == {station.MON_1V8}


def test_values_get_names_each_resource_once_in_the_order_asked(gateway_url: str) -> None:
    # Not in sorted order, with a repeat.
    asked = [station.CPU_TEMP, station.MON_3V3, station.MON_1V8, station.MON_3V3]
    for max_age in (0, 60000):
        body = json.dumps({"Names": asked, "MaxAgeMs": max_age})
        answer = station.raw_request(gateway_url, "POST", "api/resources/values/get", body)
        assert answer.status == 200, answer
        assert answer.headers["content-type"].startswith("application/json"), answer.headers
        # Keys in the order first asked, each once (a JSON object with a repeated key would be
        # read differently by different clients).
        pairs = json.loads(answer.body, object_pairs_hook=lambda items: items)
        assert [key for key, _ in pairs] == ["resources", "ageMs"], answer.body
        expected = [station.CPU_TEMP, station.MON_3V3, station.MON_1V8]
        resources, ages = dict(pairs)["resources"], dict(pairs)["ageMs"]
        assert [key for key, _ in resources] == expected, answer.body
        assert [key for key, _ in ages] == expected, answer.body
        assert float(dict(resources)[station.MON_3V3]) == pytest.approx(3.3, abs=0.05)
        assert all(isinstance(age, float) and age >= 0.0 for _, age in ages), answer.body


def test_one_client_many_requests_on_one_connection(client: AccordionQ2Client) -> None:
    for _ in range(200):
        assert float(client.resources.get_value(station.MON_3V3)) == pytest.approx(3.3, abs=0.05)


def test_two_clients_at_once(client_factory) -> None:
    import threading

    errors: list[BaseException] = []

    def work() -> None:
        c = client_factory()
        try:
            for _ in range(50):
                values = c.resources.get_values([station.MON_3V3, station.MON_1V8])
                assert float(values[station.MON_3V3]) == pytest.approx(3.3, abs=0.05)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"workers still running after 60 s: {hung}"
    assert not errors, errors


"""Numeric results through accordionq2: NumericResult channels, acquisitions with
statistics, measurements kept per channel, every refusal, and the lease."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client

import station
from station import wait_for

BASE_NR = "0.1.ESH10000158.NumericResult"
HV_NR = "0.4.ESH10000662.NumericResult"
ADC_NR = "0.8.ESH10000590.NumericResult"
OWNER = "TAT station 3"


def refused(call: Callable[[], object], status: int) -> str:
    with pytest.raises(AccordionQ2ApiError) as caught:
        call()
    assert caught.value.status_code == status, f"{caught.value!r}, expected {status}"
    return str(caught.value)


@pytest.fixture(autouse=True)
def no_lease_before_or_after(gateway_url: str) -> Iterator[None]:
    with AccordionQ2Client(gateway_url, timeout=10) as watcher:
        wait_for(lambda: not watcher.lease.get().held, 35, "the lease free before the test")
        wait_for(lambda: station.lease_takeable(gateway_url), 35, "the lock-delay over before the test")
        yield
        wait_for(lambda: not watcher.lease.get().held, 10, "the lease free after the test")


def test_channels_and_targets_are_discovered(client: AccordionQ2Client) -> None:
    channels = {ch.net_name: ch for ch in client.numeric_results.get_channels()}
    assert set(channels) == {BASE_NR, HV_NR, ADC_NR}
    base = channels[BASE_NR]
    assert base.possible_target_names == (station.MON_3V3, station.MON_1V8)
    assert base.sample_rate == 10_000 and base.default_samples == 1000
    assert channels[ADC_NR].sample_rate == 50_000
    assert set(channels[ADC_NR].possible_target_names) == set(station.ADC)
    assert client.numeric_results.get_targets(BASE_NR) == [station.MON_3V3, station.MON_1V8]


def test_acquire_1000_samples_of_mon_3v3_with_limits(client: AccordionQ2Client) -> None:
    acq = client.numeric_results.acquire(BASE_NR, station.MON_3V3, samples=1000, lsl=3.2, usl=3.4)
    assert (acq.channel, acq.target, acq.unit) == (BASE_NR, station.MON_3V3, "V")
    assert acq.sample_rate == 10_000
    assert len(acq.samples) == 1000
    stats = acq.stats
    assert stats["count"] == 1000
    assert abs(stats["mean"] - 3.3) < 0.01, stats
    assert stats["stdev"] > 0
    assert stats["min"] <= stats["mean"] <= stats["max"]
    assert stats["cp"] is not None and stats["cp"] > 0
    assert stats["cpk"] is not None and stats["cpk"] <= stats["cp"]
    mean = sum(acq.samples) / len(acq.samples)
    assert math.isclose(mean, stats["mean"], rel_tol=1e-12)
    # 1 000 samples at 10 kHz take 0.1 s of station time.
    assert acq.duration_ms is not None and acq.duration_ms >= 90
    assert acq.started.endswith("Z")


def test_acquire_without_limits_has_no_capability_and_one_sample_has_no_spread(client: AccordionQ2Client) -> None:
    acq = client.numeric_results.acquire(BASE_NR, station.MON_1V8, samples=1)
    assert len(acq.samples) == 1
    assert acq.stats["count"] == 1
    assert acq.stats["stdev"] is None and acq.stats["skewness"] is None
    assert "cp" not in acq.stats and "cpk" not in acq.stats


def test_measure_full_and_reduced(client: AccordionQ2Client) -> None:
    nr = client.numeric_results
    meta = nr.measure(ADC_NR, station.ADC[0], samples=500, reduced_set=False)
    assert (meta.channel_net_name, meta.target_net_name) == (ADC_NR, station.ADC[0])
    assert meta.sample_count == 500 and not meta.reduced_set and meta.sample_rate == 50_000
    assert meta.started and meta.stopped and meta.duration.startswith("00:00:")
    mean, low, high, stdev = nr.get_mean(ADC_NR), nr.get_min(ADC_NR), nr.get_max(ADC_NR), nr.get_stdev(ADC_NR)
    assert low <= mean <= high and stdev > 0
    samples = nr.get_samples(ADC_NR)
    assert len(samples) == 500
    assert math.isclose(sum(samples) / 500, mean, rel_tol=1e-9)

    meta = nr.measure(ADC_NR, station.ADC[1], samples=200, reduced_set=True)
    assert meta.sample_count == 0 and meta.reduced_set
    assert nr.get_min(ADC_NR) <= nr.get_mean(ADC_NR) <= nr.get_max(ADC_NR)
    message = refused(lambda: nr.get_samples(ADC_NR), 400)
    assert "reduced" in message.lower() or "ReducedSet" in message


def test_an_acquisition_longer_than_a_request_timeout_follows_its_own_time(client: AccordionQ2Client) -> None:
    # 25 000 samples at 10 kHz take 2.5 s, longer than the 2 s request timeout: neither client
    # caps Samples, and the gateway waits for the acquisition's own time (station.max_operation_ms).
    meta = client.numeric_results.measure(BASE_NR, station.MON_3V3, samples=25_000, reduced_set=False)
    assert meta.sample_count == 25_000, meta
    assert len(client.numeric_results.get_samples(BASE_NR)) == 25_000


def test_every_refusal(client: AccordionQ2Client) -> None:
    nr = client.numeric_results
    for bad in (0, -5, 100_001):
        message = refused(lambda: nr.acquire(BASE_NR, station.MON_3V3, samples=bad), 400)
        assert "100000" in message, message
    message = refused(lambda: nr.measure(BASE_NR, station.VMON1, samples=10), 400)
    assert station.MON_3V3 in message, "the refusal names the channel's targets"
    assert "not found" in refused(lambda: nr.acquire("No.Such.NumericResult", station.MON_3V3), 404).lower()
    assert "not found" in refused(lambda: nr.get_targets("No.Such.NumericResult"), 404).lower()
    assert "not found" in refused(lambda: nr.get_mean(station.MON_3V3), 404).lower()
    # No measurement on this channel yet (acquire keeps no result).
    nr.acquire(HV_NR, station.VMON1, samples=10)
    assert "measure" in refused(lambda: nr.get_mean(HV_NR), 404).lower()
    refused(lambda: nr.acquire(BASE_NR, station.MON_3V3, samples=10, lsl=3.4, usl=3.2), 400)


def test_a_non_holder_is_refused_with_423_naming_the_holder(client_factory) -> None:
    a, b = client_factory(), client_factory()
    with a.lease.hold(OWNER, ttl_ms=30_000):
        for call in (
            lambda: b.numeric_results.acquire(BASE_NR, station.MON_3V3, samples=10),
            lambda: b.numeric_results.measure(BASE_NR, station.MON_3V3, samples=10),
        ):
            assert OWNER in refused(call, 423)
        # The holder acquires as usual; reading the channel list stays open to everyone.
        assert len(a.numeric_results.acquire(BASE_NR, station.MON_3V3, samples=10).samples) == 10
        assert b.numeric_results.get_targets(BASE_NR)


def test_a_ramping_hv_output_shows_in_the_samples(hv1: AccordionQ2Client) -> None:
    hv1.resources.set_values({station.VSET1: "500", station.ON1: "True"})
    acq = hv1.numeric_results.acquire(HV_NR, station.VMON1, samples=10_000)
    # 50 V/s for 1 s of samples: VMON1 rises through the acquisition.
    first, last = acq.samples[:100], acq.samples[-100:]
    assert sum(last) / 100 - sum(first) / 100 > 20, (first[:3], last[-3:])

"""The control lease through accordionq2: two test stations, one holder at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client

import station
from simproc import SimProcess
from station import lease_takeable, raw_request, wait_for

OWNER = "TAT station 3"
OTHER = "TAT station 7"
# Generous: the machine may be loaded; the contract's timings are asserted with this much slack.
SLACK_S = 2.0


def lease_free(client: AccordionQ2Client) -> bool:
    return not client.lease.get().held


@pytest.fixture(autouse=True)
def no_lease_before_or_after(gateway_url: str) -> Iterator[None]:
    """Each test starts with nobody holding the session gateway's lease, and leaves it so
    (a lease left behind would turn the rest of the suite's writes into 423s)."""
    with AccordionQ2Client(gateway_url, timeout=10) as watcher:
        wait_for(lambda: lease_free(watcher), 35, "the lease free before the test")
        # A lease an earlier test let lapse makes the next wait its lock-delay.
        wait_for(lambda: lease_takeable(gateway_url), 35, "the lock-delay over before the test")
        yield
        wait_for(lambda: lease_free(watcher), 10, "the lease free after the test")


@pytest.fixture
def two(client_factory: Callable[..., AccordionQ2Client]) -> tuple[AccordionQ2Client, AccordionQ2Client]:
    """Two test stations on the same gateway: A and B."""
    return client_factory(), client_factory()


def refused(call: Callable[[], object], status: int) -> str:
    """Runs `call`, which must raise AccordionQ2ApiError with `status`; returns its message."""
    with pytest.raises(AccordionQ2ApiError) as caught:
        call()
    assert caught.value.status_code == status, f"{caught.value!r}, expected {status}"
    return str(caught.value)


def test_a_non_holder_is_refused_changes_and_forced_reads_with_423_naming_the_holder(two) -> None:
    a, b = two
    with a.lease.hold(OWNER, ttl_ms=30_000):
        for what, call in [
            ("set_value", lambda: b.resources.set_value(station.VSET1, "0")),
            ("set_values", lambda: b.resources.set_values({station.VSET1: "0", station.ON1: "False"})),
            ("get_value", lambda: b.resources.get_value(station.MON_3V3)),
            ("get_values", lambda: b.resources.get_values([station.MON_3V3, station.VMON1])),
        ]:
            message = refused(call, 423)
            assert OWNER in message, f"B's {what}: the 423 does not name the holder: {message!r}"
        # The holder's own changes and forced reads go through as if there were no lease.
        a.resources.set_values({station.VSET1: "0", station.ON1: "False"})
        assert float(a.resources.get_value(station.VSET1)) == pytest.approx(0.0)


def test_a_non_holder_reads_the_cache_with_ages_while_the_lease_is_held(
        station_sim: SimProcess, gateway_factory, client_factory) -> None:
    # A gateway of its own on a standalone simulator, whose `reads CHANNEL` counter tells a
    # cache hit from a hardware read.
    gateway = gateway_factory("--station", station_sim.url, simulator=False)
    a, b = client_factory(gateway.url), client_factory(gateway.url)

    def hardware_reads() -> dict[str, int]:
        return {name: int(station_sim.control(f"reads {name}").split()[-1]) for name in names}

    names = [station.MON_3V3, station.VMON1]
    with a.lease.hold(OWNER, ttl_ms=30_000):
        a.resources.get_values(names)  # the holder's forced read fills the cache
        read_by_the_holder = hardware_reads()
        values, ages = b.resources.read_values(names, max_age_ms=60_000)
        assert set(values) == set(names), values
        assert float(values[station.MON_3V3]) == pytest.approx(3.3, abs=0.05)
        assert set(ages) == set(names), f"no ages for every name: {ages}"
        assert all(0.0 <= age <= 60_000.0 for age in ages.values()), ages
        # Served from the cache: the holder's read of a moment ago, not a fresh hardware read.
        assert hardware_reads() == read_by_the_holder, "B's cached read went to the hardware"


def test_acquire_while_held_is_409_naming_the_holder_and_get_never_shows_the_id(two, gateway_url) -> None:
    a, b = two
    with a.lease.hold(OWNER, ttl_ms=30_000) as mine:
        assert mine.held and mine.lease_id
        message = refused(lambda: b.lease.acquire(OTHER, ttl_ms=5000), 409)
        assert OWNER in message, f"the 409 does not name the holder: {message!r}"
        assert b.lease.held_lease_id is None
        seen = b.lease.get()
        assert seen.held and seen.owner == OWNER, seen
        assert 0 < seen.expires_in_ms <= 30_000, seen
        assert seen.lease_id is None, f"GET lease showed the id: {seen}"
        # Not to anyone: neither to a stranger nor to the holder itself, under any key.
        for headers in ({}, {"X-Lease-Id": mine.lease_id}):
            answer = raw_request(gateway_url, "GET", "api/lease", headers=headers)
            assert answer.status == 200, answer
            assert mine.lease_id not in answer.body.decode(), f"GET lease showed the id: {answer}"
            assert "since" in answer.json(), answer


def test_hold_keeps_the_lease_past_its_ttl_and_b_acquires_after_the_block(two) -> None:
    a, b = two
    with a.lease.hold(OWNER, ttl_ms=1500):
        started = time.monotonic()
        while time.monotonic() - started < 2.5:  # well past the 1.5 s TTL
            seen = b.lease.get()
            assert seen.held and seen.owner == OWNER, f"{time.monotonic() - started:.2f} s in: {seen}"
            time.sleep(0.1)
        a.resources.set_value(station.VSET1, "0")  # still the holder's
        refused(lambda: b.resources.set_value(station.VSET1, "0"), 423)
    # The block released it: B takes it at once and can change the station.
    taken = b.lease.acquire(OTHER, ttl_ms=5000)
    try:
        assert taken.held and taken.owner == OTHER and taken.lease_id, taken
        b.resources.set_value(station.VSET1, "0")
        message = refused(lambda: a.resources.set_value(station.VSET1, "0"), 423)
        assert OTHER in message, message
    finally:
        b.lease.release()


def test_after_expiry_renew_is_404_and_the_next_write_423_lease_ended(two) -> None:
    a, b = two
    a.lease.acquire(OWNER, ttl_ms=1000)
    assert a.lease.held_lease_id
    wait_for(lambda: lease_free(b), 1.0 + SLACK_S, "the lease not renewed ran out")
    message = refused(lambda: a.lease.renew(), 404)
    assert message, "empty 404 message"
    # The client still sends the old id: its next change is refused, saying why.
    message = refused(lambda: a.resources.set_value(station.VSET1, "0"), 423)
    assert "lease ended" in message, message
    # Nobody holds it, so the same change without the stale id goes through.
    b.resources.set_value(station.VSET1, "0")
    a.lease.release()  # a 404 by now; the client ignores it and forgets the id
    assert a.lease.held_lease_id is None
    a.resources.set_value(station.VSET1, "0")


def test_a_lease_not_renewed_ends_within_its_ttl(two, gateway_url) -> None:
    a, b = two
    started = time.monotonic()
    taken = a.lease.acquire(OWNER, ttl_ms=1000)
    assert 0 < taken.expires_in_ms <= 1000, taken
    wait_for(lambda: lease_free(b), 1.0 + SLACK_S, "the lease ran out")
    took = time.monotonic() - started
    # It ran out, rather than being released early: it lasted most of its TTL.
    assert took >= 0.8, f"a 1 s lease ended after {took:.2f} s"
    # Unreleased, but every change of it was answered: nothing can land late, so the next
    # lease is served at once, with no lock-delay.
    assert lease_takeable(gateway_url), "a lock-delay after a lapse with nothing in doubt"
    b.lease.acquire(OTHER, ttl_ms=5000)
    b.lease.release()


@pytest.mark.parametrize("ttl_ms", [999, 600_001, 0, -1])
def test_ttl_out_of_range_is_400(client: AccordionQ2Client, ttl_ms: int) -> None:
    message = refused(lambda: client.lease.acquire(OWNER, ttl_ms=ttl_ms), 400)
    assert "TtlMs" in message or "ttl" in message.lower(), f"the 400 does not name the field: {message!r}"
    assert client.lease.held_lease_id is None
    assert lease_free(client)


@pytest.mark.parametrize("ttl_ms", [1000, 600_000])
def test_ttl_at_the_limits_is_accepted(client: AccordionQ2Client, ttl_ms: int) -> None:
    taken = client.lease.acquire(OWNER, ttl_ms=ttl_ms)
    try:
        assert taken.held and 0 < taken.expires_in_ms <= ttl_ms, taken
    finally:
        client.lease.release()


def test_the_holder_gets_its_fence_in_x_lease_fence(gateway_url: str) -> None:
    taken = raw_request(gateway_url, "POST", "api/lease", body='{"Owner": "TAT station 3", "TtlMs": 5000}')
    assert taken.status == 200, taken
    lease_id, fence = taken.json()["leaseId"], taken.json()["fence"]
    assert isinstance(fence, int) and fence > 0, taken
    try:
        mine = {"X-Lease-Id": lease_id}
        for method, path, body in [
            ("POST", "api/resources/value/get", f'{{"Name": "{station.MON_3V3}"}}'),
            ("POST", "api/resources/value/set", f'{{"Name": "{station.VSET1}", "Value": "0"}}'),
            ("GET", "api/lease", None),
        ]:
            answer = raw_request(gateway_url, method, path, body=body, headers=mine)
            assert answer.status == 200, (path, answer)
            assert answer.headers.get("x-lease-fence") == str(fence), (path, answer.headers)
        # Not on anyone else's answers.
        other = raw_request(gateway_url, "GET", "api/lease")
        assert other.status == 200 and "x-lease-fence" not in other.headers, other.headers
        renewed = raw_request(gateway_url, "PUT", f"api/lease/{lease_id}", body='{"TtlMs": 5000}')
        assert renewed.status == 200 and renewed.json()["fence"] == fence, renewed
    finally:
        assert raw_request(gateway_url, "DELETE", f"api/lease/{lease_id}").status == 200
    # The next acquisition gets a greater fence.
    again = raw_request(gateway_url, "POST", "api/lease", body='{"Owner": "TAT station 7", "TtlMs": 5000}')
    assert again.status == 200, again
    try:
        assert again.json()["fence"] > fence, (fence, again)
    finally:
        raw_request(gateway_url, "DELETE", f"api/lease/{again.json()['leaseId']}")

"""The event stream and subscriptions through accordionq2: hello, values, lease,
connection and configuration events, with deadlines rather than exact timings."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client
from accordionq2.events import EventStream, ServerEvent

import station
from gatewayproc import GatewayProcess
from simproc import SimProcess
from station import wait_for


class Events:
    """Reads an EventStream on a thread of its own, so the test waits for events with deadlines.
    Each event is kept with the time it arrived."""

    def __init__(self, stream: EventStream) -> None:
        self.stream = stream
        self.hello = stream.hello
        self._queue: queue.Queue[tuple[float, ServerEvent] | BaseException] = queue.Queue()
        self.seen: list[tuple[float, ServerEvent]] = []
        self._thread = threading.Thread(target=self._read, name="event-stream", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self.stream:
                self._queue.put((time.monotonic(), event))
        except BaseException as error:  # the stream ended (or was closed by the test)
            self._queue.put(error)

    def next(self, timeout: float, where: Callable[[ServerEvent], bool] = lambda e: True,
             what: str = "an event") -> tuple[float, ServerEvent]:
        """The next event `where` accepts (others are skipped), with its arrival time."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                names = [e.name for _, e in self.seen[-20:]]
                raise AssertionError(f"{what}: none within {timeout} s (last events: {names})")
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                self._queue.put(item)
                raise AssertionError(f"{what}: the stream ended first: {item!r}")
            self.seen.append(item)
            if where(item[1]):
                return item

    def named(self, name: str, timeout: float, where: Callable[[dict[str, Any]], bool] = lambda d: True):
        """The data of the next `name` event `where` accepts."""
        return self.next(timeout, lambda e: e.name == name and where(e.data), f"a {name!r} event")[1].data

    def values_of(self, subscription: str, count: int, timeout: float) -> list[tuple[float, ServerEvent]]:
        """The next `count` values events of `subscription`, all within `timeout`."""
        deadline = time.monotonic() + timeout
        got = []
        while len(got) < count:
            got.append(self.next(
                max(deadline - time.monotonic(), 0.001),
                lambda e: e.name == "values" and e.data.get("subscription") == subscription,
                f"values event {len(got) + 1} of {count} for {subscription}",
            ))
        return got

    def close(self) -> None:
        # Closing the connection alone doesn't wake the thread blocked reading it; shutting the
        # socket down does (and tells the gateway the stream is gone).
        sock = getattr(getattr(self.stream, "_conn", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.stream.close()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive(), "the event-stream reader did not stop"


def mean_spacing(events: list[tuple[float, ServerEvent]]) -> float:
    return (events[-1][0] - events[0][0]) / (len(events) - 1)


@pytest.fixture
def open_events() -> Iterator[Callable[[AccordionQ2Client], Events]]:
    """`open_events(client)`: an open, read-along event stream, closed after the test."""
    opened: list[Events] = []

    def open_(client: AccordionQ2Client) -> Events:
        opened.append(Events(client.events.open()))
        return opened[-1]

    yield open_
    for events in opened:
        events.close()


@pytest.fixture
def sim_gateway(station_sim: SimProcess, gateway_factory) -> GatewayProcess:
    """A gateway of the test's own on the standalone, faultable station_sim."""
    return gateway_factory("--station", station_sim.url, simulator=False)


def test_hello_comes_first_with_a_stream_id(client: AccordionQ2Client, open_events) -> None:
    events = open_events(client)
    hello = events.hello
    assert isinstance(events.stream.stream_id, str) and len(events.stream.stream_id) >= 16, hello
    assert hello["isConnected"] is True, hello
    assert isinstance(hello["generation"], int) and hello["generation"] >= 1, hello
    # The .NET client binds int ApiVersion (StreamStateDto): a JSON integer, not "1.0".
    assert isinstance(hello.get("apiVersion"), int) and not isinstance(hello["apiVersion"], bool), hello
    assert hello["apiVersion"] >= 1, hello
    # Each stream its own id.
    assert open_events(client).stream.stream_id != events.stream.stream_id


def test_a_subscription_sends_values_about_every_interval(client: AccordionQ2Client, open_events) -> None:
    events = open_events(client)
    names = [station.VMON1, station.IMON1]
    sub = client.subscriptions.create(events.stream.stream_id, names, 200)
    assert sub.id, sub
    assert 50_000 <= sub.expires_in_ms <= 60_000, sub
    got = events.values_of(sub.id, 5, timeout=15.0)  # a hang guard, not a speed test
    # No faster than the interval (a loaded machine can only make them later). The first goes
    # out at once, so it is left out.
    assert mean_spacing(got[1:]) * 1000 >= 150, f"mean spacing {mean_spacing(got[1:]) * 1000:.0f} ms"
    ids = [e.id for _, e in got]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
    for _, event in got:
        data = event.data
        assert set(data["values"]) == set(names), data
        assert all(isinstance(v, str) for v in data["values"].values()), data
        for name in names:
            float(data["values"][name])  # numbers, in the station's format
        assert set(data["ageMs"]) == set(names), data
        assert all(0 <= age < 1000 for age in data["ageMs"].values()), data
        assert not data.get("errors"), data
    client.subscriptions.delete(sub.id)


def test_update_replaces_channels_and_interval(client: AccordionQ2Client, open_events) -> None:
    events = open_events(client)
    sub = client.subscriptions.create(events.stream.stream_id, [station.VMON1, station.IMON1], 200)
    events.values_of(sub.id, 1, timeout=3.0)
    renewed = client.subscriptions.update(sub.id, [station.MON_3V3], 500)
    assert renewed.id == sub.id and renewed.expires_in_ms > 0, renewed
    # Skip what was on its way before the update: from the first event with the new channel on.
    first = events.next(3.0, lambda e: e.name == "values" and e.data.get("subscription") == sub.id
                        and set(e.data["values"]) == {station.MON_3V3}, "a values event after the update")
    got = [first, *events.values_of(sub.id, 3, timeout=15.0)]  # a hang guard, not a speed test
    for _, event in got:
        assert set(event.data["values"]) == {station.MON_3V3}, event.data
        assert float(event.data["values"][station.MON_3V3]) == pytest.approx(3.3, abs=0.05)
    # The new interval took effect: no faster than 500 ms (200 ms would show as ~200).
    spacing_ms = mean_spacing(got) * 1000
    assert spacing_ms >= 350, f"mean spacing {spacing_ms:.0f} ms after updating to 500 ms"
    client.subscriptions.delete(sub.id)


def test_delete_ends_the_subscription_and_only_that_one(client: AccordionQ2Client, open_events) -> None:
    events = open_events(client)
    gone = client.subscriptions.create(events.stream.stream_id, [station.VMON1], 200)
    kept = client.subscriptions.create(events.stream.stream_id, [station.MON_3V3], 200)
    events.values_of(gone.id, 2, timeout=3.0)
    client.subscriptions.delete(gone.id)
    deleted_at = time.monotonic()
    # Both tick together (same interval, shared grid): a tick already under way when the delete
    # was answered may still deliver one of the deleted; from the kept one's second event after
    # the delete on, a full tick later, none may come. Watch three of the kept one's ticks.
    def values_after_the_delete() -> list[ServerEvent]:
        return [e for t, e in events.seen if t > deleted_at and e.name == "values"]

    deadline = time.monotonic() + 15.0  # a hang guard, not a speed test
    while sum(e.data.get("subscription") == kept.id for e in values_after_the_delete()) < 3:
        events.next(max(deadline - time.monotonic(), 0.001),
                    lambda e: e.name == "values" and e.data.get("subscription") == kept.id,
                    "the kept subscription's values after the delete")
    after = values_after_the_delete()
    kept_at = [i for i, e in enumerate(after) if e.data.get("subscription") == kept.id]
    gone_at = [i for i, e in enumerate(after) if e.data.get("subscription") == gone.id]
    assert all(i < kept_at[1] for i in gone_at), \
        f"values for a deleted subscription a tick after the delete: {[e.data for e in after]}"
    for call in (lambda: client.subscriptions.update(gone.id, [station.VMON1], 200),
                 lambda: client.subscriptions.delete(gone.id)):
        with pytest.raises(AccordionQ2ApiError) as caught:
            call()
        assert caught.value.status_code == 404, repr(caught.value)
    client.subscriptions.delete(kept.id)


def test_create_on_an_unknown_stream_is_404(client: AccordionQ2Client) -> None:
    with pytest.raises(AccordionQ2ApiError) as caught:
        client.subscriptions.create("0" * 32, [station.VMON1], 200)
    assert caught.value.status_code == 404, repr(caught.value)


@pytest.mark.parametrize("interval_ms", [99, 60_001])
def test_an_interval_out_of_range_is_400(client: AccordionQ2Client, open_events, interval_ms: int) -> None:
    events = open_events(client)
    with pytest.raises(AccordionQ2ApiError) as caught:
        client.subscriptions.create(events.stream.stream_id, [station.VMON1], interval_ms)
    assert caught.value.status_code == 400, repr(caught.value)
    assert "IntervalMs" in str(caught.value), repr(caught.value)


def test_a_subscription_not_renewed_ends(gateway_factory, tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("[events]\nsubscription_ttl_ms = 1000\n")
    gateway = gateway_factory("--config", str(config))
    with AccordionQ2Client(gateway.url, timeout=10) as client:
        events = Events(client.events.open())
        try:
            lapsing = client.subscriptions.create(events.stream.stream_id, [station.VMON1], 100)
            renewed = client.subscriptions.create(events.stream.stream_id, [station.MON_3V3], 100)
            assert lapsing.expires_in_ms <= 1000, lapsing
            started = time.monotonic()
            while time.monotonic() - started < 2.0:  # renew one every ~300 ms, past both TTLs
                client.subscriptions.update(renewed.id, [station.MON_3V3], 100)
                time.sleep(0.3)

            def lapsed() -> bool:
                try:
                    client.subscriptions.update(lapsing.id, [station.VMON1], 100)
                except AccordionQ2ApiError as error:
                    return error.status_code == 404
                raise AssertionError("a subscription not renewed for 2 s (TTL 1 s) could still be renewed")

            assert lapsed()
            # The renewed one still sends values.
            events.values_of(renewed.id, 3, timeout=3.0)
            client.subscriptions.delete(renewed.id)
        finally:
            events.close()


def test_a_lease_event_when_another_client_takes_and_releases_it(client_factory, open_events) -> None:
    watcher, other = client_factory(), client_factory()
    wait_for(lambda: not watcher.lease.get().held, 35, "the lease free before the test")
    events = open_events(watcher)
    taken = other.lease.acquire("TAT station 3", ttl_ms=5000)
    try:
        data = events.named("lease", 3.0, lambda d: d.get("held") is True)
        assert data["owner"] == "TAT station 3", data
        assert 0 < data["expiresInMs"] <= 5000, data
        assert data.get("since"), data
        assert taken.lease_id not in str(data), f"the lease event showed the id: {data}"
    finally:
        other.lease.release()
    data = events.named("lease", 3.0, lambda d: d.get("held") is False)
    assert not data.get("owner"), data


def test_subscriptions_work_for_everyone_while_the_lease_is_held(client_factory, open_events) -> None:
    holder, watcher = client_factory(), client_factory()
    events = open_events(watcher)
    with holder.lease.hold("TAT station 3", ttl_ms=30_000):
        sub = watcher.subscriptions.create(events.stream.stream_id, [station.VMON1, station.MON_3V3], 200)
        got = events.values_of(sub.id, 3, timeout=3.0)
        assert set(got[-1][1].data["values"]) == {station.VMON1, station.MON_3V3}, got[-1][1].data
        watcher.subscriptions.delete(sub.id)


def test_connection_events_when_the_station_drops_and_comes_back(station_sim: SimProcess,
                                                                 sim_gateway: GatewayProcess) -> None:
    with AccordionQ2Client(sim_gateway.url, timeout=10) as client:
        events = Events(client.events.open())
        try:
            generation = events.hello["generation"]
            assert events.hello["isConnected"] is True, events.hello

            station_sim.control("drop")
            down = events.named("connection", 5.0)
            assert down["isConnected"] is False, down
            assert down.get("lastError"), down
            up = events.named("connection", 10.0)
            assert up["isConnected"] is True and up["generation"] == generation + 1, up
            assert not up.get("lastError"), up

            # Kept down for a while: the gateway says so, then comes back with the next generation.
            station_sim.control("refuse on")
            station_sim.control("drop")
            down = events.named("connection", 5.0)
            assert down["isConnected"] is False, down
            assert not client.connection.get_status().is_connected
            station_sim.control("refuse off")
            up = events.named("connection", 15.0)
            assert up["isConnected"] is True and up["generation"] == generation + 2, up
            assert client.connection.get_status().is_connected
        finally:
            events.close()


def test_a_configuration_event_when_the_station_changes_its_channel_list(
        station_sim: SimProcess, sim_gateway: GatewayProcess) -> None:
    with AccordionQ2Client(sim_gateway.url, timeout=10) as client:
        assert station.MON_3V3 in client.resources.get_names()
        events = Events(client.events.open())
        try:
            generation = events.hello["generation"]
            station_sim.control(f"remove {station.MON_3V3}")
            change = events.named("configuration", 5.0)
            assert change["changeType"] == "Removed", change
            assert change["generation"] == generation, change
            wait_for(lambda: station.MON_3V3 not in client.resources.get_names(), 5.0,
                     "the removed channel gone from resources/names")
            with pytest.raises(AccordionQ2ApiError) as caught:
                client.subscriptions.create(events.stream.stream_id, [station.MON_3V3], 200)
            assert caught.value.status_code == 400 and station.MON_3V3 in str(caught.value), repr(caught.value)

            # A restarted station has its channel back: the list differs after the reconnect.
            station_sim.control("restart")
            change = events.named("configuration", 15.0)
            assert change["generation"] == generation + 1, change
            assert change["changeType"] in ("Added", "Changed"), change
            wait_for(lambda: station.MON_3V3 in client.resources.get_names(), 5.0,
                     "the channel back in resources/names after the restart")
        finally:
            events.close()


def test_a_stream_resumes_with_last_event_id_through_the_reference_client(
        client_factory, gateway_url: str, open_events) -> None:
    """A reader that reconnects sending the id of the last event it saw (Last-Event-ID, as a
    browser's EventSource does; here a default header of the client) gets its stream back: the
    same streamId, its subscription still there, and every event after that id, one after
    the other, including what happened while it was away."""
    client, other = client_factory(), client_factory()
    wait_for(lambda: not client.lease.get().held, 35, "the lease free before the test")
    events = open_events(client)
    sub = client.subscriptions.create(events.stream.stream_id, [station.VMON1], 200)
    last_id = events.values_of(sub.id, 3, timeout=15.0)[-1][1].id
    events.close()
    # While the reader is away, the lease changes hands.
    other.lease.acquire("TAT station 3", ttl_ms=5000)
    other.lease.release()
    resuming = client_factory(default_headers={"Last-Event-ID": str(last_id)})
    resumed = open_events(resuming)
    assert resumed.hello.get("resumed") is True, resumed.hello
    assert resumed.stream.stream_id == events.stream.stream_id, resumed.hello
    lease = resumed.named("lease", 5.0, lambda d: d.get("held") is True)
    assert lease["owner"] == "TAT station 3", lease
    resumed.named("lease", 5.0, lambda d: d.get("held") is False)
    resumed.values_of(sub.id, 2, timeout=15.0)
    ids = [event.id for _, event in resumed.seen]
    assert ids == list(range(last_id + 1, last_id + 1 + len(ids))), ids
    # Its subscription was never subscribed again: it is the same one, still renewable.
    assert client.subscriptions.update(sub.id, [station.VMON1], 200).id == sub.id


def test_after_a_gateway_restart_the_reference_client_is_told_of_the_gap(gateway_factory) -> None:
    """An id from the gateway before a restart: a new stream whose first events say what was
    lost (gap, reason restart) and what is so now (snapshot), never silence."""
    first = gateway_factory()
    with AccordionQ2Client(first.url, timeout=10) as client:
        events = Events(client.events.open())
        try:
            sub = client.subscriptions.create(events.stream.stream_id, [station.VMON1], 200)
            last_id = events.values_of(sub.id, 1, timeout=15.0)[-1][1].id
        finally:
            events.close()
    first.stop()
    second = gateway_factory()
    with AccordionQ2Client(second.url, timeout=10, default_headers={"Last-Event-ID": str(last_id)}) as client:
        events = Events(client.events.open())
        try:
            assert events.hello.get("resumed") is False, events.hello
            _, gap = events.next(5.0, what="the first event after hello")
            assert gap.name == "gap", gap
            assert gap.data["reason"] == "restart", gap.data
            assert gap.data["lastEventId"] == str(last_id), gap.data
            assert gap.data["subscriptions"] == "ended", gap.data
            _, snapshot = events.next(5.0, what="the snapshot after the gap")
            assert snapshot.name == "snapshot", snapshot
            assert snapshot.data["connection"]["isConnected"] is True, snapshot.data
            assert "held" in snapshot.data["lease"], snapshot.data
            assert snapshot.id == gap.id + 1, (gap.id, snapshot.id)
        finally:
            events.close()

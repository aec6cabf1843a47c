"""The audit trail through accordionq2: `audit.get_audit_log` shows the writes with
their lease owner and fence, a refused write as refused, and `tail` as the clients document."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client

import station
from station import LAB_STATION, raw_request, wait_for

OWNER = "TAT station 3 (audit)"
# The path each line shows, as the client sent it: a lab's station's with its /stations/ID.
API = f"/stations/{LAB_STATION}/api" if LAB_STATION else "/api"
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ \S+ \S+ (\d{3}|-) (\d+ms|-)( .*)?$")


@pytest.fixture(autouse=True)
def no_lease_before_or_after(gateway_url: str) -> Iterator[None]:
    with AccordionQ2Client(gateway_url, timeout=10) as watcher:
        wait_for(lambda: not watcher.lease.get().held, 35, "the lease free before the test")
        wait_for(lambda: station.lease_takeable(gateway_url), 35, "the lock-delay over before the test")
        yield
        wait_for(lambda: not watcher.lease.get().held, 10, "the lease free after the test")


def fence_of(client: AccordionQ2Client, gateway_url: str) -> int:
    """The fence of the lease `client` holds (the X-Lease-Fence its requests get back)."""
    response = raw_request(gateway_url, "GET", "api/lease", headers={"X-Lease-Id": client.lease.held_lease_id})
    return int(response.headers["x-lease-fence"])


def test_writes_show_owner_and_fence_and_a_refused_write_shows_refused(
    client_factory: Callable[..., AccordionQ2Client], gateway_url: str
) -> None:
    holder, other = client_factory(), client_factory()
    with holder.lease.hold(OWNER, ttl_ms=30000):
        fence = fence_of(holder, gateway_url)
        holder.resources.set_value(station.VSET1, "321")
        holder.resources.set_values({station.VSET1: "0", station.ON1: "False"})
        with pytest.raises(AccordionQ2ApiError) as refused:
            other.resources.set_value(station.VSET1, "999")
        assert refused.value.status_code == 423
        lines = holder.audit.get_audit_log(tail=50)
    if LAB_STATION:
        # A lab's station's log holds its own lines only, each ending naming it.
        assert all(line.endswith(f" station={LAB_STATION}") for line in lines), lines
        lines = [line.removesuffix(f" station={LAB_STATION}") for line in lines]
    assert all(LINE.match(line) for line in lines), lines
    owner_field = 'owner="TAT station 3 (audit)"'
    applied = [l for l in lines if f"POST {API}/resources/value/set 200 " in l and f"{station.VSET1}=321" in l]
    assert len(applied) == 1, lines
    assert f"{owner_field} fence={fence} outcome=applied" in applied[0], applied[0]
    listed = [l for l in lines if f"POST {API}/resources/values/set 200 " in l]
    assert listed and f"fence={fence} outcome=applied" in listed[-1], lines
    assert f"{station.ON1}=False" in listed[-1], listed[-1]
    refusals = [l for l in lines if f"POST {API}/resources/value/set 423 " in l and f"{station.VSET1}=999" in l]
    assert len(refusals) == 1, lines
    assert refusals[0].endswith(f"owner=- fence=- outcome=refused asked={station.VSET1}=999"), refusals[0]
    # The lease's own events, named by owner and fence; never the lease id.
    assert any(" LEASE taken - - " in l and f"{owner_field} fence={fence}" in l for l in lines), lines
    after = holder.audit.get_audit_log(tail=20)
    assert any(" LEASE released - - " in l and f"fence={fence}" in l for l in after), after
    assert all(holder.lease.held_lease_id is None or holder.lease.held_lease_id not in l for l in after)


def test_tail_counts_lines_and_zero_is_the_whole_file(client: AccordionQ2Client, gateway_url: str) -> None:
    for _ in range(3):
        client.application.get_status()
    one = client.audit.get_audit_log(tail=1)
    assert len(one) == 1 and LINE.match(one[0]), one
    five = client.audit.get_audit_log(tail=5)
    assert len(five) == 5, five
    default = client.audit.get_audit_log()
    whole = client.audit.get_audit_log(tail=0)
    assert len(default) == 100 if len(whole) > 101 else len(default) == len(whole) - 1, (len(default), len(whole))
    assert len(whole) >= len(five)
    # The reads before were answered before the log was read: they are in it.
    assert f"GET {API}/audit/log 200 " in whole[-1], whole[-1]
    bad = raw_request(gateway_url, "GET", "api/audit/log?tail=-1")
    assert bad.status == 400
    assert "tail" in json.loads(bad.body)["error"]


def test_reading_the_trail_needs_admin_and_names_key_callers(
    gateway_factory: Callable[..., object], tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    audit = tmp_path / "audit"
    config.write_text(
        "[access]\n"
        'keys = [{ key = "control-key-0123456789", role = "control", name = "bench 3" },\n'
        '        { key = "admin-key-0123456789", role = "admin" }]\n'
        f'[audit]\ndir = "{audit}"\n'
    )
    gateway = gateway_factory("--config", str(config), wait_connected=False)
    # /readyz is open whatever the access control: wait until the station is reached.
    wait_for(lambda: raw_request(gateway.url, "GET", "readyz").status == 200, 30, "the gateway to be ready")
    control = AccordionQ2Client(gateway.url, timeout=10, default_headers={"X-Api-Key": "control-key-0123456789"})
    admin = AccordionQ2Client(gateway.url, timeout=10, default_headers={"X-Api-Key": "admin-key-0123456789"})
    try:
        control.resources.set_value(station.VSET1, "12")
        with pytest.raises(AccordionQ2ApiError) as forbidden:
            control.audit.get_audit_log()
        assert forbidden.value.status_code == 403
        lines = admin.audit.get_audit_log(tail=0)
        write = [l for l in lines if f"{station.VSET1}=12" in l]
        assert write and 'caller="bench 3" owner=- fence=- outcome=applied' in write[0], lines
        # Changes are kept apart from reads, in changes.log with a rotation of its own.
        changes = (audit / "changes.log").read_text().splitlines()
        assert write[0] in changes
        reads = (audit / "audit.log").read_text().splitlines()
        assert not any(f"{station.VSET1}=12" in l for l in reads), reads
        assert not any("key-0123456789" in l for l in changes + reads)
        control.resources.set_value(station.VSET1, "0")
    finally:
        control.close()
        admin.close()

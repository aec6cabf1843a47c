"""Errors a user sees: status and a readable message, never a 500."""

from __future__ import annotations

import json
from urllib.parse import urlparse

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client

import station
from station import parse_status, raw_exchange, raw_request

ONE_MIB = 1024 * 1024


def api_error(call, *args, **kwargs) -> AccordionQ2ApiError:
    with pytest.raises(AccordionQ2ApiError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_unknown_resource_is_404_naming_it(client: AccordionQ2Client) -> None:
    r = client.resources
    for error in (
        api_error(r.get_value, "No.Such.Channel"),
        api_error(r.set_value, "No.Such.Channel", "1"),
        api_error(r.transact, "No.Such.Channel", "1"),
        api_error(r.get_values, [station.MON_3V3, "No.Such.Channel"]),
        api_error(r.get_values, ["No.Such.Channel"], max_age_ms=1000),
        api_error(r.set_values, {"No.Such.Channel": "1"}),
    ):
        assert error.status_code == 404, repr(error)
        assert str(error) == "no such resource: \"No.Such.Channel\"", repr(error)


def test_bad_value_is_400_naming_the_channel(client: AccordionQ2Client) -> None:
    error = api_error(client.resources.set_value, station.VSET1, "abc")
    assert error.status_code == 400
    assert station.VSET1 in str(error)
    assert "abc" in str(error)

    error = api_error(client.resources.set_value, station.ON1, "maybe")
    assert error.status_code == 400
    assert station.ON1 in str(error)

    error = api_error(client.resources.set_value, station.LED_A1, "Plaid")
    assert error.status_code == 400
    assert station.LED_A1 in str(error) and "Plaid" in str(error)


def test_out_of_range_is_400_with_the_station_message(client: AccordionQ2Client) -> None:
    before = client.resources.get_value(station.VSET1)
    error = api_error(client.resources.set_value, station.VSET1, "5000")
    assert error.status_code == 400
    message = str(error)
    assert station.VSET1 in message and "5000" in message and "3000" in message, message
    assert client.resources.get_value(station.VSET1) == before, "an out-of-range value was applied"

    error = api_error(client.resources.set_value, station.VSET1, "-1")
    assert error.status_code == 400 and "3000" in str(error)


def test_writing_a_read_only_channel_is_400(client: AccordionQ2Client) -> None:
    for name in (station.MON_3V3, station.VMON1, station.FIRMWARE_REV):
        error = api_error(client.resources.set_value, name, "1")
        assert error.status_code == 400, repr(error)
        assert name in str(error) and "read only" in str(error), repr(error)


def test_set_values_with_one_bad_value_applies_none(client: AccordionQ2Client) -> None:
    client.resources.set_value(station.VSET2, "3")
    error = api_error(client.resources.set_values, {station.VSET2: "4", station.VSET3: "abc"})
    assert error.status_code == 400
    assert station.VSET3 in str(error)
    assert float(client.resources.get_value(station.VSET2)) == pytest.approx(3.0), (
        "set_values refused but applied part of it silently"
    )
    # Refused by the station for one channel only: the answer says exactly what was applied.
    try:
        error = api_error(client.resources.set_values, {station.VSET2: "4", station.VSET3: "9999"})
        assert error.status_code == 400
        message = str(error)
        assert message.count(station.VSET3) == 1 and "9999" in message and "3000" in message, message
        applied = float(client.resources.get_value(station.VSET2)) == 4.0
        if applied:
            assert "applied" in message and station.VSET2 in message, f"VSET2 was applied silently: {message}"
    finally:
        client.resources.set_value(station.VSET2, "0")


def test_unknown_endpoint_is_404_json(gateway_url: str) -> None:
    for method, path in (("GET", "api/no/such/endpoint"), ("POST", "api/resources/nope"), ("GET", "nothing-here")):
        answer = raw_request(gateway_url, method, path, body="{}" if method == "POST" else None)
        assert answer.status == 404, answer
        assert answer.headers["content-type"].startswith("application/json"), answer.headers
        assert path.split("/")[-1] in answer.error, answer


def test_wrong_method_is_a_json_error(gateway_url: str) -> None:
    answer = raw_request(gateway_url, "GET", "api/resources/value/get")
    assert answer.status == 405, answer
    assert answer.error


def test_bad_json_is_400(gateway_url: str) -> None:
    answer = raw_request(gateway_url, "POST", "api/resources/value/get", '{"Name": ')
    assert answer.status == 400, answer
    assert "JSON" in answer.error


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("api/resources/value/get", {}, "Name"),
        ("api/resources/value/get", {"Name": 5}, "Name"),
        ("api/resources/value/set", {"Name": station.VSET1}, "Value"),
        ("api/resources/value/set", {"Value": "1"}, "Name"),
        ("api/resources/values/get", {}, "Names"),
        ("api/resources/values/get", {"Names": station.MON_3V3}, "Names"),
        ("api/resources/values/get", {"Names": [1, 2]}, "Names"),
        ("api/resources/values/get", {"Names": [station.MON_3V3], "MaxAgeMs": -1}, "MaxAgeMs"),
        ("api/resources/values/get", {"Names": [station.MON_3V3], "MaxAgeMs": "soon"}, "MaxAgeMs"),
        ("api/resources/values/set", {}, "Resources"),
        ("api/resources/values/set", {"Resources": [station.VSET1]}, "Resources"),
        ("api/resources/transact", {"Name": station.UART}, "Value"),
    ],
)
def test_missing_or_wrong_field_is_400_naming_it(gateway_url: str, path: str, body: dict, field: str) -> None:
    answer = raw_request(gateway_url, "POST", path, json.dumps(body))
    assert answer.status == 400, answer
    assert field in answer.error, answer


@pytest.mark.parametrize(
    "path",
    [
        "api/resources/value/get", "api/resources/value/set", "api/resources/values/get",
        "api/resources/values/set", "api/resources/transact", "api/channels/channel",
    ],
)
@pytest.mark.parametrize(
    "body",
    ["null", "[]", '"text"', "42", '{"Name": null}', '{"Name": {}}', '{"Names": null}',
     '{"Resources": {"%s": null}}' % station.VSET1, '{"Alias": 3}', "\x00\xff", "{}"],
)
def test_a_client_mistake_is_never_a_500(gateway_url: str, path: str, body: str) -> None:
    answer = raw_request(gateway_url, "POST", path, body)
    assert 400 <= answer.status < 500, answer
    assert answer.error


def split_base(gateway_url: str) -> tuple[str, str]:
    """The base URL's host and port, and its path (a station's `/stations/ID`, or empty)."""
    parsed = urlparse(gateway_url)
    return parsed.netloc, parsed.path.rstrip("/")


def test_body_over_one_mib_is_413(gateway_url: str) -> None:
    body = json.dumps({"Name": "x" * (ONE_MIB + 100)}).encode()
    host, base = split_base(gateway_url)
    request = (
        f"POST {base}/api/resources/value/get HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    status, answer = parse_status(raw_exchange(gateway_url, request))
    assert status == 413, answer[:300]
    assert json.loads(answer)["error"]


def test_chunked_body_over_one_mib_is_413(gateway_url: str) -> None:
    host, base = split_base(gateway_url)
    chunk = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(ONE_MIB // len(chunk) + 2))
    request = (
        f"POST {base}/api/resources/values/set HTTP/1.1\r\nHost: {host}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode() + chunks + b"0\r\n\r\n"
    status, answer = parse_status(raw_exchange(gateway_url, request))
    assert status == 413, answer[:300]


def test_a_body_just_under_the_limit_is_read(gateway_url: str) -> None:
    # A valid request padded with whitespace to just under 1 MiB is not refused for its size.
    body = json.dumps({"Name": station.MON_3V3}).encode()
    body += b" " * (ONE_MIB - len(body) - 16)
    answer = raw_request(gateway_url, "POST", "api/resources/value/get", body)
    assert answer.status == 200, answer
    assert float(answer.json()["value"]) == pytest.approx(3.3, abs=0.05)


def test_errors_leave_the_client_usable(client: AccordionQ2Client) -> None:
    for _ in range(3):
        api_error(client.resources.get_value, "No.Such.Channel")
        assert float(client.resources.get_value(station.MON_3V3)) == pytest.approx(3.3, abs=0.05)

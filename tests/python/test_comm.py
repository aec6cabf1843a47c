"""Bus transactions through accordionq2's `client.comm`: I2C, UART and SPI on the
simulated station's buses, every bad input a caller can send, the lease rule and short reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from accordionq2 import AccordionQ2ApiError, AccordionQ2Client
from accordionq2.enums import BusActions
from accordionq2.exceptions import AccordionQ2ShortReadError

from simproc import SimProcess
from station import raw_request

I2C = "0.ESH10000023.I2C09"
UART = "0.ESH10000023.UART01"
SPI = "0.ESH10000023.SPI01"
CPU_TEMP = "TempRegulator.CPU_TEMP"
EEPROM = 0x50
SENSOR = 0x48
IDN = b"Simulated Station,HV4,ESH10000662,6.4.2\n"
OWNER = "TAT station 3"


def refused(call: Callable[[], object], status: int) -> str:
    """Runs `call`, which must raise AccordionQ2ApiError with `status`; returns its message."""
    with pytest.raises(AccordionQ2ApiError) as caught:
        call()
    assert caught.value.status_code == status, f"{caught.value!r}, expected {status}"
    return str(caught.value)


def test_scan_finds_the_sensor_and_the_eeprom(client: AccordionQ2Client) -> None:
    found = client.comm.i2c(I2C, address=0, action=BusActions.SCAN)
    assert found.received == bytes([SENSOR, EEPROM]), found
    assert found.number_of_bytes_received == 2
    assert found.device_name == I2C and found.action == "Scan"


def test_eeprom_write_four_bytes_and_read_them_back(client: AccordionQ2Client) -> None:
    data = bytes([0xDE, 0xAD, 0xBE, 0xEF])
    sent = client.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND, data_to_send=bytes([0x40]) + data)
    assert sent.received == b"" and sent.number_of_bytes_received == 0
    back = client.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND_RECEIVE,
                           data_to_send=bytes([0x40]), number_of_bytes_to_receive=4)
    assert back.received == data, back
    # A plain Receive continues after them: the address pointer moved on.
    client.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND, data_to_send=bytes([0x44, 0x11]))
    client.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND, data_to_send=bytes([0x43]))
    following = client.comm.i2c(I2C, address=EEPROM, action=BusActions.RECEIVE, number_of_bytes_to_receive=2)
    assert following.received == bytes([0xEF, 0x11]), following


def test_eeprom_read_past_the_end_wraps_to_the_start(client: AccordionQ2Client) -> None:
    client.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND, data_to_send=bytes([0xFE, 0x12, 0x34]))
    start = client.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND_RECEIVE,
                            data_to_send=bytes([0x00]), number_of_bytes_to_receive=3)
    wrapped = client.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND_RECEIVE,
                              data_to_send=bytes([0xFE]), number_of_bytes_to_receive=5)
    assert wrapped.received == bytes([0x12, 0x34]) + start.received, wrapped
    # The board identity the profile put at byte 0.
    assert start.received == b"ESH", start


def test_the_temperature_sensor_reads_the_stations_cpu_temperature(client: AccordionQ2Client) -> None:
    answer = client.comm.i2c(I2C, address=SENSOR, action=BusActions.SEND_RECEIVE,
                             data_to_send=bytes([0x00]), number_of_bytes_to_receive=2)
    raw = int.from_bytes(answer.received, "big", signed=True)
    celsius = (raw >> 7) / 2
    cpu = float(client.resources.get_value(CPU_TEMP))
    assert 20.0 <= celsius <= 80.0, f"implausible {celsius} °C from {answer.received.hex()}"
    assert abs(celsius - cpu) <= 1.0, f"sensor {celsius} °C, CPU_TEMP {cpu} °C"


def test_an_absent_address_naks_as_500_naming_it(client: AccordionQ2Client) -> None:
    message = refused(lambda: client.comm.i2c(I2C, address=0x51, action=BusActions.RECEIVE,
                                              number_of_bytes_to_receive=1, max_retries=2), 500)
    assert "0x51" in message and "3 attempts" in message, message


def test_uart_idn_with_the_termination_byte_answers_at_once(client: AccordionQ2Client) -> None:
    client.comm.uart(UART, action=BusActions.CLEAR_BUFFERS)
    started = time.monotonic()
    answer = client.comm.uart(UART, action=BusActions.SEND_RECEIVE, data_to_send=b"*IDN?\n",
                              number_of_bytes_to_receive=64, use_termination_byte=True,
                              termination_byte=0x0A, timeout_ms=1000)
    took = time.monotonic() - started
    assert answer.received == IDN, answer
    assert answer.number_of_bytes_received == len(IDN)
    assert took < 0.9, f"the termination byte did not end the receive: {took:.3f} s"


def test_uart_idn_without_the_termination_byte_waits_for_the_timeout(client: AccordionQ2Client) -> None:
    client.comm.uart(UART, action=BusActions.CLEAR_BUFFERS)
    started = time.monotonic()
    answer = client.comm.uart(UART, action=BusActions.SEND_RECEIVE, data_to_send=b"*IDN?\n",
                              number_of_bytes_to_receive=64, timeout_ms=300)
    took = time.monotonic() - started
    # Fewer bytes than asked: a UART read is bounded by its timeout, and says what came.
    assert answer.received == IDN and answer.number_of_bytes_received == len(IDN), answer
    assert took >= 0.3, f"answered before the timeout: {took:.3f} s"


def test_uart_at_a_wrong_baud_rate_gives_nothing(client: AccordionQ2Client) -> None:
    client.comm.uart(UART, action=BusActions.CLEAR_BUFFERS)
    answer = client.comm.uart(UART, action=BusActions.SEND_RECEIVE, baud_rate=115200,
                              data_to_send=b"*IDN?\n", number_of_bytes_to_receive=16,
                              use_termination_byte=True, timeout_ms=200)
    assert answer.received == b"", answer


def test_spi_full_duplex_transfer_reads_the_adc(client: AccordionQ2Client) -> None:
    answer = client.comm.spi(SPI, action=BusActions.SEND_RECEIVE, data_to_send=bytes([0x01, 0, 0]),
                             number_of_bytes_to_receive=3)
    code = int.from_bytes(answer.received[1:], "big")
    assert answer.received[0] == 0 and code == 1650, answer  # 1.65 V of a 4.096 V reference
    assert answer.number_of_bytes_received == 3


def bad(gateway_url: str, path: str, body: dict) -> str:
    """POSTs `body` raw (as the clients would, or worse) and returns the 400's message."""
    answer = raw_request(gateway_url, "POST", path, json.dumps(body))
    assert answer.status == 400, f"{path} {body}: {answer}"
    return json.loads(answer.body)["error"]


@pytest.mark.parametrize("path, body, field", [
    ("api/comm/i2c", {"DeviceName": UART, "Address": "50", "Action": "Scan"}, "DeviceName"),
    ("api/comm/spi", {"DeviceName": I2C, "Action": "Receive", "NumberOfBytesToReceive": 1}, "DeviceName"),
    ("api/comm/i2c", {"DeviceName": I2C, "Address": "80", "Action": "Receive", "NumberOfBytesToReceive": 1},
     "Address"),
    ("api/comm/i2c", {"DeviceName": I2C, "Address": "50", "Action": "Send", "DataToSend": "ABC"}, "DataToSend"),
    ("api/comm/i2c", {"DeviceName": I2C, "Address": "50", "Action": "Send", "DataToSend": "XYZW"}, "DataToSend"),
    ("api/comm/i2c", {"DeviceName": I2C, "Address": "50", "Action": "Send"}, "DataToSend"),
    ("api/comm/spi", {"DeviceName": SPI, "Action": "SendReceive", "NumberOfBytesToReceive": 2}, "DataToSend"),
    ("api/comm/i2c", {"DeviceName": I2C, "Address": "50", "Action": "Receive", "NumberOfBytesToReceive": 4097},
     "NumberOfBytesToReceive"),
    ("api/comm/i2c", {"DeviceName": I2C, "Address": "50", "Action": "Fly"}, "Action"),
    ("api/comm/spi", {"DeviceName": SPI, "Action": "Scan"}, "Action"),
    ("api/comm/uart", {"DeviceName": UART, "Action": "Receive", "BaudRate": 0}, "BaudRate"),
])
def test_bad_input_is_a_400_naming_the_field(gateway_url: str, path: str, body: dict, field: str) -> None:
    message = bad(gateway_url, path, body)
    assert field in message, message


def test_bad_input_through_the_client_is_a_400_too(client: AccordionQ2Client) -> None:
    message = refused(lambda: client.comm.i2c(I2C, address=0x80, action=BusActions.RECEIVE,
                                              number_of_bytes_to_receive=1), 400)
    assert "Address" in message, message
    message = refused(lambda: client.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND), 400)
    assert "DataToSend" in message, message


def test_a_device_no_channel_is_is_404_as_the_clients_docs_answer_a_missing_channel(
        client: AccordionQ2Client) -> None:
    # The .NET client's docs/error-handling.md: "404 Not Found: Channel, resource, or config
    # file does not exist".
    message = refused(lambda: client.comm.spi("No.Such.Bus", action=BusActions.RECEIVE,
                                              number_of_bytes_to_receive=1), 404)
    assert "DeviceName" in message, message
    message = refused(lambda: client.comm.i2c("No.Such.Bus", address=0, action=BusActions.SCAN), 404)
    assert "No.Such.Bus" in message, message


def test_keys_bind_in_any_case_and_hex_in_either_case(gateway_url: str) -> None:
    answer = raw_request(gateway_url, "POST", "api/comm/i2c", json.dumps({
        "devicename": I2C, "address": "50", "action": "sendreceive", "datatosend": "0a",
        "numberofbytestoreceive": 1}))
    assert answer.status == 200, answer
    body = json.loads(answer.body)
    assert set(body) == {"deviceName", "action", "received", "numberOfBytesReceived"}, body
    assert body["action"] == "SendReceive" and body["numberOfBytesReceived"] == 1
    assert body["received"] == body["received"].upper() and len(body["received"]) == 2


def test_socket_is_404_saying_why(client: AccordionQ2Client) -> None:
    message = refused(lambda: client.comm.socket("Any", action=BusActions.SEND_RECEIVE,
                                                 host_name="127.0.0.1", port=5025,
                                                 data_to_send=b"*IDN?\n", number_of_bytes_to_receive=8), 404)
    assert "socket" in message.lower() and "byte protocol" in message, message


def test_capabilities_list_comm(client: AccordionQ2Client, gateway_url: str) -> None:
    answer = raw_request(gateway_url, "GET", "api/capabilities")
    assert "comm" in json.loads(answer.body)["features"], answer


def test_a_non_holder_is_refused_with_423_naming_the_holder_and_nothing_reaches_the_station(
        station_sim: SimProcess, gateway_factory, client_factory) -> None:
    gateway = gateway_factory("--station", station_sim.url, simulator=False)
    a, b = client_factory(gateway.url), client_factory(gateway.url)
    writes_before = station_sim.control("writes")
    with a.lease.hold(OWNER, ttl_ms=30_000):
        for call in [
            lambda: b.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND, data_to_send=bytes([0x60, 0x99])),
            lambda: b.comm.i2c(I2C, address=0, action=BusActions.SCAN),
            lambda: b.comm.uart(UART, action=BusActions.SEND_RECEIVE, data_to_send=b"*RST\n",
                                number_of_bytes_to_receive=8),
            lambda: b.comm.spi(SPI, action=BusActions.SEND_RECEIVE, data_to_send=bytes([0, 0]),
                               number_of_bytes_to_receive=2),
        ]:
            message = refused(call, 423)
            assert OWNER in message, f"the 423 does not name the holder: {message}"
        assert station_sim.control("writes") == writes_before, "a refused transaction reached the station"
        # The holder's own transaction goes out, and is in the station's write log.
        a.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND, data_to_send=bytes([0x60, 0x42]))
        log = station_sim.control("writes")
        assert f"{I2C}=6042" in log, log
        assert "6099" not in log, log


def test_a_short_read_raises_the_clients_error(station_sim: SimProcess, gateway_factory, client_factory) -> None:
    gateway = gateway_factory("--station", station_sim.url, simulator=False)
    c = client_factory(gateway.url)
    assert station_sim.control("shortread 1").startswith("ok")
    try:
        with pytest.raises(AccordionQ2ShortReadError):
            c.comm.i2c(I2C, address=EEPROM, action=BusActions.SEND_RECEIVE,
                       data_to_send=bytes([0x00]), number_of_bytes_to_receive=4)
        with pytest.raises(AccordionQ2ShortReadError):
            c.comm.spi(SPI, action=BusActions.RECEIVE, number_of_bytes_to_receive=3)
        # Reported as the station gave it: one byte, never padded.
        answer = raw_request(gateway.url, "POST", "api/comm/i2c", json.dumps({
            "DeviceName": I2C, "Address": "50", "Action": "SendReceive", "DataToSend": "00",
            "NumberOfBytesToReceive": 4}))
        body = json.loads(answer.body)
        assert answer.status == 200 and body["numberOfBytesReceived"] == 1 and body["received"] == "45", body
    finally:
        station_sim.control("shortread off")


def test_the_rest_api_pages_bus_example_runs_as_written(gateway_url: str) -> None:
    """docs/rest-api.md's example of the bus calls, run as a user would paste it (against this
    session's gateway): accordionq2 5.28.1 takes every argument it shows, `comm.uart`'s
    `use_termination_byte` included (accordionq2/comm.py)."""
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "rest-api.md"
    text = page.read_text(encoding="utf-8")
    section = text.split("## Bus transactions", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example, "docs/rest-api.md has no python example of the bus calls"
    code = example.group(1).replace('"http://127.0.0.1:5000"', repr(gateway_url))
    assert repr(gateway_url) in code, code
    namespace: dict = {}
    exec(compile(code, str(page), "exec"), namespace)  # noqa: S102 - the page's own example
    namespace["c"].close()

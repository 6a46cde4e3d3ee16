"""The device collector parses the Kineto traces it saves with orjson (doubles) and still reads
every time to the nanosecond: a three-decimal time below 2^43 us comes back exactly from its
double, and a trace with a later time is parsed again with decimals (issue 39)."""
from __future__ import annotations

import json
from decimal import Decimal

import pytest

from collectors.device import DeviceCollector
from neuron_prof.backends.device_activity import EXACT_FLOAT_US, InexactTime, read_kineto_json, trace_ns


def _trace(ts_us: str, dur_us: str) -> bytes:
    """A saved Kineto trace with one kernel at ``ts_us`` (the text Kineto writes)."""
    kernel = (f'{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {ts_us}, "dur": {dur_us}, '
              f'"args": {{"device": 0, "stream": 7, "correlation": 5}}}}')
    return f'{{"baseTimeNanoseconds": 0, "traceEvents": [{kernel}]}}'.encode()


@pytest.mark.parametrize("text", ["0.001", "1234567.891", "8796093022207.999", "3.5", "-12.345"])
def test_a_three_decimal_time_below_the_limit_is_exact_through_a_double(text):
    exact = int(json.loads(text, parse_float=Decimal) * 1000)  # the decimal time in ns, exactly
    assert trace_ns(read_kineto_json(f'{{"t": {text}}}'.encode())["t"]) == exact


def test_a_time_past_the_limit_is_refused_as_a_double():
    assert 9000000000000.123 > EXACT_FLOAT_US
    with pytest.raises(InexactTime):
        trace_ns(read_kineto_json(b'{"t": 9000000000000.123}')["t"])


@pytest.mark.parametrize("ts,ns", [("1234567.891", 1234567891), ("9000000000000.123", 9000000000000123)])
def test_the_collector_reads_a_kernel_to_the_nanosecond_either_way(ts, ns):
    """Below the limit through orjson; past it the collector parses the trace again with decimals
    (a double holds 9000000000000.123 us only to ~2 ns)."""
    tables = DeviceCollector()._tables(_trace(ts, "2.5"), "neuron", {})
    kernels = tables.kernels
    assert list(kernels["ts"]) == [ns] and list(kernels["dur"]) == [2500]
    assert list(kernels["device"]) == ["neuron:0"]

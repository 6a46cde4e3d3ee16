"""What a forked child must not inherit from its parent's capture (neuron_prof/forks.py): the
memory collector's open ``/proc/self/statm`` (the parent's, once forked) and the scalars' cached
thread id. Real forks: the child answers through a pipe."""
from __future__ import annotations

import json
import os
import threading

from neuron_prof.capture.scalars import _native_thread_id
from neuron_prof.collectors.memory import ResidentMemory

GROWTH = 256 << 20  # what the child makes resident: ~100x the few MB either process moves by itself


def _in_child(work) -> dict:
    """``work()``'s JSON answer from a forked child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        _, status = os.waitpid(pid, 0)
        data = b""
        while chunk := os.read(r, 4096):
            data += chunk
    finally:
        os.close(r)
    assert status == 0
    return json.loads(data)


def test_a_forked_child_reads_its_own_resident_memory():
    rss = ResidentMemory()
    assert rss.read() > 0  # the parent's file is open from here on

    def grow() -> dict:
        before = rss.read()
        block = bytearray(GROWTH)
        block[::4096] = b"\x01" * len(range(0, GROWTH, 4096))  # every page touched: resident
        return {"before": before, "after": rss.read()}

    child = _in_child(grow)
    # the parent's file would show the parent, which grew by nothing like this
    assert child["after"] - child["before"] >= GROWTH * 3 // 4
    rss.close()


def test_a_forked_child_names_its_own_thread():
    parent = _native_thread_id()
    assert parent == threading.get_native_id()
    child = _in_child(lambda: {"cached": _native_thread_id(), "os": threading.get_native_id(), "pid": os.getpid()})
    assert child["cached"] == child["os"] == child["pid"] != parent

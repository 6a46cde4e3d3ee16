"""Each rank's clock against rank 0's, measured NTP-style over the job's own key-value store.

Merged views put every rank on rank 0's clock. On one host all ranks read one CLOCK_MONOTONIC
and the offset is exactly 0; across hosts it is not, and it drifts. So each rank measures its
offset when its process group comes up and again when it goes down (or the capture ends):

* a rank r > 0 writes ``ping`` (its time t1), rank 0 answers ``pong`` with its own time t0 as soon
  as it sees the ping, r reads it at t2; t0 happened between t1 and t2, so rank 0's time at r's
  ``(t1 + t2) / 2`` is t0 to within ``(t2 - t1) / 2``. The round with the shortest trip wins.
* ranks also publish ``hostname|boot id``: a rank that shares rank 0's reads rank 0's clock
  (``same_clock``), whatever the estimate says.

Everything goes over a connection of our own to the job's TCPStore (the one
``init_process_group`` rendezvoused on), from a background thread: the training threads never
wait for it, and the job's own store traffic never waits behind ours. Keys live under
``neuron_prof/clock/``. Without a TCPStore (a FileStore, say) nothing is measured; the run then
says the offsets are unknown and merged views assume one clock.
"""
from __future__ import annotations

import datetime
import socket
import threading
import time
from typing import Any

ROUNDS = 8
TIMEOUT = datetime.timedelta(seconds=10)
JOIN_SECONDS = 3.0  # how long the end of a capture waits for the last measurement
PREFIX = "neuron_prof/clock"


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}|{boot}"


def tcp_address(store: Any) -> tuple[str, int] | None:
    """(host, port) of the TCPStore under a process group's store (prefix stores unwrapped)."""
    for _ in range(8):
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and isinstance(port, int) and port > 0:
            return host, port
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


class ClockSync:
    """Measures in the background; :meth:`take` hands over the rows measured so far."""

    def __init__(self, address: tuple[str, int], rank: int, world: int, generation: int) -> None:
        self.address, self.rank, self.world = address, rank, world
        self.prefix = f"{PREFIX}/{generation}"
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._store = None
        self.error: str | None = None

    def measure(self, phase: str) -> None:
        """Start one measurement (``start`` or ``end``) in a daemon thread."""
        t = threading.Thread(target=self._run, args=(phase,), name=f"neuron_prof clock {phase}", daemon=True)
        self._threads.append(t)
        t.start()

    def wait(self, seconds: float = JOIN_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    # ---- internals
    def _connect(self):
        if self._store is None:
            from torch.distributed import TCPStore
            host, port = self.address
            self._store = TCPStore(host, port, is_master=False, timeout=TIMEOUT, wait_for_workers=False)
        return self._store

    def _run(self, phase: str) -> None:
        try:
            store = self._connect()
            key = f"{self.prefix}/{phase}"
            me = _host_id()
            store.set(f"{key}/host/{self.rank}", me)
            if self.rank == 0:
                now = time.monotonic_ns()
                self._keep(now, 0, 0, True, phase)
                self._answer(store, key)
                return
            best: tuple[int, int, int] | None = None
            for k in range(ROUNDS):
                t1 = time.monotonic_ns()
                store.set(f"{key}/ping/{self.rank}/{k}", str(t1))
                t0 = int(store.get(f"{key}/pong/{self.rank}/{k}"))
                t2 = time.monotonic_ns()
                if best is None or t2 - t1 < best[2]:
                    best = ((t1 + t2) // 2, t0 - (t1 + t2) // 2, t2 - t1)
            same = store.get(f"{key}/host/0").decode() == me
            self._keep(best[0], best[1], best[2], same, phase)
        except Exception as exc:  # noqa: BLE001 - a clock we cannot read must not break training
            self.error = f"{phase}: {type(exc).__name__}: {exc}"

    def _answer(self, store, key: str) -> None:
        """Rank 0: answer every other rank's pings, rank after rank (a rank that never pings
        costs one timeout, and the others go on)."""
        for r in range(1, self.world):
            for k in range(ROUNDS):
                try:
                    store.wait([f"{key}/ping/{r}/{k}"], TIMEOUT)
                except Exception:  # noqa: BLE001 - that rank is gone or late: the next one
                    break
                store.set(f"{key}/pong/{r}/{k}", str(time.monotonic_ns()))

    def _keep(self, ts: int, offset: int, rtt: int, same: bool, phase: str) -> None:
        with self._lock:
            self._rows.append({"ts": ts, "offset": offset, "rtt": rtt, "same_clock": same, "phase": phase})

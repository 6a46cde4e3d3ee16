"""Seeded mutation fuzzer over captured runs and exported traces: every reader either answers
correctly or fails with the project's one line (exit 2) naming a file; never a traceback, a
signal, a hang or an exhausted memory.

    python benchmarks/fuzz_runs.py --cases 2000 --seed 1 [--run DIR ...] [--jobs 2]
    python benchmarks/fuzz_runs.py --seed 1 --case 417 --run DIR     # replay one case
    python benchmarks/fuzz_runs.py --cases 2000 --resign --fork      # checksums recomputed, forked readers

Why a mutation loop of our own: runs travel (copied, attached to bug reports, half-written by a
killed job), and the damage that matters is structural (a cut at a batch boundary, a FIFO where a
table was, a manifest value of the wrong type), which a seeded ``random.Random`` reaches directly
and reproducibly: case ``i`` of seed ``S`` is always the same mutation of the same base run.

Each case copies a base run (or its trace) to a fresh folder, applies one or two mutations, and
runs the real CLI in subprocesses (``report``, ``report --json``, ``export``, a ``load`` summary;
``inspect`` for traces) under a time and an address-space limit. A case whose mutation cannot
change what is committed (``expect == "same"``: bytes of a table within its committed size, an
extra file, a cut past the commit) must give the unmutated run's exact output or exit 2: with a
per-commit checksum in the manifest any silent change is an error.

``--resign`` recomputes every checksum after the mutations (each manifest's last commit, signed
again, and run.json's), as whoever built a hostile run would: the damage then passes the checksum
check and reaches the parsers behind it (Arrow schemas and batches, interned ids, JSON fields), and
adds ``schema flip``, a byte of a table's schema message. Any answer is then allowed but a
traceback, a signal, a hang or exhausted memory. ``--fork`` runs the readers in processes forked
from one that imported neuron_prof once (:class:`Zygote`): the same checks, a few times faster,
since a reader's time is mostly its imports.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

TIME_LIMIT_S = 60
MEMORY_LIMIT = 3 << 30
FILE_LIMIT = 1 << 30
ERROR_PREFIX = "neuron-prof: error: "
IS_ROOT = os.geteuid() == 0
LIMIT = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT}))\n"
"""Set first thing in each reader process (a ``preexec_fn`` is unsafe with the pool's threads)."""
CLI = LIMIT + "import runpy\nrunpy.run_module('neuron_prof', run_name='__main__', alter_sys=True)\n"
"""``python -m neuron_prof ARGS`` under the memory limit."""
LOAD_SUMMARY = LIMIT + """\
import sys
import neuron_prof
from neuron_prof.errors import NeuronProfError
try:
    run = neuron_prof.load(sys.argv[1])
    print(run.ranks)
    for name in ("steps", "ops", "marks", "spans", "threads", "compiles", "memory_events", "process_memory",
                 "memory_tensors", "failures", "health", "conflicts", "collectives", "collective_groups",
                 "clock_sync"):
        df = getattr(run, name)
        print(name, len(df), df.select_dtypes("number").sum().sum())
except NeuronProfError as exc:
    print(f"neuron-prof: error: {exc}", file=sys.stderr)
    sys.exit(2)
"""
HOSTILE_VALUES: list[Any] = [1, -1, 0, "x", "", None, True, 10 ** 30, -(10 ** 30), float("inf"), float("-inf"),
                             float("nan"), 1.5, [], [1, "x"], {}, {"a": None}]


@dataclass
class Case:
    """One mutated copy of a base run or trace, and what a correct reader may answer."""
    seed: int
    index: int
    target: Path                  # the mutated run directory or trace file
    kind: str
    detail: list[str] = field(default_factory=list)
    expect: str = "any"           # "same": the unmutated output or exit 2; "error": exit 2 only
    base: Path | None = None      # the base run mutated (None for a trace)
    resigned: bool = False        # checksums recomputed after the mutations (``--resign``)

    @property
    def reproducer(self) -> str:
        resign = " --resign" if self.resigned else ""
        return f"--seed {self.seed} --case {self.index}{resign}  ({self.kind}: {'; '.join(self.detail)})"


# ---------------------------------------------------------------------------- run mutations
def _files(run: Path, pattern: str = "**/*") -> list[Path]:
    return sorted(p for p in run.glob(pattern) if p.is_file() and not p.is_symlink())


def _commits(rank_dir: Path) -> list[dict[str, Any]]:
    """A rank folder's manifest lines (none if it has none, or a mutation already damaged it)."""
    try:
        return [json.loads(line) for line in (rank_dir / "manifest.jsonl").read_text().splitlines()]
    except (OSError, ValueError):
        return []


def _committed(path: Path) -> tuple[list[int], int]:
    """Every size the manifest ever committed for a table file, and the last (0 for other files)."""
    section = {".arrows": "sizes", ".journal": "journal"}.get(path.suffix)
    sizes = [c.get(section, {}).get(path.stem, 0) for c in _commits(path.parent)] if section else []
    sizes = [s for s in sizes if isinstance(s, int)]
    return sorted(set(sizes)), sizes[-1] if sizes else 0


def _message_boundaries(data: bytes) -> list[int]:
    """Offsets where Arrow IPC messages start (and the end of the last complete one)."""
    import pyarrow as pa
    reader = pa.BufferReader(data)
    messages = pa.ipc.MessageReader.open_stream(reader)
    bounds = [0]
    while True:
        try:
            messages.read_next_message()
        except (StopIteration, pa.ArrowInvalid, OSError):
            return bounds
        bounds.append(reader.tell())


def truncate(rng: random.Random, case: Case) -> None:
    path = rng.choice([p for p in _files(case.target) if p.stat().st_size])
    data = path.read_bytes()
    sizes, committed = _committed(path)
    boundaries = set(sizes)
    if path.suffix == ".arrows":
        boundaries.update(_message_boundaries(data))
    boundaries.discard(len(data))
    at = rng.choice(sorted(boundaries)) if boundaries and rng.random() < 0.6 else rng.randrange(len(data))
    path.write_bytes(data[:at])
    if path.suffix in (".arrows", ".journal"):
        case.expect = "same" if at >= committed else "error"
    case.detail.append(f"truncate {path.relative_to(case.target)} at {at} of {len(data)} (committed {committed})")


def flip(rng: random.Random, case: Case) -> None:
    path = rng.choice([p for p in _files(case.target) if p.stat().st_size])
    data = bytearray(path.read_bytes())
    at, xor = rng.randrange(len(data)), rng.randrange(1, 256)
    data[at] ^= xor
    path.write_bytes(bytes(data))
    if path.suffix in (".arrows", ".journal"):
        case.expect = "same"   # within the commit: the checksum's job; past it: ignored bytes
    case.detail.append(f"flip {path.relative_to(case.target)} byte {at} ^ {xor:#x}")


def _json_targets(run: Path) -> list[Path]:
    return [p for p in _files(run) if p.suffix in (".json", ".jsonl")]


def _mutate_value(rng: random.Random, obj: Any, trail: str) -> tuple[Any, str]:
    """``obj`` with one value somewhere in it replaced by a hostile one."""
    if isinstance(obj, dict) and obj and rng.random() < 0.8:
        key = rng.choice(sorted(obj))
        obj[key], where = _mutate_value(rng, obj[key], f"{trail}.{key}")
        return obj, where
    if isinstance(obj, list) and obj and rng.random() < 0.5:
        i = rng.randrange(len(obj))
        obj[i], where = _mutate_value(rng, obj[i], f"{trail}[{i}]")
        return obj, where
    value = rng.choice(HOSTILE_VALUES + [[obj]])
    return value, f"{trail} = {json.dumps(value)[:40]}"


def json_value(rng: random.Random, case: Case) -> None:
    path = rng.choice(_json_targets(case.target))
    lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
    i = len(lines) - 1 if rng.random() < 0.7 else rng.randrange(len(lines))  # the last commit is read
    mutated, where = _mutate_value(rng, json.loads(lines[i]), "")
    lines[i] = json.dumps(mutated)
    path.write_text("\n".join(lines) + "\n")
    case.detail.append(f"{path.relative_to(case.target)} line {i}: {where}")


def json_shape(rng: random.Random, case: Case) -> None:
    """Whole-document damage: 100k-deep nesting, non-UTF-8 bytes, a list for the object."""
    path = rng.choice(_json_targets(case.target))
    how = rng.choice(["deep", "non-utf8", "list", "empty", "duplicate keys"])
    data = path.read_bytes()
    new = {"deep": b"[" * 100_000 + b"]" * 100_000, "non-utf8": data[: len(data) // 2] + b"\xff\xfe\xc3" + data[len(data) // 2:],
           "list": b"[" + data.strip().replace(b"\n", b",") + b"]", "empty": b"",
           "duplicate keys": data.replace(b"{", b'{"rank": "x", "sizes": null, ', 1)}[how]
    path.write_bytes(new)
    case.detail.append(f"{path.relative_to(case.target)}: {how}")


def conflict_note(rng: random.Random, case: Case) -> None:
    """A conflict note for this run (as a refused process leaves one), then a hostile value in it."""
    try:  # a first mutation may have left anything there (a link to /dev/zero: read without end)
        run_id = json.loads(_regular(case.target / "rank-00000" / "rank.json") or b"")["run_id"]
    except (ValueError, RecursionError, TypeError, KeyError):
        run_id = "unknown"
    note = {"run_id": run_id, "rank": 0, "pid": 4242, "hostname": "h", "argv": ["python", "t.py"],
            "time_ns": 1, "holder_pid": 1, "holder_hostname": "h", "live": True}
    note, where = _mutate_value(rng, note, "")
    if isinstance(note, dict):
        note["run_id"] = run_id
    (case.target / "rank-00000.conflict-4242.json").write_text(json.dumps(note))
    case.detail.append(f"conflict note {where}")


def _table(rng: random.Random, case: Case) -> Path:
    return rng.choice([p for p in _files(case.target, "rank-*/*.arrows")])


def files(rng: random.Random, case: Case) -> None:
    how = rng.choice(["missing", "extra", "extra rank", "duplicate rank", "dir for table", "unreadable",
                      "missing rank.json", "missing manifest", "missing run.json"])
    rank0 = case.target / "rank-00000"
    if how == "unreadable" and IS_ROOT:
        how = "extra"   # root reads a mode-000 file anyway: nothing to test
    if how == "missing":
        path = _table(rng, case)
        path.unlink()
    elif how == "extra":
        path = rng.choice([case.target, rank0]) / rng.choice(["notes.txt", "ops.arrows.bak", "zz.arrows"])
        path.write_bytes(os.urandom(64))
        case.expect = "same"
    elif how == "extra rank":
        path = case.target / "rank-00007"
        path.mkdir()
        (path / "rank.json").write_text("{}")
    elif how == "duplicate rank":   # a copy of rank 0 that claims to be rank 0 (or another)
        ranks = sorted(case.target.glob("rank-*"))
        path = case.target / f"rank-{len(ranks):05d}"
        shutil.copytree(rank0, path, symlinks=True)  # as links: a copy through one to /dev/zero fills a disk
    elif how == "dir for table":
        path = _table(rng, case)
        path.unlink()
        path.mkdir()
    elif how == "unreadable":
        path = _table(rng, case)
        path.chmod(0)
    else:
        path = {"missing rank.json": rank0 / "rank.json", "missing manifest": rank0 / "manifest.jsonl",
                "missing run.json": case.target / "run.json"}[how]
        path.unlink()
    case.detail.append(f"{how}: {path.relative_to(case.target)}")


def special(rng: random.Random, case: Case) -> None:
    """A FIFO, a socket, or a symlink (to a device, a file outside the run, a directory) in
    place of one of the run's files."""
    path = rng.choice(_files(case.target))
    how = rng.choice(["fifo", "socket", "/dev/zero", "/dev/urandom", "outside file", "directory", "dangling"])
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "socket":
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(str(path))
        except OSError:   # a path too long for sun_path: a FIFO is the same test
            os.mkfifo(path)
            how = "fifo"
        finally:
            sock.close()
    else:
        outside = case.target.parent / "outside.bin"
        outside.write_bytes(os.urandom(4096))
        os.symlink({"/dev/zero": "/dev/zero", "/dev/urandom": "/dev/urandom", "outside file": str(outside),
                    "directory": "/", "dangling": str(case.target / "nowhere")}[how], path)
    case.detail.append(f"{how} in place of {path.relative_to(case.target)}")


def schema_flip(rng: random.Random, case: Case) -> None:
    """A byte of a table's schema message (its column names, types, metadata) flipped: with the
    checksums recomputed, what the reader's schema check alone must catch."""
    path = rng.choice([p for p in _files(case.target, "rank-*/*.arrows") if p.stat().st_size])
    data = bytearray(path.read_bytes())
    bounds = _message_boundaries(bytes(data))
    at, xor = rng.randrange(bounds[1] if len(bounds) > 1 else len(data)), rng.randrange(1, 256)
    data[at] ^= xor
    path.write_bytes(bytes(data))
    case.detail.append(f"schema flip {path.relative_to(case.target)} byte {at} ^ {xor:#x}")


RUN_MUTATIONS: dict[str, Callable[[random.Random, Case], None]] = {
    "truncate": truncate, "flip": flip, "json value": json_value, "json shape": json_shape,
    "conflict note": conflict_note, "files": files, "special file": special,
}
RESIGNED_MUTATIONS = {**RUN_MUTATIONS, "schema flip": schema_flip}


def _regular(path: Path) -> bytes | None:
    """``path``'s bytes if it is a regular file this process may read (a mutation may have put a
    FIFO, a link or a mode-000 file there)."""
    try:
        return path.read_bytes() if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def resign(run: Path) -> None:
    """Recompute the checksums of a mutated run as a forger would: each rank's last commit gets the
    CRC-32 of what its streams and journals now hold up to the committed size (or their end, if
    shorter), and is signed again; run.json, if signed, too. What no longer parses is left."""
    from neuron_prof.store.writer import sign
    for manifest in run.glob("rank-*/manifest.jsonl"):
        text = _regular(manifest)
        try:
            lines = text.decode().splitlines() if text else []
            line = json.loads(lines[-1]) if lines else None
        except (ValueError, RecursionError):  # not UTF-8, not JSON, 100k-deep
            continue
        if not isinstance(line, dict):
            continue
        for section, crcs, suffix in (("sizes", "crc", ".arrows"), ("journal", "journal_crc", ".journal")):
            sizes, sums = line.get(section), line.get(crcs)
            if not (isinstance(sizes, dict) and isinstance(sums, dict)):
                continue
            for name, size in sizes.items():
                data = _regular(manifest.parent / f"{name}{suffix}")
                if data is not None and type(size) is int and size >= 0:
                    sizes[name] = min(size, len(data))
                    sums[name] = zlib.crc32(data[:sizes[name]])
        lines[-1] = json.dumps(sign(line))
        manifest.write_text("\n".join(lines) + "\n")
    text = _regular(run / "run.json")
    try:
        meta = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return
    if isinstance(meta, dict) and "check" in meta:
        (run / "run.json").write_text(json.dumps(sign(meta)))


# ---------------------------------------------------------------------------- trace mutations
def _packet_boundaries(data: bytes) -> list[int]:
    from neuron_prof.export.check import iter_packets
    return [off for off, _ in iter_packets(data)]


TRACE_MUTATIONS = ["cut at packet", "cut anywhere", "flip", "empty", "gzip cut", "gzip flip", "not a trace",
                   "fifo", "/dev/zero"]


def trace_mutation(rng: random.Random, case: Case, how: str) -> None:
    """One damage to an exported trace; every one but a flip must be reported (exit 2)."""
    import gzip
    path = case.target
    zipped = path.suffix == ".gz"   # damage the trace inside a whole gzip stream, or the stream itself
    data = gzip.decompress(path.read_bytes()) if zipped else path.read_bytes()
    case.expect = "error"
    wrap = (lambda b: gzip.compress(b, mtime=0)) if zipped else bytes
    if how == "cut at packet":
        at = rng.choice(_packet_boundaries(data)[1:])
        path.write_bytes(wrap(data[:at]))
    elif how == "cut anywhere":
        at = rng.randrange(len(data))
        path.write_bytes(wrap(data[:at]))
    elif how == "flip":   # may leave a valid trace with another number: exit 0 is allowed
        at = rng.randrange(len(data))
        path.write_bytes(wrap(data[:at] + bytes([data[at] ^ rng.randrange(1, 256)]) + data[at + 1:]))
        case.expect = "any"
    elif how == "empty":
        path.write_bytes(rng.choice([b"", gzip.compress(b"")]))
        at = 0
    elif how.startswith("gzip"):
        gz = gzip.compress(data, mtime=0)
        at = rng.randrange(10, len(gz))   # past the header (its mtime and OS bytes are not checked)
        gz = gz[:at] if how == "gzip cut" else gz[:at] + bytes([gz[at] ^ rng.randrange(1, 256)]) + gz[at + 1:]
        path.write_bytes(gz)
    elif how == "not a trace":
        path.write_bytes(rng.choice([b"hello\n", os.urandom(rng.randrange(1, 4096)), b'{"traceEvents": [}',
                                     b"\x0a\xff\xff\xff\xff\x0f"]))
        at = 0
    else:
        path.unlink()
        if how == "fifo":
            os.mkfifo(path)
        else:
            os.symlink("/dev/zero", path)
        at = 0
    case.detail.append(f"{how} at {at} of {len(data)}")


# ---------------------------------------------------------------------------- running the readers
@dataclass
class Outcome:
    command: str
    rc: int | None               # None: killed for the time limit
    stdout: str
    stderr: str


class Zygote:
    """A process that imported neuron_prof once and forks one child per reader run: the child sets
    the memory limit and an alarm (the time limit: SIGALRM ends it), runs the command in-process
    and exits with its code; an exception it does not handle is printed as the traceback it is.
    Every module of the readers is imported before the first fork, none run (no thread started in
    the parent to be lost across a fork). One per worker thread."""

    SCRIPT = """\
import importlib, json, os, pkgutil, resource, signal, sys, traceback
import pyarrow.pandas_compat
import neuron_prof.analysis, neuron_prof.cli, neuron_prof.export, neuron_prof.store.run, neuron_prof.reports.summary.text
for package in (neuron_prof.analysis, neuron_prof.cli, neuron_prof.export, neuron_prof.reports.summary):
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
LOAD = sys.argv[1]
for job in map(json.loads, sys.stdin):
    pid = os.fork()
    if pid == 0:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (job["memory"], job["memory"]))
            signal.alarm(job["timeout"])
            for fd, name in ((1, job["scratch"] + ".out"), (2, job["scratch"] + ".err")):
                os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            sys.argv = ["neuron-prof", *job["args"]]
            if job["args"][0] == "load":
                exec(LOAD, {"__name__": "__main__"})
                code = 0
            else:
                code = neuron_prof.cli.main(job["args"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    status = os.waitpid(pid, 0)[1]
    hung = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
    print(json.dumps(None if hung else os.waitstatus_to_exitcode(status)), flush=True)
"""

    def __init__(self) -> None:
        load = LOAD_SUMMARY[len(LIMIT):].replace("sys.argv[1]", "sys.argv[2]")  # argv: neuron-prof load RUN
        self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT, load], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()

    def run(self, args: list[str], timeout: float, scratch: Path) -> Outcome:
        job = {"args": args, "timeout": max(int(timeout), 1), "memory": MEMORY_LIMIT, "scratch": str(scratch)}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:  # its imports failed: nothing to fuzz
            raise RuntimeError(f"the forking reader process ended (exit {self.proc.wait()}); see its stderr")
        rc = json.loads(line)
        out, err = (Path(f"{scratch}.{s}").read_text(errors="replace") for s in ("out", "err"))
        return Outcome(" ".join(args), rc, out, err)


def run_cli(args: list[str], timeout: float = TIME_LIMIT_S) -> Outcome:
    """One reader in a fresh process, under the time and memory limits."""
    argv = [sys.executable, "-c", LOAD_SUMMARY, *args[1:]] if args[0] == "load" else \
        [sys.executable, "-c", CLI, *args]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                             errors="replace")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return Outcome(" ".join(args), None, out, "")
    return Outcome(" ".join(args), res.returncode, res.stdout, res.stderr)


def label(args: list[str]) -> str:
    """A reader command without its paths: ``report --json``, ``export -o``."""
    return " ".join([args[0], *args[2:3]])


def commands(case: Case, out: Path) -> list[list[str]]:
    if case.base is None:
        return [["inspect", str(case.target)]]
    return [["report", str(case.target)], ["report", str(case.target), "--json"],
            ["export", str(case.target), "-o", str(out)], ["load", str(case.target)]]


def result_of(outcome: Outcome, target: Path, out: Path) -> str:
    """The answer a reader gave, with the case's own paths made comparable across copies."""
    text = outcome.stdout.replace(str(target), "RUN").replace(str(out), "OUT")
    if outcome.command.startswith("export") and outcome.rc == 0 and out.is_file():
        import hashlib
        text += hashlib.sha256(out.read_bytes()).hexdigest()
    return text


def classify(case: Case, outcome: Outcome, result: str, baseline: str | None) -> str:
    """``ok``, ``error`` (the clean one-line failure) or the failure category."""
    if outcome.rc is None:
        return "hang (time limit)"
    err = outcome.stderr
    if "MemoryError" in err or "std::bad_alloc" in err:
        return "memory exhausted"
    if outcome.rc < 0:
        return f"signal {-outcome.rc}"
    if "Traceback" in err:
        return f"traceback: {err.strip().splitlines()[-1].split(':')[0]}"
    if outcome.rc == 2:
        lines = err.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith(ERROR_PREFIX):
            return "error not one line"
        if str(case.target) not in lines[0] and str(case.target.parent) not in lines[0]:
            return "error names no file"
        return "error"
    if outcome.rc != 0:
        return f"exit {outcome.rc}"
    if case.expect == "error":
        return "accepted damage"
    if case.expect == "same" and baseline is not None and result != baseline:
        return "silent change"
    return "ok"


# ---------------------------------------------------------------------------- the loop
def make_case(seed: int, index: int, bases: list[Path], traces: list[Path], work: Path, resigned: bool = False
              ) -> Case:
    """Case ``index`` of ``seed``: always the same base, the same mutations, the same bytes
    (``resigned``: then the checksums recomputed)."""
    rng = random.Random(f"{seed}:{index}")
    mutations = RESIGNED_MUTATIONS if resigned else RUN_MUTATIONS
    kinds = (list(mutations) if bases else []) + ([f"trace: {how}" for how in TRACE_MUTATIONS] if traces else [])
    kind = kinds[index % len(kinds)]
    folder = work / f"case-{index}"
    folder.mkdir()
    if kind.startswith("trace: "):
        src = rng.choice(traces)
        case = Case(seed, index, folder / src.name, kind)
        shutil.copyfile(src, case.target)
        trace_mutation(rng, case, kind[len("trace: "):])
        return case
    base = rng.choice(bases)
    case = Case(seed, index, folder / "run", kind, base=base, resigned=resigned)
    shutil.copytree(base, case.target, symlinks=True)
    mutations[kind](rng, case)
    if rng.random() < 0.25:   # a second mutation of another kind: damage rarely comes alone
        second = rng.choice(list(mutations))
        try:
            mutations[second](rng, case)
            case.detail[-1] = f"then {second}: {case.detail[-1]}"
        except (OSError, ValueError, KeyError, IndexError, TypeError, RecursionError):  # the first took what it needs
            pass
        case.expect = "any"   # the two together may change what is committed
    if resigned:
        resign(case.target)
        case.expect = "any"   # a forged commit may commit other bytes
    return case


Runner = Callable[[list[str], float, Path], Outcome]
"""Runs one reader command with a time limit (``scratch``: a path prefix it may write to)."""


def subprocess_runner(args: list[str], timeout: float, scratch: Path) -> Outcome:
    return run_cli(args, timeout)


def baselines(bases: list[Path], work: Path, runner: Runner = subprocess_runner) -> dict[tuple[Path, str], str]:
    """Each base run's unmutated answers, read from a copy as the cases are (same path shape)."""
    found = {}
    for i, base in enumerate(bases):
        folder = work / f"base-{i}"
        folder.mkdir()
        case = Case(0, -1, folder / "run", "base", base=base)
        shutil.copytree(base, case.target)
        out = folder / "out.perfetto-trace"
        for args in commands(case, out):
            outcome = runner(args, TIME_LIMIT_S, folder / "scratch")
            assert outcome.rc == 0, (args, outcome.stderr)
            found[(base, label(args))] = result_of(outcome, case.target, out)
    return found


@dataclass
class CaseResult:
    case: Case
    verdicts: dict[str, str]     # command -> ok | error | failure category

    @property
    def failures(self) -> dict[str, str]:
        return {c: v for c, v in self.verdicts.items() if v not in ("ok", "error")}


def run_case(seed: int, index: int, bases: list[Path], traces: list[Path], work: Path,
             base_answers: dict[tuple[Path, str], str], timeout: float = TIME_LIMIT_S, resigned: bool = False,
             runner: Runner = subprocess_runner) -> CaseResult:
    case = make_case(seed, index, bases, traces, work, resigned)
    out = case.target.parent / "out.perfetto-trace"
    verdicts = {}
    for args in commands(case, out):
        outcome = runner(args, timeout, case.target.parent / "scratch")
        verdicts[label(args)] = classify(case, outcome, result_of(outcome, case.target, out),
                                         base_answers.get((case.base, label(args))))
    _make_removable(case.target.parent)
    shutil.rmtree(case.target.parent, ignore_errors=True)
    return CaseResult(case, verdicts)


def _make_removable(folder: Path) -> None:
    for p in folder.rglob("*"):
        if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) == 0:
            p.chmod(0o644)


def fuzz(bases: list[Path], traces: list[Path], seed: int, cases: range, jobs: int = 2,
         timeout: float = TIME_LIMIT_S, work: Path | None = None, progress: bool = False, resigned: bool = False,
         fork: bool = False) -> list[CaseResult]:
    """Run ``cases`` of ``seed`` against the base runs and traces, ``jobs`` at a time
    (``progress``: each failing case on stderr as it ends, for long runs; ``resigned``: checksums
    recomputed after the mutations; ``fork``: readers forked from a :class:`Zygote` per job)."""
    zygotes: list[Zygote] = []
    mine = threading.local()

    def runner(args: list[str], limit: float, scratch: Path) -> Outcome:
        if not fork:
            return run_cli(args, limit)
        if not hasattr(mine, "zygote"):
            mine.zygote = Zygote()
            zygotes.append(mine.zygote)
        return mine.zygote.run(args, limit, scratch)

    done: list[CaseResult] = []

    def one(i: int) -> CaseResult:
        result = run_case(seed, i, bases, traces, Path(tmp), answers, timeout, resigned, runner)
        done.append(result)
        if progress and result.failures:
            print(f"FAIL {result.case.reproducer}: {result.failures}", file=sys.stderr, flush=True)
        if progress and len(done) % 100 == 0:
            print(f"{len(done)} cases, {sum(bool(r.failures) for r in done)} failing", file=sys.stderr, flush=True)
        return result

    with tempfile.TemporaryDirectory(dir=work) as tmp:
        try:
            answers = baselines(bases, Path(tmp), runner)
            with ThreadPoolExecutor(jobs) as pool:
                return list(pool.map(one, cases))
        finally:
            for z in zygotes:
                z.close()


def summary_table(results: list[CaseResult]) -> str:
    """Per mutation kind: cases, reader runs answered correctly, clean errors, and each failure
    category with its count; then every failing case with its reproducer."""
    cases: Counter[str] = Counter(r.case.kind for r in results)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for r in results:
        counts[r.case.kind].update(r.verdicts.values())
    lines = [f"{'mutation kind':22} {'cases':>5} {'ok':>5} {'error':>5}  failures (reader runs)"]
    for kind in sorted(counts):
        c = counts[kind]
        bad = ", ".join(f"{v} {n}" for v, n in sorted(c.items()) if v not in ("ok", "error"))
        lines.append(f"{kind:22} {cases[kind]:>5} {c['ok']:>5} {c['error']:>5}  {bad or '-'}")
    failures = [r for r in results if r.failures]
    lines.append(f"{len(results)} cases, {len(failures)} with a failure")
    for r in failures:
        lines.append(f"  {r.case.reproducer}: " + ", ".join(f"{c} -> {v}" for c, v in r.failures.items()))
    return "\n".join(lines)


def capture_base_runs(root: Path) -> list[Path]:
    """A small real run to mutate (the transformer example, every collector), in a subprocess."""
    run = root / "transformer"
    code = ("import neuron_prof\nfrom neuron_prof.examples.train_transformer import train\n"
            f"with neuron_prof.profile({str(run)!r}, schedule=neuron_prof.schedule(wait=1, warmup=1, active=3)) as p:\n"
            "    train(6, p)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    return [run]


def export_traces(bases: list[Path], root: Path) -> list[Path]:
    traces = []
    for i, base in enumerate(bases):
        for name in ("t.perfetto-trace", "t.perfetto-trace.gz"):
            out = root / f"{i}-{name}"
            subprocess.run([sys.executable, "-m", "neuron_prof", "export", str(base), "-o", str(out)],
                           check=True, capture_output=True)
            traces.append(out)
    return traces


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case", type=int, help="replay this one case")
    ap.add_argument("--run", type=Path, action="append", help="base run (repeatable; default: capture one)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=TIME_LIMIT_S)
    ap.add_argument("--resign", action="store_true", help="recompute the checksums after each mutation")
    ap.add_argument("--fork", action="store_true", help="fork the readers from one process that imported neuron_prof")
    args = ap.parse_args()
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))  # a runaway copy fails, not the disk
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        bases = args.run or capture_base_runs(Path(tmp))
        traces = [] if args.resign else export_traces(bases, Path(tmp))  # a trace has no checksum to recompute
        cases = range(args.case, args.case + 1) if args.case is not None else range(args.cases)
        results = fuzz(bases, traces, args.seed, cases, args.jobs, args.timeout, progress=True, resigned=args.resign,
                       fork=args.fork)
    print(summary_table(results))
    print(f"{time.monotonic() - started:.0f} s, {args.jobs} jobs{', checksums recomputed' if args.resign else ''}"
          f"{', forked readers' if args.fork else ''}")
    return 1 if any(r.failures for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

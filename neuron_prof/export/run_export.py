"""A run exported to one file: a trace of every rank (Perfetto or Chrome JSON) or one rank's memory
as a PyTorch memory snapshot. ``neuron-prof export`` and the demo call it; tests and benchmarks too."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from neuron_prof.errors import NeuronProfError

__all__ = ["DEFAULT_NAME", "export_run"]

DEFAULT_NAME = {"perfetto": "trace.perfetto-trace", "chrome": "trace.json", "kineto": "kineto-trace",
                "memory-snapshot": "memory-snapshot.pickle"}
"""Format -> the file (``kineto``: the folder of one trace per rank) written in the run directory
when no output is given."""


def export_run(run_dir: Path, output: Path | None = None, fmt: str = "perfetto", rank: int | None = None,
               step: int | None = None, force: bool = False,
               progress: Callable[[str], None] = lambda phase: None) -> tuple[Path, dict]:
    """Export a run; returns the output path and what was written (used by the CLI and the demo).
    An existing output is replaced only if export wrote it, or with ``force``
    (``neuron_prof.export.output``); a link there is never written through. ``progress``: told
    each phase of a trace's writing as it begins."""
    from neuron_prof.export.output import check_destination
    from neuron_prof.store.run import load
    if fmt != "memory-snapshot" and (rank is not None or step is not None):
        raise NeuronProfError(f"--rank and --step apply to --format memory-snapshot; a {fmt} trace has every "
                              "rank and step")
    run = load(run_dir)
    out = output or run_dir / DEFAULT_NAME[fmt]
    if fmt == "kineto":  # a folder: one torch.profiler trace per rank
        from neuron_prof.export.kineto_json import check_folder, write_kineto
        if not out.parent.exists():
            raise NeuronProfError(f"{out.parent}: no such directory for the traces; create it or choose another -o")
        check_folder(out, force)
        try:
            return out, write_kineto(run, out, progress)
        except OSError as exc:
            raise NeuronProfError(f"{out}: cannot write it ({exc.strerror or exc}); choose another -o, in a folder "
                                  "this user may write to") from None
    if out.is_dir():
        raise NeuronProfError(f"{out}: is a directory; pass a file name to -o, e.g. {out / DEFAULT_NAME[fmt]}")
    if not out.parent.exists():
        what = "memory snapshot" if fmt == "memory-snapshot" else "trace"
        raise NeuronProfError(f"{out.parent}: no such directory for the {what}; create it or choose another -o")
    check_destination(out, fmt, force)
    try:
        if fmt == "memory-snapshot":
            from neuron_prof.export import memory_snapshot
            return out, memory_snapshot.write(run, out, rank, step)
        from neuron_prof.export.layout import write_run
        from neuron_prof.export.formats import open_writer
        return out, write_run(run, open_writer(out, fmt), progress)
    except OSError as exc:  # the run is read by now: this is the output's folder (no permission, disk full)
        raise NeuronProfError(f"{out}: cannot write it ({exc.strerror or exc}); choose another -o, in a folder "
                              "this user may write to") from None

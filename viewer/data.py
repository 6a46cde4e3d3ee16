"""What every page shares: which run, loaded once per process and cached by the run's mtime.

The run directory comes from ``$NEURON_PROF_RUN`` (``neuron-prof view`` sets it); it is read on
the server, so there is no upload limit. A run that grows while the viewer is open (a capture
in progress) is reloaded on the next interaction: the cache key is the newest manifest's mtime.
"""
from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from neuron_prof.errors import NeuronProfError
from neuron_prof.store.run import Run
from neuron_prof.reports.summary.sections import Summary
from neuron_prof.viewer import DIFF_ENV, RUN_ENV
from neuron_prof.viewer.text import md

__all__ = ["DIFF_ENV", "RUN_ENV", "run_path", "stamp", "load", "stored_summary", "summary", "no_data"]


def run_path() -> Path:
    """The run this viewer shows; stops the page with a one-line error if there is none."""
    raw = os.environ.get(RUN_ENV, "")
    if not raw:
        st.error(f"no run given: start the viewer with `neuron-prof view RUN` (or set ${RUN_ENV})")
        st.stop()
    return Path(raw).resolve()


def stamp(path: Path) -> float:
    """Changes whenever a rank commits more of the run (its manifest is appended to)."""
    try:
        return max([p.stat().st_mtime for p in path.glob("rank-*/manifest.jsonl")] or [path.stat().st_mtime])
    except OSError:
        return 0.0


@st.cache_resource(max_entries=4, show_spinner="loading the run ...")
def _load(path: str, mtime: float) -> Run:
    return Run(path)


def load(path: Path | None = None) -> Run:
    """The run (cached); a missing or damaged run stops the page with the reader's one-line error."""
    path = path or run_path()
    try:
        return _load(str(path), stamp(path))
    except NeuronProfError as exc:
        st.error(md(exc))  # names files of the run: shown as typed
        st.stop()


@st.cache_data(max_entries=8, show_spinner=False)
def _stored_summary(path: str, mtime: float) -> Summary | None:
    from neuron_prof.reports.stored import load_summary
    return load_summary(_load(path, mtime))


def stored_summary(path: Path | None = None) -> Summary | None:
    """The summary stored in the run if it is fresh (read, never computed: milliseconds), else
    None: a page shows what it can at once, and leaves :func:`summary` for later."""
    path = path or run_path()
    load(path)
    return _stored_summary(str(path), stamp(path))


@st.cache_data(max_entries=8, show_spinner="summarizing ...")
def _summary(path: str, mtime: float) -> Summary:
    from neuron_prof.reports.stored import run_summary
    return run_summary(_load(path, mtime))


def summary(path: Path | None = None) -> Summary:
    """``neuron_prof.reports.summary.build.summarize`` of the run (the numbers the report prints), cached: the
    summary stored in the run when it is fresh (``neuron_prof.reports.stored``), else computed
    and stored there for the next open."""
    path = path or run_path()
    load(path)  # turns a bad run into its one-line error first
    return _summary(str(path), stamp(path))


def no_data(what: str, how: str) -> None:
    """The plain message a page shows when the run has nothing for it: ``what`` may hold run text
    (a device name) and is escaped; ``how`` is the page's own Markdown."""
    st.info(f"This run has no {md(what)}. {how}")

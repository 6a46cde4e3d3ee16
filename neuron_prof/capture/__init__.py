"""Capture in a training process: ``profile()`` (the public entry point) over a ``Session`` (the
rank's capture, split by job into the step clock, windows and flushing), the schedule, always-on
sampling and its dumps, on-demand triggers, the optimizer step clock, ``mark``/``log``, the
per-step scalars, the capture buffer, writer ownership (one session per rank folder), and
``record``'s bootstrap (``bootstrap/``, started in every Python process of a recorded command).

May import: collectors, recording, backends, store.
"""

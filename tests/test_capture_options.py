"""CaptureOptions is profile()'s keyword arguments, record's flags and record's hand-over to its
bootstrap at once: the three cannot drift apart."""
from __future__ import annotations

import argparse
import dataclasses
import inspect

import neuron_prof
from neuron_prof.capture.options import DEFAULT_COLLECTORS, CaptureOptions


def test_profile_takes_the_options_as_keywords_with_their_defaults():
    params = dict(inspect.signature(neuron_prof.profile).parameters)
    assert params.pop("run_dir").default is inspect.Parameter.empty  # positional, required
    fields = {f.name: f.default for f in dataclasses.fields(CaptureOptions) if f.name != "run_dir"}
    assert {name: p.default for name, p in params.items()} == fields
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())


def _record_flags(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    CaptureOptions.add_flags(parser)  # as `neuron-prof record` adds them
    return parser.parse_args(argv)


def test_record_flags_become_the_options_and_travel_as_json():
    args = _record_flags(["-o", "out", "--schedule", "1,2,3", "--collectors", "eager,,loss", "--max-bytes", "1M",
                          "--tokens-per-step", "16"])
    options = CaptureOptions.from_flags(args, command=["python", "x.py"], run_id="abc")
    assert (options.schedule, options.collectors, options.max_bytes, options.tokens_per_step, options.mode) == (
        neuron_prof.schedule(wait=1, warmup=2, active=3), ["eager", "loss"], 1 << 20, 16.0, "detail")
    back = CaptureOptions.from_json(options.to_json(), auto_step=True, origin_ns=7)
    assert back == dataclasses.replace(options, run_dir="out", auto_step=True, origin_ns=7)


def test_record_flags_that_mean_a_default():
    args = _record_flags(["--always-on", "--hang-timeout", "0", "--max-events", "0"])
    options = CaptureOptions.from_flags(args)
    assert (options.mode, options.hang_timeout_s, options.max_events) == (
        "always-on", None, CaptureOptions().max_events)
    assert tuple(options.collectors) == DEFAULT_COLLECTORS and options.run_dir is None

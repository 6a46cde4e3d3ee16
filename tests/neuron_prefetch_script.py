"""The side-stream prefetch example (examples/stream_prefetch.py) on the emulated `neuron` device:
the compute stream waiting for the next batch too early, and where the batch is used; each captured,
beside the CPU reference. Run in a process of its own by tests/test_neuron_prefetch.py. Prints one
JSON object of facts the tests check.

    python tests/neuron_prefetch_script.py EARLY_RUN FIXED_RUN
"""
from __future__ import annotations

import json
import sys

import torch

import neuron_prof
from neuron_prof.examples import stream_prefetch
from neuron_prof.testing import neuron


def main() -> None:
    neuron.enable(launch_us=stream_prefetch.LAUNCH_US)
    torch.set_num_threads(neuron.DEVICE_THREADS)  # the device's thread count: bitwise the same reductions
    facts = {"cpu": stream_prefetch.train("cpu")}
    for name, early, path in (("early", True, sys.argv[1]), ("fixed", False, sys.argv[2])):
        with neuron_prof.profile(path) as prof:
            facts[name] = stream_prefetch.train("neuron", early=early, prof=prof)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()

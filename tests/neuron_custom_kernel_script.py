"""The example custom kernel (examples/custom_kernel.py: an RMSNorm forward and backward, each a
custom op that runs as one kernel of its own on the emulated `neuron` device), trained on the CPU,
on the device and compiled for it, captured; run in a process of its own by
tests/test_neuron_custom_kernel.py. Prints one JSON object of facts the tests check.

    python tests/neuron_custom_kernel_script.py EAGER_RUN COMPILED_RUN
"""
from __future__ import annotations

import json
import sys

import neuron_prof
from neuron_prof.examples import custom_kernel
from neuron_prof.testing import neuron


def main() -> None:
    neuron.enable()
    facts = {"cpu": custom_kernel.train("cpu"), "neuron": custom_kernel.train("neuron"),
             "compiled": custom_kernel.train("neuron", compiled=True)}
    with neuron_prof.profile(sys.argv[1]) as prof:
        facts["captured"] = custom_kernel.train("neuron", prof=prof)
    with neuron_prof.profile(sys.argv[2]) as prof:
        facts["captured_compiled"] = custom_kernel.train("neuron", compiled=True, prof=prof)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()

"""Test devices for neuron_prof: ``neuron_prof.testing.neuron`` is an emulated ``neuron``
PrivateUse1 device (see its docstring). The profiler never imports this package: tests,
benchmarks and the demo do; ``port-check --target neuron`` loads it by name, as it would load any
backend. It builds against the collectors' public backend header (``neuron_prof_backend.h``).

May import: collectors.
"""

"""Test devices for neuron_prof: ``neuron_prof.testing.neuron`` is an emulated ``neuron``
PrivateUse1 device (see its docstring). The profiler never imports this package."""

"""What a device backend is and reports, asked of PyTorch and of the backend, never of a run's
analyses: which ops it runs and which it leaves to the CPU (``op_support``, the dispatcher's
answer), an op's per-input device metadata (``op_devices``), its Kineto activity as device-table
rows (``device_activity``), and the backends port-check can register by name (``targets``: a
backend is loaded by its module name, as a real one such as torch_neuronx would be).

May import: store.
"""

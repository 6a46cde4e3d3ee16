"""Small runnable training scripts the demo, the docs and the tests use, written as a user writes
them: through the public API (the package face ``neuron_prof``), on the CPU or the emulated device.

May import: testing.
"""

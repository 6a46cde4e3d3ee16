"""A run written for other tools: a Perfetto or Chrome JSON trace (``layout*`` decide what goes
where, ``writer`` and the writers turn columns into a file), Kineto JSON, a PyTorch memory
snapshot for memory_viz, and the strict Perfetto trace checker (``check``, ``inspect``) every
trace the tests write passes.

May import: analysis, backends, store.
"""

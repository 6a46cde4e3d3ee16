"""Pure DataFrame functions over a run's tables, one module per question (steps, ops, sync,
compile, memory, device, collectives, stragglers, FLOPs, porting, comparison ...), and the facade
that owns their caches (``run_analysis.RunAnalysis``): pandas in, pandas or typed rows out. No
display limits, no rendering, no files.

May import: backends, store.
"""

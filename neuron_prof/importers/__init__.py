"""Runs made from other tools' files: a torch.profiler / Kineto trace (``kineto``) and a
TORCH_TRACE compile log folder (``torch_trace``), written into the same tables a capture writes
(``imported``: the new run they share), so every analysis, report and export reads them alike.

May import: collectors (the compiler collector's parsing of dynamo's messages), recording, backends, store.
"""

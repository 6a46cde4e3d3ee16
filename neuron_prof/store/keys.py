"""One int64 per compound key: joins, sorts and groupings over (rank, x) pairs done with numpy
on one column instead of pandas on two.

Each kind of key has its own bit layout, sized for what its second part can hold; every table
and analysis that builds one calls the function here, so two keys of one kind always agree:

============  ==================================  =====================================
key           high bits                           low bits
============  ==================================  =====================================
thread_key    rank (bits 40-62: up to 2^23 ranks)  tid masked to 40 bits (an OS thread id:
                                                   Linux's are below 2^22)
step_key      rank (bits 32-62)                    step + 1 (32 bits: steps -1 to 2^32 - 2;
                                                   -1 is "before the first step")
backend_key   rank (bits 44-62: up to 2^19 ranks)  a device backend's enqueue or kernel id
                                                   (44 bits: unique within its process)
============  ==================================  =====================================

Pure numpy; no pandas, no analysis: the table layer (``run``) and the analyses both use it.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

THREAD_BITS = 40
STEP_BITS = 32
BACKEND_ID_BITS = 44


def thread_key(rank: ArrayLike, tid: ArrayLike) -> np.ndarray:
    """One int64 per (rank, OS thread): tids repeat across ranks (processes, often hosts)."""
    return (np.asarray(rank, dtype=np.int64) << THREAD_BITS) | (np.asarray(tid, dtype=np.int64)
                                                                & ((1 << THREAD_BITS) - 1))


def thread_key_parts(key: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(rank, tid) of ``thread_key`` values."""
    key = np.asarray(key, dtype=np.int64)
    return key >> THREAD_BITS, key & ((1 << THREAD_BITS) - 1)


def step_key(rank: ArrayLike, step: ArrayLike) -> np.ndarray:
    """One int64 per (rank, step), step -1 (before the first step) included: steps are numbered
    per rank, so step 3 of rank 0 and step 3 of rank 1 are different rows of ``Run.steps``."""
    return (np.asarray(rank, dtype=np.int64) << STEP_BITS) + (np.asarray(step, dtype=np.int64) + 1)


def step_key_parts(key: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(rank, step) of ``step_key`` values."""
    key = np.asarray(key, dtype=np.int64)
    return key >> STEP_BITS, (key & ((1 << STEP_BITS) - 1)) - 1


def backend_key(rank: ArrayLike, ids: ArrayLike) -> np.ndarray:
    """One int64 per (rank, backend id): a device backend numbers its enqueues and kernels per
    process, so the ids of two ranks collide."""
    return (np.asarray(rank, dtype=np.int64) << BACKEND_ID_BITS) + np.asarray(ids, dtype=np.int64)

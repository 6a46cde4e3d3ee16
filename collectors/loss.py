"""Each step's loss with no code change: the scalar ``backward()`` is called on.

Practically every training loop calls ``loss.backward()`` (Hugging Face's Trainer and Accelerate,
Lightning, a GradScaler's ``scaler.scale(loss).backward()``: there the scaled loss), and
``Tensor.backward`` calls ``torch.autograd.backward``, which this collector wraps. A one-element
root on the host is read as it is handed over (a host tensor's value is there already: reading it
waits for nothing, and nothing of it is kept); one on a device is handed to the Recorder detached
from its graph (so holding it keeps nothing of the graph alive) and read at a step boundary, never
inside the step (neuron_prof.capture.scalars). A step with gradient accumulation has one ``loss``
row per ``backward()``.

Neither the wrapper nor its own work ever becomes a Dynamo frame (``skip_frames``): a training
step compiled whole graph-breaks at ``loss.backward()`` and runs it in a resumed frame, whose
callees Dynamo would otherwise compile. What torch's backward calls (a user's backward hooks) is
treated as without the wrapper.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.autograd

from neuron_prof.collectors._hookguard import HookGuard
from neuron_prof.recording.api import Recorder
from neuron_prof.recording.torchhooks import skip_frames, without_ops

LOSS = "loss"


class LossCollector:
    name = "loss"

    def __init__(self) -> None:
        self._original: Any = None
        self._wrapper: Any = None
        self._guard = HookGuard(self.name)  # losses that could not be recorded (capture health)

    def install(self, rec: Recorder) -> None:
        original = torch.autograd.backward
        tensor = torch.Tensor
        detach = torch.Tensor.detach
        scalar = rec.scalar
        self._guard.attach(rec)
        lost = self._guard.lost

        def record(root: torch.Tensor) -> None:
            try:
                if type(root) is not tensor:
                    # a subclass's (DTensor...) detach goes through its own dispatch, as an op of
                    # ours, not the user's
                    scalar(LOSS, without_ops(detach, root))
                elif root.is_cpu:
                    # read now, as the boundary would (its value is there already): one item()
                    # instead of an alias kept and read later, and no tensor held until then
                    scalar(LOSS, float(without_ops(root.item)))
                else:
                    # a device's: .data is the detached alias made without an op (nothing an
                    # observer sees, no dispatch), read at a step boundary
                    scalar(LOSS, root.data)
            except Exception as exc:  # noqa: BLE001 - training goes on without this loss
                lost("metrics", exc)

        @functools.wraps(original)
        def backward(tensors, *args, **kwargs):
            # the one-element tensor backward() differentiates, if that is what it was called on
            # (Tensor.backward hands over the tensor itself: the first test)
            root = tensors if type(tensors) is tensor else (
                tensors[0] if type(tensors) in (list, tuple) and len(tensors) == 1 else tensors)
            if isinstance(root, tensor) and root.numel() == 1:
                record(root)
            return original(tensors, *args, **kwargs)

        # neither is a Dynamo frame; what our own work calls is not either, while what torch's
        # backward calls (a user's backward hooks) is treated as it would be without the wrapper
        skip_frames(record)
        skip_frames(backward, recursive=False)
        self._original, self._wrapper = original, backward
        torch.autograd.backward = backward

    def window(self, on: bool) -> None:
        pass  # a loss per step, in and out of windows

    def flush(self, rec: Recorder, keep: bool) -> None:
        pass  # the session reads the values at step boundaries

    def uninstall(self) -> None:
        if self._wrapper is not None and torch.autograd.backward is self._wrapper:
            torch.autograd.backward = self._original
        self._original = self._wrapper = None
        self._guard.attach(None)

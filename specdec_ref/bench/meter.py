"""Where the benchmark's time goes: forward passes counted and timed, model by model.

`ForwardMeter` puts forward hooks on named models: it counts their forward passes and
adds up the time spent inside them, synchronizing a GPU at each boundary. A logits
source that computes without calling the model (`lean.LeanForward`,
`fast.StaticForward`) is wrapped in `MeteredSource`, which books its passes on the
same meter, so every arm's share of time outside the forward passes is measured alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from ..timing import synchronize


class ForwardMeter:
    """Counts forward passes of named models and the seconds spent inside them."""

    def __init__(self, models: dict[str, PreTrainedModel], device: torch.device) -> None:
        self.device = device
        self.models = models
        self.calls = dict.fromkeys(models, 0)
        self.seconds = dict.fromkeys(models, 0.0)
        self._started: dict[str, float] = {}
        self._handles = []
        self._attach()

    def _attach(self) -> None:
        for name, model in self.models.items():
            self._handles.append(model.register_forward_pre_hook(self._pre_hook(name)))
            self._handles.append(model.register_forward_hook(self._post_hook(name)))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Run a block with the hooks off: `torch.compile` would break its graphs at them
        (and their synchronization would stop the CPU from queueing ahead); the passes of
        the block are then neither counted nor timed."""
        self.remove()
        try:
            yield
        finally:
            self._attach()

    def _pre_hook(self, name: str):
        def hook(module, args):
            synchronize(self.device)
            self._started[name] = _now()

        return hook

    def _post_hook(self, name: str):
        def hook(module, args, output):
            synchronize(self.device)
            self.seconds[name] += _now() - self._started.pop(name)
            self.calls[name] += 1

        return hook

    @contextmanager
    def booked(self, name: str) -> Iterator[None]:
        """Count and time a block as one forward pass of `name` (for passes that bypass
        the model's hooks)."""
        synchronize(self.device)
        start = _now()
        yield
        synchronize(self.device)
        self.seconds[name] += _now() - start
        self.calls[name] += 1

    def reset(self) -> None:
        self.calls = dict.fromkeys(self.calls, 0)
        self.seconds = dict.fromkeys(self.seconds, 0.0)

    def remove(self) -> None:
        """Take the hooks off the models."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _now() -> float:
    return time.perf_counter()


class MeteredSource:
    """A logits source (`LeanForward`, `StaticForward`) whose passes the `ForwardMeter` counts
    and times as `role`'s ("target" or "draft"): they do not go through the model's hooks."""

    def __init__(self, source, meter: ForwardMeter, role: str) -> None:
        self.source, self.meter, self.role = source, meter, role
        self.model, self.max_length = source.model, source.max_length

    @property
    def forward_calls(self) -> int:
        return self.source.forward_calls

    def last_logits(self, sequence: torch.Tensor, num_positions: int) -> torch.Tensor:
        with self.meter.booked(self.role):
            return self.source.last_logits(sequence, num_positions)

    def rollback(self, length: int) -> None:
        self.source.rollback(length)

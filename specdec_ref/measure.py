"""Measuring the machine the book runs on: bandwidth, matmul speed, pass latency (chapter 1).

`memory` predicts from a configuration what a decoding step must move and compute;
this module measures what the current device actually delivers:

* `measure_bandwidth`: bytes per second of a large tensor copy (the achievable peak);
* `measure_matmul`: FLOP/s of a square matrix product (the compute side of the roofline);
* `measure_pass_latency`: the time of one cached forward pass as the number of tokens
  in the pass grows from 1 to 64, at a fixed context. Where decoding is memory-bound
  the curve stays flat: verifying K drafts costs about one decoding step;
* `decode_bandwidth`: the bytes a decoding step must read divided by its measured time,
  as a fraction of the measured peak bandwidth.

Invariant: every number comes from `timing.time_call` (warm-up, device synchronized,
median of repeats), and every size is a parameter, so the same code runs in seconds on
a laptop CPU and at full size on a GPU.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .kv_cache import CachedForward
from .memory import kv_cache_bytes
from .timing import Timing, time_call
from .validation import check_integer, context_length, model_device, vocab_size


@dataclass(frozen=True)
class BandwidthMeasurement:
    """A timed copy of one buffer into another."""

    num_bytes: int  # size of the buffer copied
    timing: Timing  # seconds per copy

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth: a copy reads and writes every byte."""
        return 2 * self.num_bytes / self.timing.median


def measure_bandwidth(*, num_bytes: int = 2**28,
                      device: torch.device | str | None = None,
                      repeats: int = 10,
                      warmup: int = 2) -> BandwidthMeasurement:
    """Time `dst.copy_(src)` for two buffers of `num_bytes` each.

    Choose the buffers much larger than the processor's caches, so the copy
    streams from and to main memory (or the GPU's HBM).

    Args:
        num_bytes: bytes per buffer (two buffers are allocated).
        device: where to allocate (default: the CPU).
        repeats, warmup: passed to `time_call`.

    Returns:
        A `BandwidthMeasurement`; `.bytes_per_s` is the achieved bandwidth.
    """
    check_integer("num_bytes", num_bytes, minimum=4)
    # Two float32 buffers; zeros_like touches dst once, so no page faults
    # are timed.
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)  # (num_bytes / 4,)
    # Median of `repeats` copies after `warmup`, the device synchronized.
    timing = time_call(lambda: dst.copy_(src), repeats=repeats,
                       warmup=warmup, device=src.device)
    return BandwidthMeasurement(src.numel() * 4, timing)


@dataclass(frozen=True)
class MatmulMeasurement:
    """A timed (size x size) @ (size x size) product."""

    size: int  # matrix side n
    dtype: str  # e.g. "torch.float32"
    timing: Timing  # seconds per product

    @property
    def flops_per_s(self) -> float:
        """Achieved throughput: a product of two n x n matrices takes 2 n^3 FLOPs."""
        return 2 * self.size**3 / self.timing.median


def measure_matmul(*, size: int = 1024, dtype: torch.dtype = torch.float32,
                   device: torch.device | str | None = None, repeats: int = 10, warmup: int = 2) -> MatmulMeasurement:
    """Time a square matrix product of side `size` in `dtype` on `device`."""
    check_integer("size", size, minimum=1)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)  # (n, n)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)  # (n, n)
    timing = time_call(lambda: a @ b, repeats=repeats, warmup=warmup, device=a.device)
    return MatmulMeasurement(size, str(dtype), timing)


@dataclass(frozen=True)
class LatencyCurve:
    """Time of one cached forward pass against the number of new tokens it processes."""

    dtype: str  # the model's dtype, e.g. "torch.bfloat16"
    context: int  # tokens already in the KV cache before each pass
    num_tokens: tuple[int, ...]  # new tokens per pass (1 is a decoding step)
    timings: tuple[Timing, ...]  # seconds per pass, one entry per num_tokens

    @property
    def median_s(self) -> list[float]:
        return [t.median for t in self.timings]

    @property
    def relative(self) -> list[float]:
        """Each median divided by the median of the first entry (a 1-token pass when present)."""
        return [m / self.timings[0].median for m in self.median_s]

    def as_dict(self) -> dict:
        """Plain data for JSON or a plot: the medians and quartiles in seconds."""
        return {"dtype": self.dtype, "context": self.context, "num_tokens": list(self.num_tokens),
                "median_s": self.median_s, "q1_s": [t.q1 for t in self.timings],
                "q3_s": [t.q3 for t in self.timings]}


@torch.no_grad()
def measure_pass_latency(model: PreTrainedModel, *, context: int,
                         num_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
                         repeats: int = 10, warmup: int = 2, seed: int = 0,
                         clock: Callable[[], float] = time.perf_counter) -> LatencyCurve:
    """Time one KV-cached forward pass over m new tokens after `context` cached ones, for each m.

    The pass is the one the decoder runs (`kv_cache.CachedForward`, m logits kept), and
    the cache is rolled back to `context` after every pass, so each repetition sees the
    same state. The sizes are timed in turn, one pass of each per round, so that the
    ratios between them survive a machine whose load changes during the measurement.
    Token ids are random: the latency of a pass does not depend on them.

    Args:
        model: a causal LM in eval mode, in the dtype and on the device to measure.
        context: tokens prefilled into the cache (>= 1).
        num_tokens: the pass sizes m to time.
        repeats: timed passes of each size; warmup: untimed passes of each size first.
        seed: seed of the random token ids.
        clock: passed to `time_call` (wall time by default).

    Returns:
        A `LatencyCurve`.
    """
    check_integer("context", context, minimum=1)
    if not num_tokens:
        raise ValueError("num_tokens must name at least one pass size")
    for m in num_tokens:
        check_integer("num_tokens entries", m, minimum=1)
    limit = context_length(model)
    if limit is not None and context + max(num_tokens) > limit:
        raise ValueError(f"context ({context}) + max(num_tokens) ({max(num_tokens)}) exceeds the model's "
                         f"context length of {limit} positions")
    device = model_device(model)
    generator = torch.Generator().manual_seed(seed)
    sequence = torch.randint(vocab_size(model), (1, context + max(num_tokens)), generator=generator)
    sequence = sequence.to(device)  # (1, context + max m)
    source = CachedForward(model)
    source.last_logits(sequence[:, :context], 1)  # prefill the cache with the context

    def one_pass(m: int) -> None:
        source.last_logits(sequence[:, : context + m], m)  # (m, V)
        source.rollback(context)

    for m in num_tokens:  # untimed warm-up of every pass size
        time_call(lambda m=m: one_pass(m), repeats=1, warmup=warmup, device=device)
    # Round-robin over the pass sizes, one timed pass each per round: a change in the
    # machine's load then slows every size alike instead of whichever was timed then.
    samples: list[list[float]] = [[] for _ in num_tokens]
    for _ in range(repeats):
        for i, m in enumerate(num_tokens):
            samples[i] += time_call(lambda m=m: one_pass(m), repeats=1, warmup=0, device=device,
                                    clock=clock).samples
    timings = tuple(Timing(tuple(times)) for times in samples)
    dtype = next(model.parameters()).dtype
    return LatencyCurve(str(dtype), context, tuple(num_tokens), timings)


def latency_curves(model: PreTrainedModel, *, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
                   **kwargs) -> dict[str, LatencyCurve]:
    """`measure_pass_latency` for each dtype, on a converted copy of `model` where needed.

    Returns:
        {str(dtype): LatencyCurve}. Keyword arguments go to `measure_pass_latency`.
    """
    curves = {}
    for dtype in dtypes:
        same = next(model.parameters()).dtype == dtype
        converted = model if same else copy.deepcopy(model).to(dtype=dtype)
        curves[str(dtype)] = measure_pass_latency(converted, **kwargs)
        del converted
    return curves


def streamed_weight_bytes(model: PreTrainedModel) -> int:
    """Bytes of the weights one decoding step reads, from the model's actual tensors.

    Every parameter counts except embedding tables, of which a step reads one row; a
    table that is also the output head (tied embeddings) is read in full and counts.
    """
    head = model.get_output_embeddings()
    head_weight = head.weight if head is not None else None
    lookups = {id(m.weight) for m in model.modules()
               if isinstance(m, torch.nn.Embedding) and m.weight is not head_weight}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in lookups)


@dataclass(frozen=True)
class DecodeBandwidth:
    """How close a decoding step comes to the device's measured bandwidth."""

    step_bytes: float  # weights streamed + KV cache read, per decoding step
    latency_s: float  # measured median time of the step
    peak_bytes_per_s: float  # the measured copy bandwidth

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.step_bytes / self.latency_s

    @property
    def fraction_of_peak(self) -> float:
        """1.0 would mean the step is limited by memory bandwidth alone."""
        return self.achieved_bytes_per_s / self.peak_bytes_per_s


def decode_bandwidth(model: PreTrainedModel, *, context: int, peak_bytes_per_s: float,
                     repeats: int = 10, warmup: int = 2) -> DecodeBandwidth:
    """Time a 1-token cached pass and compare the bandwidth it implies with `peak_bytes_per_s`.

    Args:
        model: a causal LM `memory.model_shape` knows, in the dtype and on the device to measure.
        context: tokens in the KV cache (their keys and values are read too).
        peak_bytes_per_s: the device's achievable bandwidth, e.g. `measure_bandwidth().bytes_per_s`.
        repeats, warmup: passed to `time_call`.
    """
    if not peak_bytes_per_s > 0:
        raise ValueError(f"peak_bytes_per_s must be > 0, got {peak_bytes_per_s!r}")
    dtype = next(model.parameters()).dtype
    curve = measure_pass_latency(model, context=context, num_tokens=(1,), repeats=repeats, warmup=warmup)
    moved = streamed_weight_bytes(model) + kv_cache_bytes(model.config, context, dtype)
    return DecodeBandwidth(float(moved), curve.timings[0].median, float(peak_bytes_per_s))


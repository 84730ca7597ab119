"""Timing that means something on a CPU and on a GPU: warm-up, synchronize, medians.

GPU kernels run asynchronously, so a wall-clock reading taken without synchronizing
measures only the launch. CPUs are noisy, so one reading says little: time several
repetitions after a warm-up and report the median and the spread.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for all queued work on `device` (a no-op on the CPU)."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device is not None and device.type == "mps":
        torch.mps.synchronize()


@dataclass(frozen=True)
class Timing:
    """Repeated wall-clock measurements of one operation, in seconds."""

    samples: tuple[float, ...]  # one entry per timed repetition

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def q1(self) -> float:
        """First quartile (25th percentile)."""
        return _quantile(self.samples, 0.25)

    @property
    def q3(self) -> float:
        """Third quartile (75th percentile)."""
        return _quantile(self.samples, 0.75)

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "q1": self.q1, "q3": self.q3, "n": len(self.samples)}


def _quantile(values: tuple[float, ...], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def time_call(
    fn: Callable[[], object],
    *,
    repeats: int = 10,
    warmup: int = 2,
    device: torch.device | str | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time `fn()` `repeats` times after `warmup` untimed calls.

    Args:
        fn: the operation, called with no arguments.
        repeats: timed calls (>= 1).
        warmup: untimed calls first (caches, allocator, lazy initialisation).
        device: synchronized before and after each call when it is a GPU.
        clock: seconds as a float; wall time by default. `time.thread_time` (the
            calling thread's CPU time) ignores the time other processes hold the
            core, but it counts CPU work only: with one torch thread, on a CPU.

    Returns:
        A `Timing` with the per-call seconds.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        synchronize(device)
        samples.append(clock() - start)
    return Timing(tuple(samples))


# The instruction sets that decide which CPU kernels run (bfloat16 and prepacking).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx_ne_convert")


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """The `ISA_FLAGS` this CPU has (Linux /proc/cpuinfo; empty where it cannot be read): for reports."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])
    return [flag for flag in ISA_FLAGS if flag in flags]


def cpu_name() -> str:
    """The processor's model name (Linux /proc/cpuinfo), else what `platform` knows: for reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

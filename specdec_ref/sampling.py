"""Turn logits into the distribution that is actually sampled.

Speculative decoding is exact only if the draft distribution q and the target
distribution p are the distributions the two models would *really* sample from.
Temperature, top-k and top-p change those distributions, so both models' logits go
through the one function here, `logits_to_probs`, in the order `transformers`'
`generate` applies its warpers: temperature, then top-k, then top-p.

Temperature 0 means greedy decoding: the "distribution" is a one-hot vector on the
argmax, which makes the greedy path a special case of the same bookkeeping. Any
temperature above 0, however small, is computed without overflow: as T -> 0 the
distribution tends to uniform over the maximal logits, which is greedy but for ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .validation import check_integer


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from the logits (shared by draft and target)."""

    # Softmax temperature, finite and >= 0; 0 means greedy (argmax), larger flattens.
    temperature: float = 1.0
    # Keep only the k most likely tokens (ties with the k-th are kept); None keeps all.
    top_k: int | None = None
    # Keep the smallest set of most likely tokens whose mass reaches top_p; None keeps all.
    top_p: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {t!r}")
        check_integer("top_k", self.top_k, minimum=1, optional=True)
        if self.top_p is not None and (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, (int, float))
            or not 0 < self.top_p <= 1
        ):
            raise ValueError(f"top_p must be None or a number in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax (temperature 0)."""
        return self.temperature == 0

    def generate_kwargs(self) -> dict:
        """The same settings spelled for `transformers`' `generate`, every one explicit.

        `generate` samples with top_k=50 unless told otherwise, so a fair comparison
        must pass top_k=0 (off) and top_p=1.0 (off) explicitly.
        """
        if self.greedy:
            return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
        return {
            "do_sample": True,
            "temperature": float(self.temperature),
            "top_k": self.top_k if self.top_k is not None else 0,
            "top_p": float(self.top_p) if self.top_p is not None else 1.0,
        }


GREEDY = SamplingConfig(temperature=0.0)


def logits_to_probs(
    logits: torch.Tensor, sampling: SamplingConfig
) -> torch.Tensor:
    """The distribution a token is sampled from, for each row of `logits`.

    Args:
        logits: raw model logits, shape (..., V), any float dtype.
        sampling: temperature, top-k and top-p, applied in that order.

    Returns:
        float32 probabilities of the same shape; each row sums to 1.
        Greedy (temperature 0) gives a one-hot row on the first argmax; a
        tiny temperature gives its limit, uniform over the maximal logits
        (no NaN, no overflow).
    """
    logits = logits.float()  # (..., V) softmax in float32 even for bf16 models
    if sampling.greedy:
        # Greedy: all mass on the argmax (the first one on ties, as
        # torch.argmax does).
        probs = torch.zeros_like(logits)
        return probs.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    # Temperature, as (logits - max) / T: the same softmax for every T > 0,
    # and stable for a tiny T (1e-45), where logits / T would overflow to
    # inf - inf = NaN. The maximal logits score 0 and every other one tends
    # to -inf, so the distribution tends to its T -> 0 limit: uniform over
    # the argmax (a single token but for ties).
    top = logits.amax(-1, keepdim=True)  # (..., 1)
    shifted = (logits - top) / sampling.temperature  # (..., V)
    scores = torch.where(logits == top, 0.0, shifted)  # (..., V)
    if sampling.top_k is not None:
        # Top-k: mask everything strictly below the k-th largest score.
        k = min(sampling.top_k, scores.size(-1))
        kth = torch.topk(scores, k, dim=-1).values[..., -1:]  # (..., 1)
        scores = scores.masked_fill(scores < kth, -math.inf)
    if sampling.top_p is not None and sampling.top_p < 1:
        # Top-p (nucleus): sort ascending and drop the low tail whose
        # cumulative mass is at most 1 - top_p; the most likely token always
        # survives.
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)  # (..., V)
        remove_sorted = cumulative <= (1 - sampling.top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, -math.inf)
    return scores.softmax(-1)


def draw_device(generator: torch.Generator | None) -> torch.device:
    """Where random numbers are drawn: on the generator's device; without one, on the
    CPU (torch's default generator). The one rule for every draw in the package, so a
    seeded CPU generator gives the same draws whether the models run on a CPU or a GPU."""
    return generator.device if generator is not None else torch.device("cpu")


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of `probs` (..., V) -> (...,), using only `generator`.

    Inverse-CDF sampling: one uniform u per row picks the first token whose
    cumulative mass exceeds u * total, so a token with zero mass is never drawn.
    Sampling happens on the generator's device, so a CPU generator gives the same
    draws whether the model runs on a CPU or a GPU.
    """
    device = draw_device(generator)
    cumulative = probs.to(device, torch.float64).cumsum(-1)  # (..., V)
    total = cumulative[..., -1:]  # (..., 1)
    u = torch.rand(total.shape, dtype=torch.float64, device=device, generator=generator)  # (..., 1)
    tokens = torch.searchsorted(cumulative, u * total, right=True)  # (..., 1)
    return tokens.clamp_(max=probs.size(-1) - 1).squeeze(-1)

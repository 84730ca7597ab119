"""Chapter 6's model for the draft-head arms: pass costs c and v measured, S = E / (D + v).

`pass_costs` times, as process CPU time with the passes interleaved, one pass of each
model after a 32-token prefix with a warm cache: the target over 1 row (the target step
every cost is divided by) and over K + 1 or N + 1 rows (v), the separate draft model and
EAGLE's head over 1..16 rows (a tree level's rows), and one pass through all of Medusa's
heads. `predicted_speedup` prices an arm's round from them: D, its draft passes (one per
level, the root's first; Medusa's heads once for the whole round), and v, its
verification pass; S = E / (D + v) (chapter 6, `analysis.expected_speedup` with
E = `analysis.expected_tokens`), which counts forward passes only.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..heads.features import FeatureSource
from ..kv_cache import CachedForward


@torch.no_grad()
def pass_costs(models: Any, prefix: torch.Tensor, repeats: int = 20) -> dict[str, float]:
    """Median process CPU ms per pass after `prefix` (1, n), cache warm, the passes interleaved
    (3 untimed rounds first): the target over 1, 5, 15, 45 rows, the draft model and EAGLE's
    head over 1..16 rows, Medusa's heads (all of them) once."""
    target, n = models.target, prefix.size(1)
    if models.baselines is None:  # as loaded: the heads' passes run with sdpa
        target.set_attn_implementation("sdpa")
    filler = prefix.repeat(1, 2)  # tokens to feed after the prefix, (1, 2n)
    steps = {}
    for name, model, rows in (("target", target, (1, 5, 15, 45)), ("draft", models.draft, (1, 2, 4, 8, 16))):
        # a logits source already (the fast path's lean draft), or a model to wrap
        source = model if hasattr(model, "last_logits") else CachedForward(model)
        source.rollback(0)  # a new sequence: the lean draft kept the last arm's
        source.last_logits(prefix, 1)
        for m in rows:
            longer = torch.cat([prefix, filler[:, :m]], 1)  # (1, n + m)
            steps[f"{name}_{m}"] = lambda s=source, x=longer, m=m: (s.rollback(n), s.last_logits(x, m))
    features = FeatureSource(target)
    features.last_logits(prefix, 1)
    features.close()
    parts, feats = features.parts, features.features  # feats (n, H)
    head, cache = models.eagle, models.eagle.new_cache()
    head(parts.embed(prefix[:, 1:]), feats[None, :-1], torch.arange(n - 1)[None], cache)

    def eagle_pass(m: int) -> torch.Tensor:
        excess = cache.get_seq_length() - (n - 1)  # back to the real entries
        if excess > 0:
            cache.crop(-excess)
        positions = torch.arange(n - 1, n - 1 + m)[None]  # (1, m)
        return parts.logits(head(parts.embed(filler[:, :m]), feats[None, -m:], positions, cache))  # (1, m, V)

    steps.update({f"eagle_{m}": lambda m=m: eagle_pass(m) for m in (1, 2, 4, 8, 16)})
    lean, lean_cache = models.lean_eagle, models.lean_eagle.new_cache()
    lean(parts.embed(prefix[:, 1:]), feats[None, :-1], torch.arange(n - 1)[None], lean_cache)

    def lean_pass() -> torch.Tensor:  # one drafted row, as a chain drafts
        lean_cache.crop(n - 1)
        position = torch.tensor([[n - 1]])
        return parts.logits(lean(parts.embed(filler[:, :1]), feats[None, -1:], position, lean_cache))

    steps["eagle-lean_1"] = lean_pass
    steps["medusa"] = lambda: [models.medusa.logits(feats[-1:], parts, k) for k in range(len(models.medusa))]
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(3 + repeats):
        for name, step in steps.items():
            start = time.process_time()
            step()
            if r >= 3:
                samples[name].append(time.process_time() - start)
    return {name: round(statistics.median(v) * 1e3, 4) for name, v in samples.items()}


def predicted_speedup(arm: tuple[str, tuple | str], tokens_per_call: float,
                      costs: dict[str, float]) -> dict[str, float]:
    """Chapter 6's S = E / (D + v), D and v in target steps (`pass_costs`' target_1):
    {"D": draft cost per round, "v": verification cost, "S": the predicted speedup}.

    Args:
        arm: (drafter, widths) as in `head_speed.ARMS`: "generate", "draft", "eagle" or
            "medusa", and the tree's widths ((1, 1, 1, 1) for a chain of K = 4).
        tokens_per_call: E, the arm's measured tokens per target pass.
        costs: `pass_costs`' CPU ms per pass.
    """
    kind, widths = arm
    if kind == "generate":
        return {"D": 0.0, "v": 1.0, "S": 1.0}
    levels, size = [], 1
    for w in widths:  # nodes per level: (2, 2, 1, 1) -> 2, 4, 4, 4
        size *= w
        levels.append(size)
    step = costs["target_1"]
    # One draft pass per level, over the rows whose children it drafts (the root's first).
    draft = costs["medusa"] if kind == "medusa" else sum(costs[f"{kind}_{m}"] for m in [1, *levels[:-1]])
    d, v = draft / step, costs[f"target_{sum(levels) + 1}"] / step
    return {"D": round(d, 3), "v": round(v, 3), "S": round(tokens_per_call / (d + v), 3)}

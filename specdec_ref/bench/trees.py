"""The benchmark's tree arms: trees of drafts (`specdec_ref.trees.tree`) next to the chain.

A tree arm runs `tree.tree_speculative_generate` with one shape: fixed widths per
level, or a `tree.ConfidentShape` (nodes per level placed by the draft's confidence,
as EAGLE-2 places them). Its draft runs through `LeanForward` where the chain's lean
arms do, booked on the benchmark's meter by `MeteredLean`.

`tree_section` sets every tree arm, and the chain's lean fixed-K arms, against chapter
6's model extended to trees (`tree_model`): the acceptance by sibling rank a_r is
fitted on one arm (the reference: the fixed shape with the most nodes), and predicts every
other arm's tokens per target pass from its shape alone; the arm's own measured costs
(its target pass, v, and its draft's pass per level, c_d, both in steps of `generate`'s
target measured in the same run) turn that into a predicted speedup.
"""

from __future__ import annotations

import torch

from ..fast.lean import LeanForward
from ..trees.model import expected_tokens, rank_counts, rates_from_counts, shape_parents
from ..trees.tree import ConfidentShape
from .meter import ForwardMeter

# The tree arms of a run with --trees and no shapes given.
DEFAULT_TREES = ((2, 2, 1, 1), (3, 2, 1), (4, 2, 2, 1), ConfidentShape((4, 4, 4, 4), top=4))


def tree_label(shape: tuple[int, ...] | ConfidentShape) -> str:
    """'2,2,1,1' for widths; 'confident 4,4,4,4 top 4' for a ConfidentShape."""
    if isinstance(shape, ConfidentShape):
        return f"confident {','.join(map(str, shape.levels))} top {shape.top}"
    return ",".join(map(str, shape))


def tree_nodes(shape: tuple[int, ...] | ConfidentShape) -> int:
    """The most nodes a tree of this shape drafts (the root not counted)."""
    if isinstance(shape, ConfidentShape):
        return sum(shape.levels)
    return len(shape_parents(shape)) - 1


def parse_trees(text: str) -> tuple:
    """'2,2,1,1;c4,4,4,4/4' -> ((2, 2, 1, 1), ConfidentShape((4, 4, 4, 4), top=4))."""
    shapes = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        try:
            if item.startswith("c"):
                levels, _, top = item[1:].partition("/")
                shapes.append(ConfidentShape(tuple(int(n) for n in levels.split(",")), int(top or 4)))
            else:
                shapes.append(tuple(int(w) for w in item.split(",")))
        except ValueError as error:
            raise ValueError(f"a tree shape is 'w1,w2,...' or 'cn1,n2,.../top', got {item!r}: {error}") from None
    return tuple(shapes)


class MeteredLean(LeanForward):
    """`LeanForward` whose passes (tree levels included) are booked on a `ForwardMeter` as
    the draft's: they do not go through the model's hooks."""

    def __init__(self, model, meter: ForwardMeter, role: str = "draft", max_length: int | None = None) -> None:
        super().__init__(model, max_length=max_length)
        self.meter, self.role = meter, role

    def _run(self, *args, **kwargs) -> torch.Tensor:
        with self.meter.booked(self.role):
            return super()._run(*args, **kwargs)


def tree_shape_stats(trace: list) -> dict:
    """What the decoder's trace says about its trees, for `tree_section`: rank counts
    (`tree_model.rank_counts`) and how often each shape was drafted."""
    trials, accepts = rank_counts(trace)
    shapes: dict[tuple[int, ...], int] = {}
    for record in trace:
        shapes[tuple(record.parents)] = shapes.get(tuple(record.parents), 0) + 1
    return {"trials": trials, "accepts": accepts, "shapes": shapes}


def _add(counts: list[int], more: list[int]) -> list[int]:
    width = max(len(counts), len(more))
    return [(counts[i] if i < len(counts) else 0) + (more[i] if i < len(more) else 0) for i in range(width)]


def tree_section(arms: list, records: dict, summaries: list[dict], baselines: dict) -> dict:
    """Per mode: the rank rates fitted on the reference tree arm, and for every tree arm and
    lean chain arm its nodes, depth, tokens per pass (measured and predicted), v (its target
    pass over `generate`'s step), c per draft level, and predicted and measured speedups."""
    by_name = {(s["mode"], s["name"]): s for s in summaries}
    section = {}
    for mode in dict.fromkeys(arm.mode for arm in arms):
        trees = [arm for arm in arms if arm.mode == mode and arm.tree is not None]
        if not trees:
            continue
        step_ms = by_name[(mode, "hf generate")]["target_pass_ms"]
        # generate as run, over the baseline (1 unless the baseline is a faster variant).
        scale = by_name[(mode, "hf generate")]["speedup"]
        stats = {arm: _pooled(records[arm]) for arm in trees}
        # The reference: the fixed shape with the most nodes (a confident one only if none is fixed).
        reference = max(trees, key=lambda arm: (not isinstance(arm.tree, ConfidentShape), tree_nodes(arm.tree)))
        rates = rates_from_counts(stats[reference]["trials"], stats[reference]["accepts"])
        rows = []
        chains = [arm for arm in arms if arm.mode == mode and arm.lean and arm.schedule == "fixed"]
        for arm in chains + trees:
            summary = by_name[(mode, arm.name)]
            if arm.tree is None:
                parents, depth = shape_parents((1,) * arm.k), arm.k
                predicted = expected_tokens(parents, rates)
                nodes = float(arm.k)
            else:
                shapes = stats[arm]["shapes"]
                total = sum(shapes.values())
                predicted = sum(expected_tokens(p, rates) * n for p, n in shapes.items()) / total
                nodes = sum((len(p) - 1) * n for p, n in shapes.items()) / total
                depth = len(arm.tree)
            verify = summary["target_pass_ms"] / step_ms
            level = summary["draft_pass_ms"] / step_ms
            levels = summary["draft_calls_per_token"] * summary["block_efficiency"]  # draft passes per pass
            rows.append({
                "name": arm.name, "shape": tree_label(arm.tree) if arm.tree is not None else f"chain k={arm.k}",
                "nodes": nodes, "depth": depth, "tokens_per_pass": summary["block_efficiency"],
                "predicted_tokens_per_pass": predicted, "verify_cost": verify, "draft_cost_per_level": level,
                "draft_passes_per_iteration": levels,
                "predicted_speedup": scale * predicted / (verify + levels * level),
                "measured_speedup": summary["speedup"], "reference": arm is reference,
            })
        section[mode] = {"reference": reference.name, "rank_rates": rates, "step_ms": step_ms,
                         "baseline": baselines[mode], "arms": rows}
    return section


def _pooled(runs: list) -> dict:
    """Rank counts and shapes over all of an arm's runs."""
    trials, accepts, shapes = [], [], {}
    for _, _, record in runs:
        trials, accepts = _add(trials, record.tree["trials"]), _add(accepts, record.tree["accepts"])
        for shape, count in record.tree["shapes"].items():
            shapes[shape] = shapes.get(shape, 0) + count
    return {"trials": trials, "accepts": accepts, "shapes": shapes}

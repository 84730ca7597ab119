"""The arms of the benchmark, and one timed, instrumented run of an arm on one prompt.

An arm is one way of generating: `transformers`' `generate` (target alone, the
baseline), its assisted generation (at its defaults, and at a fixed K), or
`specdec_ref` (target alone, speculative without a cache, with a cache at fixed K,
with the heuristic and the model-based draft length). Each arm runs in one of three
modes: greedy, or sampling at temperature 1 or 0.7 with no top-k and no top-p, set
explicitly in every arm (`generate` would otherwise sample with top_k=50).

`meter.ForwardMeter` puts forward hooks on both models: it counts their forward passes
and adds up the time spent inside them (synchronizing a GPU at each boundary), so the
share of wall time spent outside the models, the loop's own overhead, is measured
the same way for every arm (`meter.MeteredSource` for the passes that bypass the
hooks). For assisted generation, which reports no counters, alpha is derived from the
hooks: every target pass emits the accepted drafts plus one token, so accepted =
new tokens - target passes, and every assistant pass drafts one.

Invariant: within a mode, every arm gets the same prompt, the same token budget and
EOS switched off, so their token counts, and in greedy mode their tokens, must agree.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel

from ..decoder import autoregressive_generate, speculative_generate
from ..drafting import ModelDrafter
from ..fast import StaticForward
from ..fast.lean import LeanForward
from ..fast.packed import set_packing
from ..sampling import SamplingConfig
from ..schedules import HeuristicDraftLength, ModelBasedDraftLength
from ..timing import time_call
from ..trees.tree import tree_speculative_generate
from ..validation import check_integer
from .meter import ForwardMeter, MeteredSource
from .pair import BenchPair, PassCosts
from .report import arm_cost_ratio
from .trees import MeteredLean, tree_label, tree_nodes, tree_shape_stats

# The modes of the benchmark and the sampling settings each stands for.
MODES = {
    "greedy": SamplingConfig(temperature=0.0),
    "t1.0": SamplingConfig(temperature=1.0),
    "t0.7": SamplingConfig(temperature=0.7),
}


@dataclass(frozen=True)
class Arm:
    """One generation method in one mode."""

    name: str  # unique within its mode, e.g. "specdec_ref k=4"
    impl: str  # "transformers" or "specdec_ref"
    mode: str  # a key of MODES
    k: int | None  # fixed draft length (None: no draft model, or an adaptive/default one)
    use_cache: bool  # whether both models keep a KV cache
    schedule: str | None  # "fixed", "heuristic", "model", "default" (transformers), None (no draft)
    lean: bool = False  # the draft runs through `lean.LeanForward` (same weights, no framework overhead)
    variant: str | None = None  # a key of VARIANTS: `generate` on the target configured otherwise
    fast: bool = False  # both models run through `fast.StaticForward` (static cache; CUDA graphs on a GPU)
    tree: object = None  # a tree shape (widths, or a `tree.ConfidentShape`): `tree.tree_speculative_generate`

    @property
    def speculative(self) -> bool:
        """Whether the arm uses the draft model."""
        return self.schedule is not None

    @property
    def sampling(self) -> SamplingConfig:
        return MODES[self.mode]


# Baseline variants: target-only `generate` with the target configured otherwise than in the
# run, so that the baseline can take its fastest configuration within the same run.
VARIANTS = {
    "plain": "prepacked linear layers switched off (`packed.set_packing`)",
    "sdpa": "attention by `scaled_dot_product_attention` (the library's default)",
    "float32": "a float32 copy of the target, linear layers as loaded, sdpa attention",
    "1 thread": "one torch thread (`torch.set_num_threads`), sdpa attention",
    "2 threads": "two torch threads (`torch.set_num_threads`), sdpa attention",
    "compiled": "a static cache, compiled by transformers with torch.compile (cache_implementation='static')",
}
THREAD_VARIANTS = {"1 thread": 1, "2 threads": 2}  # variant -> the thread count it runs with


def build_arms(modes: list[str], k_values: list[int], *, nocache_k: int = 4, model_schedule: bool = True,
               lean: bool = False, variants: tuple[str, ...] = (), fast: bool = False,
               fast_k_values: list[int] | None = None, trees: tuple = ()) -> list[Arm]:
    """Every arm of the benchmark, mode by mode (the baseline first in each mode).

    Args:
        modes: keys of `MODES`.
        k_values: the fixed draft lengths of the cached `specdec_ref` and assisted arms.
        nocache_k: K of the `specdec_ref` arm without a KV cache.
        model_schedule: include the model-based draft length arm.
        lean: also run the fixed-K and model-schedule arms with the lean draft forward.
        variants: keys of `VARIANTS`: also run `generate` so configured ("hf generate plain",
            ...), so that the baseline can take the fastest configuration.
        fast: also run the target alone, the fixed-K and the model-schedule arms with both
            models on the fast path (`fast.StaticForward`).
        fast_k_values: the fixed K of the fast arms (default: `k_values`).
        trees: tree shapes (`bench.trees`): one tree arm each, its draft lean when `lean`.
    """
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty subset of {sorted(MODES)}, got {modes!r}")
    if not k_values:
        raise ValueError(f"k_values must be a non-empty list of integers >= 1, got {k_values!r}")
    for k in k_values:
        check_integer("each of k_values", k, minimum=1)
    arms = []
    for mode in modes:
        arms.append(Arm("hf generate", "transformers", mode, None, True, None))
        arms += [Arm(f"hf generate {v}", "transformers", mode, None, True, None, variant=v) for v in variants]
        arms.append(Arm("hf assisted default", "transformers", mode, None, True, "default"))
        arms += [Arm(f"hf assisted k={k}", "transformers", mode, k, True, "fixed") for k in k_values]
        arms.append(Arm("specdec_ref autoregressive", "specdec_ref", mode, None, True, None))
        arms.append(Arm(f"specdec_ref k={nocache_k} nocache", "specdec_ref", mode, nocache_k, False, "fixed"))
        arms += [Arm(f"specdec_ref k={k}", "specdec_ref", mode, k, True, "fixed") for k in k_values]
        arms.append(Arm("specdec_ref heuristic", "specdec_ref", mode, None, True, "heuristic"))
        if model_schedule:
            arms.append(Arm("specdec_ref model", "specdec_ref", mode, None, True, "model"))
        if lean:
            arms += [Arm(f"specdec_ref k={k} lean", "specdec_ref", mode, k, True, "fixed", True) for k in k_values]
            if model_schedule:
                arms.append(Arm("specdec_ref model lean", "specdec_ref", mode, None, True, "model", True))
        if fast:
            arms.append(Arm("specdec_ref autoregressive fast", "specdec_ref", mode, None, True, None, fast=True))
            arms += [Arm(f"specdec_ref k={k} fast", "specdec_ref", mode, k, True, "fixed", fast=True)
                     for k in fast_k_values or k_values]
            if model_schedule:
                arms.append(Arm("specdec_ref model fast", "specdec_ref", mode, None, True, "model", fast=True))
        arms += [Arm(f"specdec_ref tree {tree_label(shape)}", "specdec_ref", mode, None, True, "tree", lean,
                     tree=shape) for shape in trees]
    return arms


def assisted_defaults() -> dict:
    """What "hf assisted default" means in the installed transformers (for the report)."""
    from transformers import GenerationConfig
    from transformers.utils import is_sklearn_available

    # transformers 5.x keeps them in _get_default_generation_params(); 4.x on a fresh GenerationConfig.
    defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)()
    fresh = GenerationConfig()
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    # Without scikit-learn, transformers keeps the confidence threshold fixed instead of adapting it.
    return {**{key: defaults.get(key, getattr(fresh, key, None)) for key in keys},
            "threshold_adapts": bool(is_sklearn_available())}


@dataclass
class RunRecord:
    """What one run of one arm on one prompt produced and cost."""

    tokens: list[int]  # the new tokens
    wall_seconds: float  # wall time of the whole call
    forward_seconds: float  # time inside forward passes of either model
    target_calls: int  # target forward passes
    draft_calls: int  # draft forward passes
    drafted: int | None  # drafted tokens (None: the arm drafts nothing)
    accepted: int | None  # accepted drafts
    judged: int | None = None  # drafts the target judged (specdec_ref only; none after a rejection)
    iterations: int = 0  # draft-verify rounds (target passes for the transformers arms)
    target_seconds: float = 0.0  # time inside the target's forward passes
    draft_seconds: float = 0.0  # time inside the draft's forward passes
    tree: dict | None = None  # tree arms: `trees.tree_shape_stats` of the run (not in the report)


class ArmRunner:
    """Runs arms on a pair, with hooks on both models and the pass costs the model schedule needs."""

    def __init__(self, pair: BenchPair, *, max_new_tokens: int, costs: PassCosts,
                 float32_target: PreTrainedModel | None = None, fast_costs: dict | None = None,
                 max_length: int | None = None) -> None:
        self.pair = pair
        self.max_new_tokens = max_new_tokens
        self.costs = costs
        self.fast_costs = fast_costs  # `bench.fast.measure_fast_costs`, for the fast arms' schedule
        # One static cache per model for every fast arm (its CUDA graphs are captured once).
        self.static = {} if max_length is None else {
            role: StaticForward(getattr(pair, f"{role}_model"), max_length=max_length, max_graph_tokens=16)
            for role in ("target", "draft")}
        self.float32_target = float32_target  # the "float32" variant's model
        models = {"target": pair.target_model, "draft": pair.draft_model}
        if float32_target is not None:
            models["target float32"] = float32_target
        self.meter = ForwardMeter(models, pair.device)
        self._attention = pair.target_model.config._attn_implementation
        self._threads = torch.get_num_threads()  # the run's thread count
        self._draft_config = pair.draft_model.generation_config
        self._trace = None  # the last tree arm's trace (its `TreeRecord`s)

    def close(self) -> None:
        self.meter.remove()
        self.pair.draft_model.generation_config = self._draft_config

    def run(self, arm: Arm, input_ids: torch.Tensor, seed: int) -> RunRecord:
        """Time one generation of `arm` from `input_ids` (1, n); sampling is seeded by `seed`."""
        result = {}

        def call() -> None:
            result["tokens"], result["stats"] = self._generate(arm, input_ids, seed)

        if arm.impl == "transformers" and arm.speculative:
            # In transformers 5.x the assistant reads K and its schedule from its own generation
            # config (generate(num_assistant_tokens=...) is ignored); set it before the clock starts.
            self.pair.draft_model.generation_config = self._assistant_config(arm)
        self.meter.reset()
        self._configure(arm.variant)  # before the clock starts
        try:
            if arm.variant == "compiled":  # unmetered: hooks would break the compiled graphs
                with self.meter.paused():
                    wall = time_call(call, repeats=1, warmup=0, device=self.pair.device).median
            else:
                wall = time_call(call, repeats=1, warmup=0, device=self.pair.device).median
        finally:
            self._configure(None)
        tokens, stats = result["tokens"], result["stats"]
        if len(tokens) != self.max_new_tokens:
            raise RuntimeError(f"arm {arm.name!r} ({arm.mode}) produced {len(tokens)} tokens, "
                               f"expected max_new_tokens={self.max_new_tokens}: is EOS really off?")
        calls, seconds = dict(self.meter.calls), sum(self.meter.seconds.values())
        target = "target float32" if arm.variant == "float32" else "target"
        record = RunRecord(tokens, wall, seconds, calls[target], calls["draft"], None, None,
                           iterations=calls[target], target_seconds=self.meter.seconds[target],
                           draft_seconds=self.meter.seconds["draft"])
        if stats is not None:  # specdec_ref: exact counters from the decoder
            if arm.speculative:
                record.drafted, record.accepted = stats.drafted_tokens, stats.accepted_tokens
                record.judged = stats.judged_tokens
            record.iterations = stats.iterations
            if arm.tree is not None:
                record.tree = tree_shape_stats(self._trace)
        elif arm.speculative:  # assisted generation: one target pass per round, one draft pass per draft
            record.drafted, record.accepted = calls["draft"], len(tokens) - calls["target"]
        return record

    def _configure(self, variant: str | None) -> None:
        """Set the target up for `variant` (None: as the run has it)."""
        set_packing(self.pair.target_model, variant != "plain")
        threads = THREAD_VARIANTS.get(variant, self._threads)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        attention = "sdpa" if variant in ("sdpa", *THREAD_VARIANTS) else self._attention
        if self.pair.target_model.config._attn_implementation != attention:
            self.pair.target_model.set_attn_implementation(attention)

    def _generate(self, arm: Arm, input_ids: torch.Tensor, seed: int) -> tuple[list[int], object]:
        """The new tokens of one generation, and the decoder's stats (None for transformers)."""
        target, draft = self.pair.target_model, self.pair.draft_model
        if arm.variant == "float32":
            target = self.float32_target
        n = input_ids.size(1)
        if arm.impl == "transformers":
            kwargs = {"max_new_tokens": self.max_new_tokens, "attention_mask": torch.ones_like(input_ids),
                      **arm.sampling.generate_kwargs()}
            if arm.speculative:
                kwargs["assistant_model"] = draft
            if arm.variant == "compiled":
                kwargs["cache_implementation"] = "static"  # transformers then compiles the forward
            torch.manual_seed(seed)
            with torch.no_grad():
                output = target.generate(input_ids, **kwargs)  # (1, n + new)
            return output[0, n:].tolist(), None
        generator = torch.Generator(device=self.pair.device).manual_seed(seed)
        if arm.tree is not None:
            size = n + self.max_new_tokens + tree_nodes(arm.tree)  # the lean buffers' length
            source = MeteredLean(draft, self.meter, max_length=size) if arm.lean else draft
            out = tree_speculative_generate(target, source, input_ids, max_new_tokens=self.max_new_tokens,
                                            widths=arm.tree, sampling=arm.sampling, generator=generator)
            self._trace = out.trace
            return out.sequences[0, n:].tolist(), out.stats
        common = {"max_new_tokens": self.max_new_tokens, "sampling": arm.sampling, "generator": generator,
                  "eos_token_id": None, "use_cache": arm.use_cache}
        if arm.fast:
            target = MeteredSource(self.static["target"], self.meter, "target")
            if not arm.speculative:
                out = autoregressive_generate(target, input_ids, **common)
                return out.sequences[0, n:].tolist(), out.stats
            drafter = ModelDrafter(MeteredSource(self.static["draft"], self.meter, "draft"), arm.sampling, generator)
            out = speculative_generate(target, drafter, input_ids, num_draft_tokens=self._schedule(arm), **common)
        elif arm.lean:
            drafter = ModelDrafter(MeteredSource(LeanForward(draft), self.meter, "draft"), arm.sampling, generator)
            out = speculative_generate(target, drafter, input_ids, num_draft_tokens=self._schedule(arm), **common)
        elif arm.speculative:
            out = speculative_generate(target, draft, input_ids, num_draft_tokens=self._schedule(arm), **common)
        else:
            out = autoregressive_generate(target, input_ids, **common)
        return out.sequences[0, n:].tolist(), out.stats

    def _assistant_config(self, arm: Arm):
        """A fresh assistant generation config: library defaults, or K drafts every round."""
        config = copy.deepcopy(self._draft_config)
        if arm.schedule == "default":
            # The library's own defaults, spelled out: transformers 5.x would fill in None
            # when generation starts, 4.x needs the values.
            for key, value in assisted_defaults().items():
                if hasattr(config, key):
                    setattr(config, key, value)
        else:
            # Exactly K drafts per round, as in specdec_ref: constant schedule, no early stop on low confidence.
            config.num_assistant_tokens = arm.k
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = 0.0
        return config

    def _schedule(self, arm: Arm):
        """A fresh draft length for one generation (schedules keep state)."""
        if arm.schedule == "fixed":
            return arm.k
        if arm.schedule == "heuristic":
            return HeuristicDraftLength()
        verify_cost = self.costs.verify_cost
        # The schedule plans with the c the loop pays (draft passes after a target pass).
        cost_ratio = arm_cost_ratio(asdict(self.costs), {"lean": arm.lean})
        if arm.fast:  # the fast path's own costs
            fast = self.fast_costs["fast"]
            cost_ratio = fast["cost_ratio"]
            verify_cost = {int(k): v for k, v in fast["verify_cost"].items()}
        return ModelBasedDraftLength(cost_ratio=cost_ratio, verify_cost=verify_cost, max_k=max(verify_cost))

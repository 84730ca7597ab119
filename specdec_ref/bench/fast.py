"""The fast path in the benchmark: its pass costs against the bandwidth floor, and its predictions.

`python -m specdec_ref.bench` adds, where the fast path can run the pair
(`fast.static_unsupported`), arms whose models both decode through
`fast.StaticForward` (a static KV cache; CUDA graphs on a GPU): "specdec_ref
autoregressive fast" (the target alone, a target-only configuration the baseline may
be), "specdec_ref k=K fast" and "specdec_ref model fast". On CUDA, `generate` also
runs with a static cache, which `transformers` compiles with `torch.compile`
(`cache_implementation="static"`: its documented fast path), as a baseline variant.

`measure_fast_costs` times what the performance model needs, on the fast path and
eagerly, side by side: the target's 1-token step, its (K + 1)-token pass (v(K)), the
draft's step (c), and each step against its bandwidth floor, the time its weights
take to stream at the bandwidth `measure.measure_bandwidth` finds on the device.
`predictions` turns them into the speedup the chapter 6 model predicts at a few
alphas, over the fastest target-only baseline of the run.

`gpt2_shapes_pair` builds random-init models of the article's shapes (GPT-2, 12 x
768, as the draft; GPT-2 XL, 48 x 1600, as the target; GPT-2's vocabulary and
context). Their alpha is that of two unrelated random models, near zero, not a real
pair's: the costs are real, the acceptance is not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel

from ..analysis import expected_speedup, optimal_draft_length
from ..fast import StaticForward, static_unsupported
from ..kv_cache import CachedForward, LogitsSource
from ..measure import measure_bandwidth
from ..timing import time_call
from ..validation import vocab_size
from .pair import BenchPair, _prepared

# The alphas the report predicts at (a random pair's own alpha says nothing).
PREDICTION_ALPHAS = (0.6, 0.7, 0.8)


@dataclass(frozen=True)
class GPT2Shape:
    """Layers, width and heads of one GPT-2 family model."""

    layers: int
    width: int
    heads: int


# The article's pair: gpt2 (124M) drafts for gpt2-xl (1.56B); --quick-shapes for a CPU dry run.
ARTICLE_SHAPES = {"draft": GPT2Shape(12, 768, 12), "target": GPT2Shape(48, 1600, 25)}
DRY_RUN_SHAPES = {"draft": GPT2Shape(1, 64, 4), "target": GPT2Shape(2, 128, 4)}


def gpt2_shapes_pair(*, device: torch.device | str, dtype: torch.dtype, small: bool = False,
                     vocab: int = 50257, positions: int = 1024) -> BenchPair:
    """Random-init GPT-2 models of the article's shapes (`small`: tiny ones, for a dry run)."""
    shapes = DRY_RUN_SHAPES if small else ARTICLE_SHAPES

    def build(shape: GPT2Shape, seed: int) -> PreTrainedModel:
        torch.manual_seed(seed)
        config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=shape.width, n_layer=shape.layers,
                            n_head=shape.heads, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
        with torch.device(device):  # initialise where the model will run (fast on a GPU)
            return GPT2LMHeadModel(config).to(dtype).eval()

    draft, target = build(shapes["draft"], 1), build(shapes["target"], 2)
    description = (f"random-init GPT-2 shapes: target {shapes['target'].layers} x {shapes['target'].width}, "
                   f"draft {shapes['draft'].layers} x {shapes['draft'].width}, vocab {vocab} (unrelated random "
                   "weights: alpha is near zero, not a real pair's)")
    return _prepared(BenchPair(target, draft, None, "gpt2-shapes", description))


def fast_unsupported(pair: BenchPair) -> str | None:
    """Why the fast arms cannot run on `pair` (None when they can)."""
    for role, model in (("target", pair.target_model), ("draft", pair.draft_model)):
        reason = static_unsupported(model)
        if reason is not None:
            return f"{role}: {reason}"
    return None


def _step_seconds(source: LogitsSource, sequence: torch.Tensor, context: int, num_tokens: int,
                  repeats: int, device: torch.device) -> float:
    """Median time of one pass of `num_tokens` tokens after `context` cached ones."""

    def one_pass() -> None:
        source.last_logits(sequence[:, :context + num_tokens], num_tokens)
        source.rollback(context)

    return time_call(one_pass, repeats=repeats, warmup=3, device=device).median


def _param_bytes(model: PreTrainedModel) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def measure_fast_costs(pair: BenchPair, *, context: int, max_k: int = 8, repeats: int = 20) -> dict:
    """Step times of both models on the fast path and eagerly, c, v(K), and the bandwidth floor.

    Returns a dictionary for the report: per path ("fast", "eager") the target's and the
    draft's 1-token step in ms, c, v(K) for K = 1..max_k; the device bandwidth measured
    by a large copy; each model's weight bytes, floor (bytes / bandwidth) and the floor
    over each step time (1 = the step runs at the speed of memory).
    """
    device = pair.device
    length = context + max_k + 1
    sequence = torch.randint(1, vocab_size(pair.target_model), (1, length),
                             generator=torch.Generator().manual_seed(0)).to(device)  # (1, length)
    paths = {
        "fast": {role: StaticForward(model, max_length=length, max_graph_tokens=max_k + 1)
                 for role, model in (("target", pair.target_model), ("draft", pair.draft_model))},
        "eager": {"target": CachedForward(pair.target_model), "draft": CachedForward(pair.draft_model)},
    }
    bandwidth = measure_bandwidth(device=device, num_bytes=2**28 if device.type == "cuda" else 2**26).bytes_per_s
    floors = {role: _param_bytes(getattr(pair, f"{role}_model")) / bandwidth for role in ("target", "draft")}
    report = {"bandwidth_gb_s": bandwidth / 1e9, "context": context,
              "weight_gb": {role: _param_bytes(getattr(pair, f"{role}_model")) / 1e9 for role in floors},
              "floor_ms": {role: 1000 * floor for role, floor in floors.items()}}
    for name, sources in paths.items():
        for source in sources.values():
            source.last_logits(sequence[:, :context], 1)  # fill the cache
        target_s = _step_seconds(sources["target"], sequence, context, 1, repeats, device)
        draft_s = _step_seconds(sources["draft"], sequence, context, 1, repeats, device)
        # Each v(K) divides two timings taken back to back, so a drift of the machine
        # affects both about equally.
        verify = {k: _step_seconds(sources["target"], sequence, context, k + 1, repeats, device)
                  / _step_seconds(sources["target"], sequence, context, 1, repeats, device)
                  for k in range(1, max_k + 1)}
        report[name] = {
            "target_ms": 1000 * target_s, "draft_ms": 1000 * draft_s, "cost_ratio": draft_s / target_s,
            "verify_cost": {str(k): v for k, v in verify.items()},
            "target_floor_fraction": floors["target"] / target_s, "draft_floor_fraction": floors["draft"] / draft_s,
            "target_over_floor": target_s / floors["target"],
            "cuda_graphs": name == "fast" and sources["target"].cuda_graphs,
        }
    return report


def predictions(costs: dict, *, fast_tokens_per_s: float | None, baseline_tokens_per_s: float | None,
                max_k: int = 8) -> dict:
    """The chapter 6 model's speedup at each alpha of `PREDICTION_ALPHAS`, on each path.

    Per path and alpha: the best K and the speedup over that path's own target step;
    for the fast path also over the run's fastest target-only baseline (the model's
    speedup times the fast target-only arm's tokens/s over the baseline's).
    """
    out = {}
    for path in ("fast", "eager"):
        c = costs[path]["cost_ratio"]
        verify = {int(k): v for k, v in costs[path]["verify_cost"].items()}
        rows = {}
        for alpha in PREDICTION_ALPHAS:
            k = optimal_draft_length(alpha, c, max_k=max_k, verify_cost=verify)
            speedup = expected_speedup(alpha, k, c, verify)
            row = {"k": k, "speedup_over_own_step": speedup}
            if path == "fast" and fast_tokens_per_s and baseline_tokens_per_s:
                row["speedup_over_baseline"] = speedup * fast_tokens_per_s / baseline_tokens_per_s
            rows[str(alpha)] = row
        out[path] = rows
    return out


def compiled_generate_error(pair: BenchPair, prompt: torch.Tensor, max_new_tokens: int) -> str | None:
    """Try `generate` with a static cache (which transformers compiles on a GPU) once; the
    error it raised, or None when it ran (the compile then happened here, untimed)."""
    try:
        with torch.no_grad():
            pair.target_model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False,
                                       attention_mask=torch.ones_like(prompt), cache_implementation="static")
    except Exception as error:  # any failure leaves the variant out, with the reason in the report
        return f"{type(error).__name__}: {error}"[:300]
    return None


def fast_section(costs: dict, summaries: list[dict], baselines: dict[str, str], *, max_k: int = 8) -> dict:
    """The report's "fast_path": the measured costs, and per mode the model's predictions
    over the fastest target-only baseline next to the best measured fast arm."""
    section = dict(costs)
    section["modes"] = {}
    for mode, baseline in baselines.items():
        rate = {s["name"]: s["tokens_per_s"]["median"] for s in summaries if s["mode"] == mode}
        fast_arms = [s for s in summaries if s["mode"] == mode and s.get("fast") and s["schedule"] is not None]
        best = max(fast_arms, key=lambda s: s["speedup"], default=None)
        assisted = max((rate[s["name"]] for s in summaries
                        if s["mode"] == mode and s["impl"] == "transformers" and s["schedule"] is not None),
                       default=None)
        section["modes"][mode] = {
            "baseline": baseline,
            "predictions": predictions(costs, fast_tokens_per_s=rate.get("specdec_ref autoregressive fast"),
                                       baseline_tokens_per_s=rate[baseline], max_k=max_k),
            "best_fast_arm": best and best["name"], "best_fast_speedup": best and best["speedup"],
            "best_fast_over_assisted": best and assisted and rate[best["name"]] / assisted,
        }
    return section

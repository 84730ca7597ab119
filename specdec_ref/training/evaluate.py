"""Measure a trained draft / target pair and write its model card.

Used by `train` right after training (and by `python -m specdec_ref.training --eval-only`). Every figure
is measured on the saved folders exactly as `load_pair` returns them (float32, CPU), on
text the models never saw:

* held-out perplexity of each model;
* the acceptance rate alpha (accepted / drafted tokens) and the tokens per target call of
  `speculative_generate` with K = 4, greedy and at temperature 1, on held-out prompts,
  and whether greedy speculative output equals the target's own greedy output;
* per-token latencies (batch 1, KV cache, one thread) and the cost ratio c.

Invariant: the card quotes `metrics.json` and nothing else; no figure is typed by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..acceptance import measure_alpha
from ..decoder import GenerationStats, autoregressive_generate, speculative_generate
from ..fast.lean import lean_pass_seconds
from ..measure import measure_pass_latency
from ..models import load_pair_from_folder
from ..sampling import SamplingConfig
from ..timing import cpu_name
from .config import TrainConfig
from .corpus import held_out_prompts


@torch.no_grad()
def perplexity(model: PreTrainedModel, ids: torch.Tensor, context: int) -> float:
    """exp(mean next-token loss) over consecutive windows of `ids` (N,)."""
    total, count = 0.0, 0
    for start in range(0, ids.numel() - 1, context):
        window = ids[start : start + context + 1][None]  # (1, <= T + 1)
        if window.size(1) < 2:
            break
        logits = model(window[:, :-1]).logits[0]  # (T, V)
        total += F.cross_entropy(logits.float(), window[0, 1:], reduction="sum").item()
        count += window.size(1) - 1
    return math.exp(total / count)


def latencies_ms(timers: dict[str, Callable[[], float]], *, rounds: int = 5) -> dict[str, float]:
    """Median milliseconds per name, of `rounds` calls of its timer (which returns seconds).

    Rounds are interleaved, which spreads the noise of a shared machine evenly over the
    passes, so their ratio (the cost ratio c) is steadier than with one long run each.
    """
    medians: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            medians[name].append(timer() * 1e3)
    return {name: sorted(values)[len(values) // 2] for name, values in medians.items()}


def cached_pass_seconds(model: PreTrainedModel, new: int, length: int, repeats: int = 20) -> float:
    """Median seconds of one cached pass over `new` tokens that brings the sequence to `length`."""
    curve = measure_pass_latency(model, context=length - new, num_tokens=(new,), repeats=repeats, warmup=3)
    return curve.median_s[0]


def evaluate_tiny(out: Path, held_out_ids: torch.Tensor, config: TrainConfig) -> dict:
    """Measure the saved pair as `load_pair` returns it (float32, CPU) on held-out text."""
    draft, target, tokenizer = load_pair_from_folder(out, device="cpu", dtype=torch.float32)
    ids = held_out_ids[: config.eval_tokens]  # (n_eval,)
    metrics: dict = {"perplexity": {"target": perplexity(target, ids, config.context),
                                    "draft": perplexity(draft, ids, config.context), "tokens": ids.numel()}}
    # Acceptance with the package's own decoder, K = 4, on prompts the models never saw.
    prompts = held_out_prompts(tokenizer, num_prompts=config.num_prompts, prompt_tokens=32, config=config.corpus)
    acceptance, generator = {}, torch.Generator().manual_seed(config.seed)
    for label, sampling in (("greedy", SamplingConfig(temperature=0.0)), ("temperature_1", SamplingConfig())):
        total, matches = GenerationStats(), 0
        for prompt in prompts:
            result = speculative_generate(target, draft, prompt, max_new_tokens=config.new_tokens,
                                          num_draft_tokens=4, sampling=sampling, generator=generator)
            total += result.stats
            if sampling.greedy:
                baseline = autoregressive_generate(target, prompt, max_new_tokens=config.new_tokens, sampling=sampling)
                matches += int(torch.equal(baseline.sequences, result.sequences))
        # alpha three ways: per judged draft (the per-token chance of the analysis chapter),
        # E[beta] = E[sum min(p, q)] over target-generated text, and accepted / drafted.
        beta = measure_alpha(target, draft, prompts, max_new_tokens=config.new_tokens, sampling=sampling,
                             generator=torch.Generator().manual_seed(config.seed))
        acceptance[label] = {"alpha": total.per_token_acceptance, "alpha_beta": beta.alpha,
                             "accepted_per_drafted": total.acceptance_rate,
                             "tokens_per_target_call": total.tokens_per_target_call}
        if sampling.greedy:
            acceptance[label]["matches_target_greedy"] = f"{matches}/{len(prompts)}"
    metrics["acceptance"] = {"num_draft_tokens": 4, "prompts": len(prompts), "prompt_tokens": 32,
                             "new_tokens": config.new_tokens, **acceptance}
    # Latencies: batch 1, KV cache, a 128-token prefix, one thread (small models are overhead-bound).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    prefix = held_out_ids[: min(128, config.context - 8)][None]  # (1, n)
    length = prefix.size(1)
    latency = latencies_ms({
        "draft_1_token": lambda: cached_pass_seconds(draft, 1, length),
        # The same weights through lean.LeanForward, without the framework's per-call work.
        "draft_1_token_lean": lambda: lean_pass_seconds(draft, length - 1),
        "target_1_token": lambda: cached_pass_seconds(target, 1, length),
        "target_5_tokens": lambda: cached_pass_seconds(target, 5, length)})
    torch.set_num_threads(threads)
    latency["cost_ratio_c"] = latency["draft_1_token"] / latency["target_1_token"]
    latency["cost_ratio_c_lean"] = latency["draft_1_token_lean"] / latency["target_1_token"]
    metrics["latency_ms"] = {"cpu": cpu_name(), "threads": 1, "prefix_tokens": prefix.size(1), **latency}
    # A sample from each model on a hand-written prompt (not corpus text), greedy.
    prompt = 'import os\n\n\ndef read_config(path):\n    """'
    ids = tokenizer(prompt, return_tensors="pt").input_ids  # (1, n)
    metrics["samples"] = {"prompt": prompt}
    for name, model in (("target", target), ("draft", draft)):
        budget = min(48, model.config.max_position_embeddings - ids.size(1))  # quick runs have short contexts
        sequence = autoregressive_generate(model, ids, max_new_tokens=budget, sampling=SamplingConfig(temperature=0.0))
        metrics["samples"][name] = tokenizer.decode(sequence.sequences[0])
    metrics["size_bytes"] = {name: (out / name / "model.safetensors").stat().st_size for name in ("target", "draft")}
    return metrics


def write_card(out: Path, m: dict) -> None:
    """The model card `README.md`, filled in from the measured `metrics`."""
    c, corpus, acc, lat = m["config"], m["corpus"], m["acceptance"], m["latency_ms"]
    t, d = c["target"], c["draft"]
    shape = "{layers} x {width}, {heads} heads ({kv_heads} key/value), SwiGLU {ffn}"
    tokens_seen = {s: c[f"{s}_steps"] * c["batch_size"] * c["context"] for s in ("target", "draft")}
    draft_recipe = "distilled from the target, KL(p \\|\\| q)" if c["distill"] else "cross-entropy on the text"
    mb = {k: v / 1e6 for k, v in m["size_bytes"].items()}
    text = f"""# The embedded tiny pair

A draft / target pair of Llama-style causal LMs that ships inside `specdec_ref`, loads offline
with `AutoModelForCausalLM.from_pretrained` and runs on a laptop CPU in milliseconds per token.
Load it with `specdec_ref.load_pair("tiny")`. Every number below was measured by
`python -m specdec_ref.training`, which wrote this card (and `metrics.json`, `training_log.csv`).

## Corpus
The Python {corpus["python"]} installation's own text, nothing downloaded and nothing committed
(`specdec_ref.training.corpus`): the documentation topics of `pydoc_data.topics` and the standard library's
source files (code, comments, docstrings; no test suites, codec tables or site-packages).
Documents are split by a hash of their name: {corpus["train_documents"]} train documents
({corpus["train"] / 1e6:.1f} M characters, {corpus["train_tokens"] / 1e6:.2f} M tokens) and
{corpus["held_out_documents"]} held-out documents ({corpus["held_out_tokens"] / 1e3:.0f} k tokens).

## Models
| | target | draft |
|---|---|---|
| layers x width | {shape.format(**t)} | {shape.format(**d)} |
| parameters (embeddings tied) | {m["params"]["target"] / 1e6:.2f} M | {m["params"]["draft"] / 1e6:.2f} M |
| file (float16 safetensors) | {mb["target"]:.1f} MB | {mb["draft"]:.1f} MB |
| training | {c["target_steps"]} steps, cross-entropy | {c["draft_steps"]} steps, {draft_recipe} |
| tokens seen | {tokens_seen["target"] / 1e6:.1f} M | {tokens_seen["draft"] / 1e6:.1f} M |
| training time | {m["seconds"]["target"] / 60:.1f} min | {m["seconds"]["draft"] / 60:.1f} min |
| held-out perplexity | {m["perplexity"]["target"]:.2f} | {m["perplexity"]["draft"]:.2f} |
| latency per token (KV cache, batch 1) | {lat["target_1_token"]:.2f} ms | {lat["draft_1_token"]:.2f} ms |

Shared tokenizer: byte-level BPE, {c["vocab_size"]} tokens, `<|endoftext|>` as BOS/EOS/padding.
Context: {c["context"]} positions. Training: AdamW (0.9, 0.95), weight decay {c["weight_decay"]},
batches of {c["batch_size"]} x {c["context"]} tokens, peak learning rates {c["target_lr"]} (target) and
{c["draft_lr"]} (draft), {c["warmup_steps"]} warm-up steps then cosine decay, bfloat16 autocast: {c["bf16"]},
seed {c["seed"]}, device `{m["device"]}` ({m["torch_threads"]} thread(s), torch {m["torch"]}).
Total time including tokenizer and data: {m["seconds"]["total_training"] / 60:.1f} min.
Perplexity is measured on the first {m["perplexity"]["tokens"]} held-out tokens, float32.

## Speculative decoding with this pair
`speculative_generate` with K = {acc["num_draft_tokens"]} on {acc["prompts"]} held-out prompts of
{acc["prompt_tokens"]} tokens, {acc["new_tokens"]} new tokens each. alpha is the chance that one drafted token
is accepted (the alpha of the analysis chapter), estimated as accepted / judged drafts (drafts after
a rejection are never judged); E[beta] = E[sum_x min(p(x), q(x))] estimates it directly from p and q
(`acceptance.measure_alpha`); accepted / drafted is the decoder's `acceptance_rate`, lower by construction.

| sampling | alpha | E[beta] | accepted / drafted | tokens per target call |
|---|---|---|---|---|
| greedy | {acc["greedy"]["alpha"]:.3f} | {acc["greedy"]["alpha_beta"]:.3f} | \
{acc["greedy"]["accepted_per_drafted"]:.3f} | {acc["greedy"]["tokens_per_target_call"]:.2f} |
| temperature 1 | {acc["temperature_1"]["alpha"]:.3f} | {acc["temperature_1"]["alpha_beta"]:.3f} | \
{acc["temperature_1"]["accepted_per_drafted"]:.3f} | {acc["temperature_1"]["tokens_per_target_call"]:.2f} |

Greedy speculative output equal to the target's own greedy output: {acc["greedy"]["matches_target_greedy"]} prompts.
Latencies on this machine ({lat["cpu"]}, {lat["threads"]} thread, batch 1, KV cache over a
{lat["prefix_tokens"]}-token prefix, median of 5 interleaved rounds of 20 calls): draft
{lat["draft_1_token"]:.3f} ms and target {lat["target_1_token"]:.3f} ms per token, target
{lat["target_5_tokens"]:.3f} ms for a 5-token verification pass; cost ratio c = {lat["cost_ratio_c"]:.3f}.
The draft's pass through `specdec_ref.fast.lean.LeanForward` (the same weights without the framework's
per-call work) takes {lat["draft_1_token_lean"]:.3f} ms: c = {lat["cost_ratio_c_lean"]:.3f}.

## Samples
Greedy continuations of a hand-written prompt, 48 tokens each. Target:
```python
{m["samples"]["target"]}
```
Draft:
```python
{m["samples"]["draft"]}
```

## Reproduce
`python -m specdec_ref.training` (options: `--help`). The text is derived from Python's
documentation and standard library, distributed under the PSF License.
"""
    if m.get("notes"):
        text += "\n## Notes\n" + "\n".join(f"- {note}" for note in m["notes"]) + "\n"
    (out / "README.md").write_text(text)

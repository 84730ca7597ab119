"""Two ways to time speculative decoding against `generate`: the article's and a fair one.

The article times one call of its speculative loop, then one call of the target's
`generate(do_sample=True)`, each with `time.time()`, and prints the ratio. Four things
make that number unreliable (the performance chapter measures each):

* the baseline samples with `generate`'s default top_k=50 while the speculative path
  samples the full distribution: different work, and different distributions;
* no warm-up: the first call in a process pays one-time costs (kernel selection,
  allocations, on a GPU the CUDA context and library handles), and the speculative
  call comes first;
* a fixed order, so the second call always meets the machine the first one left;
* one repeat: a single wall-clock reading on a machine that other programs share.

`article_timing` follows that protocol with this package's decoder, so that only the
method differs; `fair_timing` times the same two calls the way `run` times its arms:
the same sampling settings spelled out for both, EOS off so both produce the same
number of tokens, a warm-up, alternating order, repetitions, medians, the device
synchronized. `python -m specdec_ref.bench.methods` runs the article's protocol in a
fresh process, where its cold start really happens, and prints the result as JSON.

Invariant: both functions time the same decoder call with the same `max_new_tokens`
and K; they differ only in how the baseline is set up and how the clock is read.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel

from ..decoder import speculative_generate
from ..sampling import SamplingConfig
from ..timing import Timing, time_call

# The article's comparison: K = 3 drafts, 128 new tokens, temperature 1 (its defaults
# in `compare_methods`), on a prompt any of the book's pairs can continue.
ARTICLE_K = 3
ARTICLE_TOKENS = 128
PROMPT = "The for statement is used to iterate over the elements of a sequence"


@dataclass(frozen=True)
class ArticleTiming:
    """One speculative call, then one `generate` call, each timed once."""

    speculative_s: float  # wall time of the speculative call (the first)
    baseline_s: float  # wall time of the `generate` call that followed
    speculative_tokens: int  # new tokens of the speculative call
    baseline_tokens: int  # new tokens of `generate` (it may stop at an EOS)

    @property
    def speedup(self) -> float:
        """What the article prints: baseline seconds / speculative seconds."""
        return self.baseline_s / self.speculative_s


@dataclass(frozen=True)
class FairTiming:
    """Both calls timed alike: warm-up, alternating order, medians."""

    speculative: Timing  # seconds per speculative call, one per repetition
    baseline: Timing  # seconds per `generate` call, one per repetition
    max_new_tokens: int  # tokens every call produced

    @property
    def speedup(self) -> float:
        """Median baseline seconds / median speculative seconds."""
        return self.baseline.median / self.speculative.median

    @property
    def repeat_speedups(self) -> tuple[float, ...]:
        """The ratio each repetition alone would have reported."""
        pairs = zip(self.baseline.samples, self.speculative.samples,
                    strict=True)
        return tuple(b / s for b, s in pairs)


def article_timing(target_model: PreTrainedModel,
                   draft_model: PreTrainedModel, input_ids: torch.Tensor, *,
                   max_new_tokens: int = ARTICLE_TOKENS,
                   num_draft_tokens: int = ARTICLE_K,
                   seed: int = 0) -> ArticleTiming:
    """The article's protocol: speculative first, then `generate`, once each.

    Args:
        target_model, draft_model: the pair, in eval mode on one device.
        input_ids: the prompt, shape (1, n).
        max_new_tokens: tokens asked of both calls.
        num_draft_tokens: K of the speculative call.
        seed: seeds both calls' sampling.

    Returns:
        An `ArticleTiming`; its `speedup` is the number the article prints.
    """
    n = input_ids.size(1)
    generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    # The article's clock: time.time(), no warm-up, no synchronization.
    start = time.time()
    out = speculative_generate(target_model, draft_model, input_ids,
                               max_new_tokens=max_new_tokens,
                               num_draft_tokens=num_draft_tokens,
                               sampling=SamplingConfig(temperature=1.0),
                               generator=generator)
    speculative_s = time.time() - start
    # do_sample=True and nothing else: generate's defaults apply (top_k=50),
    # and it stops at an EOS, as the article's baseline does.
    config = target_model.generation_config
    pad = (config.pad_token_id if config.pad_token_id is not None
           else config.eos_token_id)
    torch.manual_seed(seed)
    start = time.time()
    baseline = target_model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens, do_sample=True,
        pad_token_id=pad)  # (1, n + new)
    baseline_s = time.time() - start
    return ArticleTiming(speculative_s, baseline_s,
                         out.sequences.size(1) - n, baseline.size(1) - n)


def fair_timing(target_model: PreTrainedModel,
                draft_model: PreTrainedModel, input_ids: torch.Tensor, *,
                max_new_tokens: int = ARTICLE_TOKENS,
                num_draft_tokens: int = ARTICLE_K,
                sampling: SamplingConfig = SamplingConfig(temperature=1.0),
                repeats: int = 5, warmup: int = 1,
                seed: int = 0) -> FairTiming:
    """Time the same two calls fairly: same settings, EOS off, warm-up, turns.

    Args:
        target_model, draft_model: the pair, in eval mode on one device.
        input_ids: the prompt, shape (1, n).
        max_new_tokens: tokens every call produces (both ignore EOS).
        num_draft_tokens: K of the speculative call.
        sampling: the settings of both calls (spelled out for `generate`:
            no top-k unless asked).
        repeats: timed calls of each; the order alternates every repetition.
        warmup: untimed calls of each first.
        seed: seeds the sampling of every call.

    Returns:
        A `FairTiming`: one timing sample per repetition for each call.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got "
                         f"{repeats!r} and {warmup!r}")
    n, device = input_ids.size(1), input_ids.device
    # One generation config holds every setting of the baseline: the
    # sampling spelled out, and no EOS, so every call gives max_new_tokens.
    config = copy.deepcopy(target_model.generation_config)
    config.update(max_new_tokens=max_new_tokens, eos_token_id=None,
                  **sampling.generate_kwargs())
    if config.pad_token_id is None:
        config.pad_token_id = 0

    def speculative() -> int:
        generator = torch.Generator(device=device).manual_seed(seed)
        out = speculative_generate(target_model, draft_model, input_ids,
                                   max_new_tokens=max_new_tokens,
                                   num_draft_tokens=num_draft_tokens,
                                   sampling=sampling, generator=generator)
        return out.sequences.size(1) - n

    def baseline() -> int:
        torch.manual_seed(seed)
        out = target_model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids),
            generation_config=config)  # (1, n + new)
        return out.size(1) - n

    calls = {"speculative": speculative, "baseline": baseline}
    for call in calls.values():
        for _ in range(warmup):
            if call() != max_new_tokens:
                raise RuntimeError("a call produced other than "
                                   f"max_new_tokens={max_new_tokens} tokens")
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for repeat in range(repeats):
        order = list(calls) if repeat % 2 == 0 else list(reversed(calls))
        for name in order:
            timing = time_call(calls[name], repeats=1, warmup=0,
                               device=device)
            samples[name] += timing.samples
    return FairTiming(Timing(tuple(samples["speculative"])),
                      Timing(tuple(samples["baseline"])), max_new_tokens)


def main(argv: list[str] | None = None) -> dict:
    """Load a pair in this (fresh) process, run the article's protocol once, print JSON."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench.methods",
                                     description="the article's timing protocol, run once in a fresh process")
    parser.add_argument("--pair", default="tiny")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: load_pair's choice")
    parser.add_argument("--device", help="default: cuda when available, else cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--max-new-tokens", type=int, default=ARTICLE_TOKENS)
    parser.add_argument("--k", type=int, default=ARTICLE_K)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    from ..models import load_pair

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    dtype = getattr(torch, args.dtype) if args.dtype else None
    draft_model, target_model, tokenizer = load_pair(args.pair, device=args.device, dtype=dtype)
    input_ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(target_model.device)  # (1, n)
    with torch.no_grad():
        result = article_timing(target_model.eval(), draft_model.eval(), input_ids,
                                max_new_tokens=args.max_new_tokens, num_draft_tokens=args.k, seed=args.seed)
    report = {**asdict(result), "speedup": result.speedup, "pair": args.pair,
              "device": str(target_model.device), "dtype": str(target_model.dtype).removeprefix("torch.")}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()

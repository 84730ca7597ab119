"""`python -m specdec_ref`: watch speculative decoding work on a small pair, then time it.

The demo loads the embedded tiny pair (or, with `--pair random`, random-init models of
its shapes), puts it on the fast path the README's snippet uses (`fast.prepare`, which
says what it chose; `--plain` keeps the models as loaded), runs `speculative_generate`
on one held-out prompt and
prints every iteration: the K tokens the draft proposed, how many the target accepted,
and the correction or bonus token it added (`specdec_ref.trace`); then the continuation
with each token's origin marked. Then the counters, a check against the
target's own greedy `generate`, and the measured speed against the target alone
(`autoregressive_generate` with its KV cache, and `transformers`' `generate` with
`scaled_dot_product_attention`, its fastest attention here), each timed after a
warm-up, as the median of several runs.

For the full comparison (assisted generation, every K, sampling modes, spreads) run
`python -m specdec_ref.bench`.
"""

from __future__ import annotations

import argparse

import torch

from .bench.default_path import attention
from .bench.pair import BenchPair, bench_prompts, load_bench_pair
from .decoder import autoregressive_generate, speculative_generate
from .fast import FastPair, prepare
from .sampling import SamplingConfig
from .timing import time_call
from .trace import iteration_lines, legend, marked_text, show_tokens, stats_lines


def time_against_target(pair: BenchPair, fast: FastPair, prompt: torch.Tensor, *, max_new_tokens: int, k: int,
                        sampling: SamplingConfig, repeats: int, seed: int) -> dict[str, float]:
    """Tokens per second of the speculative decoder and of the target alone (median of `repeats`)."""
    target, draft = fast.target, fast.draft

    def sdpa_generate() -> torch.Tensor:
        with attention(pair.target_model, "sdpa"):
            return pair.target_model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                              max_new_tokens=max_new_tokens, **sampling.generate_kwargs())

    def generator() -> torch.Generator:
        return torch.Generator(device=pair.device).manual_seed(seed)

    calls = {
        f"specdec_ref speculative (K={k}, KV cache)": lambda: speculative_generate(
            target, draft, prompt, max_new_tokens=max_new_tokens, num_draft_tokens=k, sampling=sampling,
            generator=generator()),
        "target alone, specdec_ref (KV cache)": lambda: autoregressive_generate(
            target, prompt, max_new_tokens=max_new_tokens, sampling=sampling, generator=generator()),
        "target alone, transformers generate (sdpa)": sdpa_generate,
    }
    with torch.no_grad():
        return {name: max_new_tokens / time_call(fn, repeats=repeats, warmup=1, device=pair.device).median
                for name, fn in calls.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdec_ref", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny", help="tiny (default) or random (random-init models of its shapes)")
    parser.add_argument("--k", type=int, default=4, help="tokens drafted per iteration (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per method (default 5)")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="the models as loaded, not fast.prepare's path")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sampling = SamplingConfig(temperature=args.temperature)

    pair = load_bench_pair(args.pair, device=device)
    print(f"pair: {pair.description}")
    if args.plain:
        fast = FastPair(pair.target_model, pair.draft_model, pair.target_model, pair.draft_model,
                        {"models": "as loaded (--plain)"})
    else:
        fast = prepare(pair.draft_model, pair.target_model, max_length=24 + args.max_new_tokens)
    print(fast.describe())
    [prompt], source = bench_prompts(pair, 1, prompt_tokens=24, seed=args.seed)
    print(f"prompt ({source}, {prompt.size(1)} tokens): {show_tokens(prompt[0].tolist(), pair.tokenizer)}")
    print(f"speculative decoding, K = {args.k}, {sampling}, KV cache on, {args.max_new_tokens} new tokens\n")

    generator = torch.Generator(device=pair.device).manual_seed(args.seed)
    output = speculative_generate(fast.target, fast.draft, prompt, max_new_tokens=args.max_new_tokens,
                                  num_draft_tokens=args.k, sampling=sampling, generator=generator)
    print("\n".join(iteration_lines(output.trace, pair.tokenizer, width=120)))
    print(f"\nthe continuation, each token's origin marked:\n{legend(output.trace)}\n")
    print(marked_text(output.trace, pair.tokenizer, width=120))
    print()
    print("\n".join(stats_lines(output.stats)))
    if sampling.greedy:
        with torch.no_grad():
            reference = pair.target_model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                                   max_new_tokens=args.max_new_tokens, **sampling.generate_kwargs())
        same = torch.equal(reference.cpu(), output.sequences.cpu())
        print(f"identical to the target's own greedy generate: {'yes' if same else 'NO'}")

    print(f"\nspeed, {args.max_new_tokens} new tokens, median of {args.repeats} runs after a warm-up:")
    rates = time_against_target(pair, fast, prompt, max_new_tokens=args.max_new_tokens, k=args.k, sampling=sampling,
                                repeats=args.repeats, seed=args.seed)
    ours, *alone = rates
    print(f"  {ours:<42} {rates[ours]:8.1f} tokens/s")
    for name in alone:
        print(f"  {name:<42} {rates[name]:8.1f} tokens/s   speculative speedup: {rates[ours] / rates[name]:.2f}x")


if __name__ == "__main__":
    main()

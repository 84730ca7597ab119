"""Auditing drafting with another tokenizer: every token at T = 1, greedy token for token (chapter 9).

A draft with its own tokenizer changes what is proposed, never the rule that judges
it, so the output must still follow the target's law. This module checks that on
the embedded cross pair (`load_pair("tiny-cross")`), for this package and for
`transformers`:

* sampled (T = 1, top-k and top-p off): `audit_tokens.audit_every_token` of
  `SharedVocabDrafter` and `TextDrafter` through `speculative_generate`, and of
  `transformers`' own cross-tokenizer sampling, `generate(assistant_model=...,
  tokenizer=..., assistant_tokenizer=..., do_sample=True)` (in 5.24 its
  `UniversalSpeculativeDecodingGenerator`), each audited against its own processing
  (`laws.generate_reference` for `transformers`; the same law at these settings);
* greedy: `transformers`' cross-tokenizer greedy generate (its
  `AssistedCandidateGeneratorDifferentTokenizers`) and both of our drafters against
  the target's own greedy `generate`, token for token, over many prompts.

A crash is a verdict: it is recorded with its message, never hidden, and never stops
the audit (`peer.call_peer`: the error's first line, with the `transformers` version).
`transformers` draws from torch's global generator, so each of its calls reseeds it
from the audit's generator; its assistant drafts a constant K (as `laws.transformers_assisted`).

Usage: python -m specdec_ref.bench.vocab_audit [--out specdec_ref/data/ch9-audit.json] [--num-runs 64]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers

from ..audit_tokens import audit_every_token
from ..cross_vocab.drafting import SharedVocabDrafter, TextDrafter
from ..cross_vocab.tokenizers import shared_vocabulary
from ..decoder import speculative_generate
from ..laws import GenerateFn, generate_reference
from ..models import CrossPair, load_pair
from ..peer import call_peer, first_line
from ..reports import REPORTS_DIR
from ..sampling import SamplingConfig
from ..timing import cpu_name
from ..training.corpus import held_out_prompts

SAMPLED = SamplingConfig(temperature=1.0)  # top-k and top-p off
GREEDY = SamplingConfig(temperature=0.0)
DEFAULT_OUT = REPORTS_DIR / "ch9-audit.json"


@dataclass
class VocabAuditConfig:
    """What defines an audit run."""

    num_runs: int = 64  # calls per sampled audit (the audit module recommends >= 32 and >= 2,000 tokens)
    max_new_tokens: int = 64  # tokens per sampled call
    num_draft_tokens: int = 4  # K, ours and transformers' (constant)
    greedy_prompts: int = 16  # prompts of the greedy check
    greedy_new_tokens: int = 64  # tokens per greedy call
    prompt_tokens: int = 32  # tokens per held-out prompt
    seed: int = 0  # seeds the prompts and the audits' generators
    level: float = 1e-3  # the probability that an exact decoder fails an audit


def ours(pair: CrossPair, kind: str, sampling: SamplingConfig, config: VocabAuditConfig) -> GenerateFn:
    """This package's `speculative_generate` with a cross drafter ("shared_vocab" or "text")."""
    k, eos = config.num_draft_tokens, pair.tokenizer.eos_token_id
    if kind == "shared_vocab":
        drafter = SharedVocabDrafter(pair.draft_model, pair.tokenizer, pair.draft_tokenizer, sampling=sampling,
                                     num_draft_tokens=k)
    elif kind == "text":
        drafter = TextDrafter(pair.draft_model, pair.tokenizer, pair.draft_tokenizer, k)
    else:
        raise ValueError(f"kind must be 'shared_vocab' or 'text', got {kind!r}")

    def generate(input_ids: torch.Tensor, generator: torch.Generator | None, max_new_tokens: int) -> object:
        drafter.generator = generator  # the shared-vocabulary draft samples with the audit's generator
        return speculative_generate(pair.target_model, drafter, input_ids, max_new_tokens=max_new_tokens,
                                    num_draft_tokens=k, sampling=sampling, generator=generator, eos_token_id=eos)

    return generate


def transformers_cross(pair: CrossPair, sampling: SamplingConfig, config: VocabAuditConfig) -> GenerateFn:
    """`transformers`' `generate` with the draft and both tokenizers (its cross-tokenizer assisted generation)."""
    assistant = pair.draft_model.generation_config
    assistant.num_assistant_tokens = config.num_draft_tokens
    assistant.num_assistant_tokens_schedule = "constant"
    assistant.assistant_confidence_threshold = 0.0
    kwargs = sampling.generate_kwargs()
    if not sampling.greedy:
        kwargs = {"do_sample": True, "temperature": sampling.temperature, "top_k": 0, "top_p": 1.0}

    def generate(input_ids: torch.Tensor, generator: torch.Generator | None, max_new_tokens: int) -> torch.Tensor:
        # generate draws from torch's global generator: reseed it from the audit's.
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        return pair.target_model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=pair.draft_model,
            tokenizer=pair.tokenizer, assistant_tokenizer=pair.draft_tokenizer, max_new_tokens=max_new_tokens,
            pad_token_id=pair.tokenizer.pad_token_id, **kwargs)

    return generate


def audit_row(name: str, generate: GenerateFn, reference: object, pair: CrossPair, prompt: torch.Tensor,
              config: VocabAuditConfig) -> dict:
    """One every-token audit at T = 1, as a report row (a crash is a failing row with its message)."""
    start = time.perf_counter()
    result = audit_every_token(
        lambda ids, generator: generate(ids, generator, config.max_new_tokens), pair.target_model, prompt,
        sampling=reference, max_new_tokens=config.max_new_tokens, num_runs=config.num_runs,
        generator=torch.Generator().manual_seed(config.seed), level=config.level,
        eos_token_id=pair.tokenizer.eos_token_id)
    pooled = {stratum: p for stratum, _, p in getattr(result, "strata", ()) if stratum.startswith("all tokens")}
    row = {"implementation": name, "sampling": "T = 1, top-k and top-p off", "passed": result.passed,
           "summary": result.summary(), "error": result.error and first_line(result.error),
           "transformers": transformers.__version__, "num_runs": config.num_runs,
           "num_samples": result.num_samples, "impossible": result.impossible, "p_value": result.p_value,
           "worst_stratum": getattr(result, "worst", None), "pooled_p_values": pooled,
           "detectable_tv": result.detectable_tv, "tv_estimate": result.tv_estimate,
           "seconds": round(time.perf_counter() - start, 1)}
    print(f"{name}: {result.summary()} ({row['seconds']} s)", flush=True)
    return row


def greedy_row(name: str, generate: Callable, references: list[torch.Tensor], prompts: list[torch.Tensor],
               config: VocabAuditConfig) -> dict:
    """Greedy, token for token against the target's own greedy `generate`, prompt by prompt."""
    start = time.perf_counter()
    matches, mismatches, error = 0, [], None
    for index, (prompt, reference) in enumerate(zip(prompts, references, strict=True)):
        outcome = call_peer(name, generate, prompt, None, config.greedy_new_tokens)
        if outcome.crashed:  # a crash is the verdict
            error = outcome.error
            break
        sequence = getattr(outcome.value, "sequences", outcome.value)
        if torch.equal(sequence, reference):
            matches += 1
            continue
        n, common = prompt.size(1), 0
        for a, b in zip(sequence[0, n:].tolist(), reference[0, n:].tolist(), strict=False):
            if a != b:
                break
            common += 1
        mismatches.append({"prompt": index, "first_difference_at": common,
                           "new_tokens": sequence.size(1) - n, "target_new_tokens": reference.size(1) - n})
    row = {"implementation": name, "prompts": len(prompts), "matches": matches,
           "passed": error is None and matches == len(prompts), "error": error, "mismatches": mismatches,
           "seconds": round(time.perf_counter() - start, 1)}
    print(f"{name} greedy: {matches}/{len(prompts)} equal to the target's greedy generate"
          f"{f', crashed: {error}' if error else ''} ({row['seconds']} s)", flush=True)
    return row


def reuse_after_sampling(config: VocabAuditConfig, prompt: torch.Tensor) -> dict:
    """What one call of `transformers`' cross-tokenizer sampling leaves in the draft model (a fresh pair):
    the modules it replaced, and whether a greedy cross-tokenizer call with that draft then runs."""
    pair = load_pair("tiny-cross", device="cpu")
    before = {name: type(module).__name__ for name, module in pair.draft_model.named_modules()}
    sampled = call_peer("generate(do_sample=True, assistant_model=..., assistant_tokenizer=...)",
                        transformers_cross(pair, SAMPLED, config), prompt,
                        torch.Generator().manual_seed(config.seed), 8)
    after = {name: type(module).__name__ for name, module in pair.draft_model.named_modules()}
    changed = {name: [before.get(name), after.get(name)] for name in sorted(set(before) | set(after))
               if before.get(name) != after.get(name)}
    error = call_peer("generate(assistant_model=..., assistant_tokenizer=...)",
                      transformers_cross(pair, GREEDY, config), prompt, None, 8).error  # reusing the draft
    print(f"after transformers' sampling the draft's modules changed: {changed}; greedy reuse: {error}", flush=True)
    head = getattr(pair.draft_model.get_output_embeddings(), "pruned_lm_head", None)
    return {"sampled_call_error": sampled.error, "draft_modules_changed": changed,
            "greedy_call_after_sampled_call_error": error,
            "transformers_shared_tokens": getattr(head, "out_features", None)}


def run_audit(config: VocabAuditConfig = VocabAuditConfig()) -> dict:
    """The sampled audits and the greedy checks, as the report."""
    started = time.perf_counter()
    pair = load_pair("tiny-cross", device="cpu")
    prompt = held_out_prompts(pair.tokenizer, num_prompts=1, prompt_tokens=config.prompt_tokens,
                              seed=config.seed)[0]
    shared = int(shared_vocabulary(pair.tokenizer, pair.draft_tokenizer).target_ids.numel())
    hf_reference = generate_reference(pair.target_model, temperature=1.0, top_k=0, top_p=1.0)
    sampled = [
        audit_row("specdec_ref SharedVocabDrafter", ours(pair, "shared_vocab", SAMPLED, config), SAMPLED, pair,
                  prompt, config),
        audit_row("specdec_ref TextDrafter", ours(pair, "text", SAMPLED, config), SAMPLED, pair, prompt, config),
        # transformers replaces the draft's embedding and head in place: it gets a pair of its own.
        audit_row("transformers generate (UniversalSpeculativeDecodingGenerator)",
                  transformers_cross(load_pair("tiny-cross", device="cpu"), SAMPLED, config), hf_reference, pair,
                  prompt, config),
    ]
    # Greedy: the target's own generate is the reference for all three.
    prompts = held_out_prompts(pair.tokenizer, num_prompts=config.greedy_prompts, prompt_tokens=config.prompt_tokens,
                               seed=config.seed + 1)
    references = [pair.target_model.generate(p, attention_mask=torch.ones_like(p), do_sample=False,
                                             max_new_tokens=config.greedy_new_tokens,
                                             pad_token_id=pair.tokenizer.pad_token_id) for p in prompts]
    greedy = [
        greedy_row("transformers generate (AssistedCandidateGeneratorDifferentTokenizers)",
                   transformers_cross(load_pair("tiny-cross", device="cpu"), GREEDY, config), references, prompts,
                   config),
        greedy_row("specdec_ref TextDrafter", ours(pair, "text", GREEDY, config), references, prompts, config),
        greedy_row("specdec_ref SharedVocabDrafter", ours(pair, "shared_vocab", GREEDY, config), references,
                   prompts, config),
    ]
    return {
        "written_by": "python -m specdec_ref.bench.vocab_audit",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "machine": cpu_name(), "threads": torch.get_num_threads(), "config": asdict(config),
        "pair": "tiny-cross: the tiny target (4096-token byte-level BPE) with the own-vocabulary draft "
                "(3072-token SentencePiece-style BPE)",
        "audit": "audit_tokens.audit_every_token (randomized PIT of every emitted token, both rankings); "
                 "level is the probability that an exact decoder fails; detectable_tv is a TV of the binned u",
        "transformers_assistant": {"num_assistant_tokens": config.num_draft_tokens,
                                   "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0},
        "shared_tokens": {"specdec_ref": shared,
                          "target_vocabulary": len(pair.tokenizer), "draft_vocabulary": len(pair.draft_tokenizer)},
        "transformers_draft_reuse": reuse_after_sampling(config, prompt),
        "level": config.level, "power": 0.9, "sampled": sampled, "greedy": greedy,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the audits and write the report (verdicts are data: a failing audit does not fail the script)."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench.vocab_audit",
                                     description=__doc__.split("\n")[0])
    defaults = VocabAuditConfig()
    for name in ("num_runs", "max_new_tokens", "num_draft_tokens", "greedy_prompts", "greedy_new_tokens",
                 "prompt_tokens", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    data = run_audit(VocabAuditConfig(**args))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out} ({data['seconds']} s)")


if __name__ == "__main__":
    main()

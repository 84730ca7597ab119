"""Measure the draft with its own tokenizer against the tiny target; write its card.

`python -m specdec_ref.training.own_vocab_card` (after `own_vocab`) writes
`pairs/tiny/own-vocab-draft/metrics.json` and `README.md` from measurements on the
pair as `load_pair("tiny-cross")` returns it: the share of the target's vocabulary
both tokenizers spell alike (by bytes, and by `transformers`' string rule), alpha and
tokens per target call through each cross-tokenizer path (K = 4, the held-out prompts
of the tiny pair's card), greedy equality, size and load time.

Invariant: the card quotes `metrics.json` and nothing else.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ..cross_vocab.drafting import SharedVocabDrafter, TextDrafter
from ..decoder import GenerationStats, autoregressive_generate, speculative_generate
from ..models import TINY_DIR, load_pair
from ..sampling import SamplingConfig
from .corpus import held_out_prompts
from .own_vocab import OWN_VOCAB_DIR

PATHS = {"text": TextDrafter, "shared": SharedVocabDrafter}


def string_rule_share(tokenizer, draft_tokenizer) -> float:
    """The share of the target's ids `transformers`' AssistantToTargetTranslator maps a draft id to."""
    from transformers.generation.candidate_generator import AssistantToTargetTranslator

    translator = AssistantToTargetTranslator(tokenizer, draft_tokenizer, target_vocab_size=len(tokenizer))
    return len(translator.target_to_assistant_input_ids) / len(tokenizer)


def load_seconds(folder: Path, repeats: int = 5) -> float:
    """Median seconds of `from_pretrained` for the model in `folder`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(num_prompts: int = 32, new_tokens: int = 64, k: int = 4, seed: int = 0) -> dict:
    """Every figure of the card, on the pair as `load_pair("tiny-cross")` returns it."""
    draft, target, tokenizer, draft_tokenizer = load_pair("tiny-cross", device="cpu")
    from ..cross_vocab.tokenizers import shared_vocabulary

    shared = shared_vocabulary(tokenizer, draft_tokenizer)
    prompts = held_out_prompts(tokenizer, num_prompts=num_prompts, prompt_tokens=32)
    eos = tokenizer.eos_token_id
    acceptance: dict = {}
    for label, sampling in (("greedy", SamplingConfig(temperature=0.0)), ("temperature_1", SamplingConfig())):
        generator = torch.Generator().manual_seed(seed)
        baselines = [autoregressive_generate(target, p, max_new_tokens=new_tokens, sampling=sampling,
                                             eos_token_id=eos).sequences for p in prompts] if sampling.greedy else []
        for path, drafter_class in PATHS.items():
            kwargs = {"sampling": sampling, "generator": generator} if path == "shared" else {}
            total, matches = GenerationStats(), 0
            for i, prompt in enumerate(prompts):
                drafter = drafter_class(draft, tokenizer, draft_tokenizer, **kwargs)
                out = speculative_generate(target, drafter, prompt, max_new_tokens=new_tokens, num_draft_tokens=k,
                                           sampling=sampling, generator=generator, eos_token_id=eos)
                total += out.stats
                matches += bool(baselines) and torch.equal(out.sequences, baselines[i])
            row = {"alpha": total.per_token_acceptance, "accepted_per_drafted": total.acceptance_rate,
                   "tokens_per_target_call": total.tokens_per_target_call}
            if sampling.greedy:
                row["matches_target_greedy"] = f"{matches}/{len(prompts)}"
            acceptance.setdefault(label, {})[path] = row
    same = json.loads((TINY_DIR / "metrics.json").read_text())["acceptance"]
    training = json.loads((OWN_VOCAB_DIR / "training.json").read_text())
    return {
        "training": training,
        "vocabulary": {"draft": len(draft_tokenizer), "target": len(tokenizer),
                       "shared": int(shared.target_ids.numel()), "share_of_target": shared.share_of_target,
                       "share_of_target_string_rule": string_rule_share(tokenizer, draft_tokenizer)},
        "acceptance": {"num_draft_tokens": k, "prompts": num_prompts, "prompt_tokens": 32,
                       "new_tokens": new_tokens, **acceptance,
                       "same_tokenizer_draft": {label: {"alpha": same[label]["alpha"],
                                                        "tokens_per_target_call": same[label]["tokens_per_target_call"]}
                                                for label in ("greedy", "temperature_1")}},
        "size_bytes": {"own_vocab_draft": (OWN_VOCAB_DIR / "model.safetensors").stat().st_size,
                       "tiny_draft": (TINY_DIR / "draft" / "model.safetensors").stat().st_size},
        "load_seconds": {"own_vocab_draft": load_seconds(OWN_VOCAB_DIR),
                         "tiny_draft": load_seconds(TINY_DIR / "draft")},
        "torch": torch.__version__,
    }


def write_card(m: dict, out: Path = OWN_VOCAB_DIR) -> None:
    """README.md beside the weights, every number from `m`."""
    t, v, a = m["training"], m["vocabulary"], m["acceptance"]
    shape = t["config"]["draft"]
    rows = []
    for label, name in (("greedy", "greedy"), ("temperature_1", "temperature 1")):
        for path, what in (("text", "text re-encoded (`TextDrafter`)"),
                           ("shared", "shared tokens (`SharedVocabDrafter`)")):
            r = a[label][path]
            rows.append(f"| {name} | {what} | {r['alpha']:.3f} | {r['tokens_per_target_call']:.2f} | "
                        f"{r.get('matches_target_greedy', '-')} |")
        s = a["same_tokenizer_draft"][label]
        rows.append(f"| {name} | the tiny pair's own draft (same tokenizer) | {s['alpha']:.3f} | "
                    f"{s['tokens_per_target_call']:.2f} | - |")
    size, load = m["size_bytes"], m["load_seconds"]
    card = f"""# A draft with a tokenizer of its own

The draft of chapter 9: `load_pair("tiny-cross")` pairs it with the tiny target
(`../target`), whose tokenizer it does not share. Trained by
`python -m specdec_ref.training.own_vocab`; every number below was measured by
`python -m specdec_ref.training.own_vocab_card`, which wrote this card from `metrics.json`.

## Tokenizer
SentencePiece-style BPE of {v['draft']} tokens (the target's byte-level BPE has {v['target']}):
a space is "▁" and joins the word after it, a character outside the 100 most frequent
falls back to its UTF-8 bytes (`<0xE2>`), and the end of text is `</s>` (the target's is
`<|endoftext|>`). Trained on the tiny pair's corpus (`specdec_ref.training.corpus`).

Tokens both vocabularies spell alike (the same bytes): {v['shared']}, that is
{v['share_of_target']:.1%} of the target's vocabulary. `transformers`' rule (the same
string once the leading space sign is swapped) keeps {v['share_of_target_string_rule']:.1%}.

## Model
{shape['layers']} x {shape['width']}, {shape['heads']} heads, SwiGLU {shape['ffn']}, the tiny draft's shape;
{t['params'] / 1e6:.2f} M parameters, {size['own_vocab_draft'] / 1e6:.1f} MB in float16
(the tiny draft: {size['tiny_draft'] / 1e6:.1f} MB). Trained on the text with cross-entropy
(not on the target's labels), {t['config']['draft_steps']} steps of {t['config']['batch_size']} x
{t['config']['context']} tokens, {t['seconds']['draft'] / 60:.1f} min on {t['torch_threads']} CPU thread(s).
Load time (`from_pretrained`, median of 5): {load['own_vocab_draft'] * 1e3:.0f} ms
(the tiny draft: {load['tiny_draft'] * 1e3:.0f} ms).

## Against the tiny target
`speculative_generate` with K = {a['num_draft_tokens']} on {a['prompts']} held-out prompts of
{a['prompt_tokens']} tokens, {a['new_tokens']} new tokens each. alpha is accepted / judged drafts.

| sampling | draft path | alpha | tokens per target call | equal to target greedy |
|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    (out / "README.md").write_text(card)


def main() -> dict:
    torch.set_num_threads(1)
    metrics = measure()
    (OWN_VOCAB_DIR / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_card(metrics)
    return metrics


if __name__ == "__main__":
    main()

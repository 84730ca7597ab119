"""The exact laws an exactness audit compares with, on a small enumerable pair (chapters 4 and 11).

A speculative decoder is exact when its output follows the law of the target's own
sampling. This module computes that law, and the law a speculative rule actually
produces, by enumeration:

* `target_law`: the law of the target's next `num_tokens` sampled tokens, one target
  pass per prefix (V ** num_tokens outcomes, so only on a small vocabulary);
* `decoder_law`: the law of a speculative decoder's first `num_tokens` tokens, every
  draft and every accept / reject branch followed ("exact" rule or the article's);
* `law_tv`: the total-variation distance between two such laws;
* `small_random_pair`: a random GPT-2 target / draft pair on a few tokens, whose p and q
  disagree, so that the laws are enumerable and a wrong rule shows;
* `reference_probs` and `generate_reference`: the processed distribution "exact" refers
  to. By default the book's `SamplingConfig`; an implementation with other conventions
  is audited against its own, e.g. `transformers`' `generate`, which samples with
  top_k = 50 unless told otherwise (`generate_reference` builds its warpers), and
  `transformers_assisted` is its assisted generation as a generate-like callable.

Invariant: `decoder_law(..., rule="exact")` equals `target_law` to rounding (1e-12),
for every K and across block boundaries; the article's rule does not.
The statistical tests that compare a decoder's samples with these laws are in
`specdec_ref.audit` (the first tokens) and `specdec_ref.audit_tokens` (every token).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from transformers import PreTrainedModel

from .rejection import residual_distribution
from .sampling import SamplingConfig, logits_to_probs
from .validation import check_integer

Law = dict[tuple[int, ...], float]  # emitted tokens -> probability
# The distribution "exact" refers to: a SamplingConfig, or logits (B, V) -> probs (B, V).
Reference = SamplingConfig | Callable[[torch.Tensor], torch.Tensor]
# What an audit calls: (input_ids (1, n), generator) -> sequences (1, n + new) or `.sequences`.
GenerateFn = Callable[[torch.Tensor, torch.Generator], object]

# generate's defaults where neither the model's generation config nor the call sets them.
_GENERATE_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
# Processors `generate` may apply that the reference does not rebuild: (name, neutral value).
_UNSUPPORTED = (("min_p", None), ("typical_p", 1.0), ("epsilon_cutoff", 0.0), ("eta_cutoff", 0.0),
                ("top_h", None), ("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0))


def reference_probs(logits: torch.Tensor, reference: Reference) -> torch.Tensor:
    """The reference's processed distributions, (..., V) logits -> (..., V) float64 probabilities.

    Renormalized in float64: float32 rows sum to 1 only within about 1e-7, and the
    rule's bookkeeping (sum of max(0, q - p) = sum of max(0, p - q)) needs both rows
    to sum to 1 to the last bit for laws that agree to 1e-12.
    """
    if isinstance(reference, SamplingConfig):
        probs = logits_to_probs(logits, reference).double()  # (..., V)
    elif callable(reference):
        probs = reference(logits).double()  # (..., V)
    else:
        raise TypeError(f"sampling must be a SamplingConfig or a callable logits -> probs, got {reference!r}")
    return probs / probs.sum(-1, keepdim=True)


def generate_reference(model: PreTrainedModel, **generate_kwargs: object) -> Callable[[torch.Tensor], torch.Tensor]:
    """The distribution `model.generate(do_sample=True, **generate_kwargs)` samples from.

    Temperature, top-k and top-p come from the call, else the model's generation
    config, else `generate`'s defaults (top_k = 50); they are applied by
    `transformers`' own warpers, in `generate`'s order.

    Args:
        model: the target, whose `generation_config` supplies unset values.
        generate_kwargs: temperature, top_k, top_p as they would be passed to `generate`.

    Returns:
        A reference for `target_law` or `audit_every_token`: logits (..., V) -> probs.

    Raises:
        ValueError: for another keyword, or a config that sets a processor not rebuilt
            here (min_p, typical_p, repetition_penalty, ...).
    """
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    unknown = set(generate_kwargs) - set(_GENERATE_DEFAULTS)
    if unknown:
        raise ValueError(f"generate_kwargs may set only {sorted(_GENERATE_DEFAULTS)}, got {sorted(unknown)}")
    config = model.generation_config
    for name, neutral in _UNSUPPORTED:
        if getattr(config, name, neutral) not in (None, neutral):
            raise ValueError(f"the model's generation config sets {name}={getattr(config, name)!r}, "
                             "which generate_reference does not rebuild")
    values = {name: generate_kwargs.get(name, getattr(config, name, None)) for name in _GENERATE_DEFAULTS}
    values = {name: default if values[name] is None else values[name] for name, default in _GENERATE_DEFAULTS.items()}
    warpers = []
    if values["temperature"] != 1.0:
        warpers.append(TemperatureLogitsWarper(float(values["temperature"])))
    if values["top_k"] != 0:
        warpers.append(TopKLogitsWarper(top_k=int(values["top_k"])))
    if values["top_p"] < 1.0:
        warpers.append(TopPLogitsWarper(top_p=float(values["top_p"])))

    def process(logits: torch.Tensor) -> torch.Tensor:
        scores = logits.float().reshape(-1, logits.size(-1))  # (B, V) as generate's scores
        for warper in warpers:
            scores = warper(None, scores)
        return scores.softmax(-1).reshape(logits.shape)  # (..., V)

    process.__qualname__ = f"generate_reference({values})"
    return process


def _next_probs(model: PreTrainedModel, sequences: torch.Tensor, sampling: Reference) -> torch.Tensor:
    """The processed next-token distributions of a batch of sequences (B, L) -> (B, V), float64."""
    logits = model(sequences, use_cache=False).logits[:, -1]  # (B, V)
    return reference_probs(logits, sampling)  # (B, V)


def _check_enumeration(input_ids: torch.Tensor, num_tokens: int, vocab: int, max_outcomes: int) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.size(0) != 1:
        raise ValueError("input_ids must be a tensor of shape (1, n)")
    check_integer("num_tokens", num_tokens, minimum=1)
    if vocab ** num_tokens > max_outcomes:
        raise ValueError(f"num_tokens = {num_tokens} over a vocabulary of {vocab} gives {vocab} ** {num_tokens} "
                         f"outcomes, more than max_outcomes = {max_outcomes}: use fewer tokens")


@torch.no_grad()
def target_law(target_model: PreTrainedModel, input_ids: torch.Tensor, sampling: Reference = SamplingConfig(),
               num_tokens: int = 1, *, max_outcomes: int = 1 << 16) -> Law:
    """The exact law of the target's next `num_tokens` sampled tokens, by enumeration.

    Args:
        target_model: the model whose sampling defines "exact".
        input_ids: the prompt, shape (1, n).
        sampling: temperature / top-k / top-p (`logits_to_probs`), or the
            implementation's own processing (`generate_reference`).
        num_tokens: outcome length; V ** num_tokens must stay <= max_outcomes.
        max_outcomes: a guard against enumerations too large to run.

    Returns:
        {tokens: probability} over outcomes of positive probability (float64).
    """
    vocab = target_model.get_output_embeddings().weight.size(0)
    _check_enumeration(input_ids, num_tokens, vocab, max_outcomes)
    # One pass per prefix, the same passes `decoder_law` makes: equal inputs, equal p.
    law: Law = {(): 1.0}
    for _ in range(num_tokens):
        grown: Law = {}
        for prefix, mass in law.items():
            ids = torch.tensor([prefix], dtype=input_ids.dtype, device=input_ids.device).view(1, -1)
            probs = _next_probs(target_model, torch.cat([input_ids, ids], dim=1), sampling)[0].cpu()  # (V,)
            for y in probs.nonzero().flatten().tolist():
                grown[prefix + (y,)] = mass * float(probs[y])
        law = grown
    return law


@torch.no_grad()
def decoder_law(target_model: PreTrainedModel, draft_model: PreTrainedModel, input_ids: torch.Tensor, *,
                num_draft_tokens: int, sampling: SamplingConfig = SamplingConfig(), num_tokens: int = 1,
                rule: str = "exact", max_outcomes: int = 1 << 16) -> Law:
    """The exact law of a speculative decoder's first `num_tokens` tokens, by enumeration.

    Every draft the draft model can sample is followed, each accept / reject
    branch weighted by its probability; a block that ends before `num_tokens`
    tokens is followed by the next block, as in the decoder's loop.

    Args:
        target_model, draft_model: the pair (small vocabulary).
        input_ids: the prompt, shape (1, n).
        num_draft_tokens: K drafted per block (>= 1).
        sampling: applied to both models; temperature > 0.
        num_tokens: outcome length; V ** num_tokens must stay <= max_outcomes.
        rule: "exact" (residual after a rejection) or "article" (p after a rejection).
        max_outcomes: a guard against enumerations too large to run.

    Returns:
        {tokens: probability} (float64); with rule "exact" it equals `target_law`.
    """
    if rule not in ("exact", "article"):
        raise ValueError(f"rule must be 'exact' or 'article', got {rule!r}")
    check_integer("num_draft_tokens", num_draft_tokens, minimum=1)
    if sampling.greedy:
        raise ValueError("sampling must have temperature > 0: a greedy decoder has no law to enumerate")
    vocab = target_model.get_output_embeddings().weight.size(0)
    _check_enumeration(input_ids, num_tokens, vocab, max_outcomes)
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def p_and_q(context: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        # The two models' processed distributions after prompt + context.
        if context not in cache:
            ids = torch.tensor([context], dtype=input_ids.dtype, device=input_ids.device).view(1, -1)
            sequence = torch.cat([input_ids, ids], dim=1)  # (1, n + len)
            cache[context] = (_next_probs(target_model, sequence, sampling)[0].cpu(),
                              _next_probs(draft_model, sequence, sampling)[0].cpu())
        return cache[context]

    law: Law = {}

    def emit(context: tuple[int, ...], mass: float) -> None:
        # `context` was emitted with probability `mass`; continue with a new block.
        if len(context) >= num_tokens:
            law[context[:num_tokens]] = law.get(context[:num_tokens], 0.0) + mass
        else:
            block(context, (), mass)

    def block(context: tuple[int, ...], accepted: tuple[int, ...], mass: float) -> None:
        # `accepted`: drafts of this block accepted so far (drawn and kept w.p. mass).
        if len(context) + len(accepted) >= num_tokens:
            emit(context + accepted, mass)  # later tokens cannot change the outcome
            return
        p, q = p_and_q(context + accepted)
        if len(accepted) == num_draft_tokens:
            # All K accepted: the bonus token from p_K.
            for y in p.nonzero().flatten().tolist():
                emit(context + accepted + (y,), mass * float(p[y]))
            return
        after_reject = residual_distribution(p, q) if rule == "exact" else p
        for x in q.nonzero().flatten().tolist():
            accept = min(1.0, float(p[x]) / float(q[x]))
            if accept < 1:
                # Rejected: one token from the residual (or p), and the block ends.
                for y in after_reject.nonzero().flatten().tolist():
                    emit(context + accepted + (y,), mass * float(q[x]) * (1 - accept) * float(after_reject[y]))
            if accept > 0:
                block(context, accepted + (x,), mass * float(q[x]) * accept)

    block((), (), 1.0)
    return law


def law_tv(first: Mapping[tuple[int, ...], float], second: Mapping[tuple[int, ...], float]) -> float:
    """Total-variation distance between two laws over outcomes: half the L1 distance."""
    outcomes = set(first) | set(second)
    return 0.5 * sum(abs(first.get(o, 0.0) - second.get(o, 0.0)) for o in outcomes)


def small_random_pair(vocab_size: int = 8, *, seed: int = 0, width: int = 32, init_range: float = 0.5,
                      positions: int = 64, family: str = "gpt2") -> tuple[PreTrainedModel, PreTrainedModel]:
    """A random-init target (2 layers) and draft (1 layer) on a small vocabulary.

    Independent random weights make p and q differ a lot, which is what an audit
    needs; a small vocabulary makes the exact laws enumerable.

    Args:
        vocab_size: V >= 2 (keep V ** num_tokens small for the enumerations).
        seed: seeds the weights (through torch's global generator).
        width: the hidden size of both models.
        init_range: the standard deviation of the random weights; larger
            spreads the logits, so p and q differ more.
        positions: the longest sequence the models take.
        family: "gpt2" or "llama" (rotary positions and RMS norms, the family
            EAGLE's head is built from, chapter 10).

    Returns:
        (target_model, draft_model), float32, eval mode; the last token id is
        BOS / EOS / padding, and `generate` never stops early (no EOS).

    Raises:
        ValueError: if `vocab_size` is not an integer >= 2, or for another family.
    """
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    check_integer("vocab_size", vocab_size, minimum=2)
    if family not in ("gpt2", "llama"):
        raise ValueError(f"family must be 'gpt2' or 'llama', got {family!r}")
    special = dict(bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1, pad_token_id=None,
                   initializer_range=init_range)
    models = []
    for layers, offset in ((2, 0), (1, 1)):
        torch.manual_seed(seed * 2 + offset)
        if family == "gpt2":
            config = GPT2Config(vocab_size=vocab_size, n_positions=positions, n_embd=width, n_layer=layers,
                                n_head=2, **special)
            model = GPT2LMHeadModel(config).eval()
        else:
            config = LlamaConfig(vocab_size=vocab_size, hidden_size=width, intermediate_size=2 * width,
                                 num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=positions, **special)
            model = LlamaForCausalLM(config).eval()
        # Never stop early in `generate`: the audit counts a fixed number of tokens.
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = vocab_size - 1
        models.append(model)
    return models[0], models[1]


def transformers_assisted(target_model: PreTrainedModel, draft_model: PreTrainedModel, *, max_new_tokens: int,
                          num_draft_tokens: int = 4, sampling: SamplingConfig = SamplingConfig()) -> GenerateFn:
    """`transformers`' assisted generation as a generate-like callable for `audit`.

    `generate` draws from torch's global generator, so each call reseeds it from
    `generator` (the global state is changed). Sampling settings are passed
    explicitly (`SamplingConfig.generate_kwargs`: generate's top_k=50 default off)
    and the assistant drafts a constant `num_draft_tokens` per iteration.
    """
    if sampling.greedy:
        raise ValueError("sampling must have temperature > 0: the audit is for sampling")
    draft_model.generation_config.num_assistant_tokens = num_draft_tokens
    draft_model.generation_config.num_assistant_tokens_schedule = "constant"
    draft_model.generation_config.assistant_confidence_threshold = 0.0
    kwargs = sampling.generate_kwargs()

    def generate(input_ids: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        torch.manual_seed(seed)
        return target_model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                     assistant_model=draft_model, max_new_tokens=max_new_tokens,
                                     pad_token_id=target_model.generation_config.pad_token_id, **kwargs)

    return generate

"""The assembled speculative decoder, and the autoregressive baseline it must match.

One iteration of `speculative_generate`:

1. draft K tokens with the small model, keeping their distributions q (chapter 2);
2. score prefix + drafts with one pass of the large model: p, shape (K + 1, V) (chapter 3);
3. accept a prefix of the drafts and emit one correction or bonus token (chapter 4);
4. roll both models' KV caches back to the tokens actually kept (chapter 5).

Invariant: the emitted sequence is distributed exactly as `autoregressive_generate`
with the target model and the same `SamplingConfig`; with temperature 0 it is the
target's greedy output token for token. The loop never emits more than
`max_new_tokens` tokens (K shrinks near the end) and stops right after an EOS,
even one accepted in the middle of a block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .drafting import draft_tokens
from .kv_cache import LogitsSource, make_logits_source
from .rejection import accept_reject
from .sampling import SamplingConfig, logits_to_probs, sample
from .schedules import DraftLengthSchedule, as_schedule, next_draft_length
from .validation import check_generation_args, eos_set
from .verification import target_distributions


@dataclass
class GenerationStats:
    """Counters of one generation call."""

    new_tokens: int = 0  # tokens emitted after the prompt
    iterations: int = 0  # draft-verify rounds (decoding steps for the baseline)
    drafted_tokens: int = 0  # tokens proposed by the draft model
    accepted_tokens: int = 0  # drafted tokens the target accepted
    judged_tokens: int = 0  # drafted tokens the target got to judge (none after a rejection)
    target_calls: int = 0  # forward passes of the target model
    draft_calls: int = 0  # forward passes of the draft model

    @property
    def acceptance_rate(self) -> float:
        """Acceptance rate: accepted drafts / drafted tokens (nan when nothing was drafted).

        Not alpha: drafts after the first rejection in a block count as drafted but are
        never judged, so when K > 1 this is lower than alpha, the chance one draft is
        accepted; `per_token_acceptance` estimates alpha.
        """
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else float("nan")

    @property
    def per_token_acceptance(self) -> float:
        """Estimate of alpha, the chance one draft is accepted: accepted / judged drafts.

        Drafts after the first rejection in a block are never judged, so
        `acceptance_rate` (accepted / drafted) underestimates it when K > 1.
        """
        return self.accepted_tokens / self.judged_tokens if self.judged_tokens else float("nan")

    @property
    def tokens_per_target_call(self) -> float:
        """Block efficiency: new tokens per target forward pass."""
        return self.new_tokens / self.target_calls if self.target_calls else float("nan")


@dataclass
class IterationRecord:
    """What one iteration drafted and what it emitted.

    Always `emitted[:num_accepted] == drafted[:num_accepted]`. Then one correction
    (after a rejection) or bonus token (after K acceptances) follows, unless an
    accepted draft was an EOS: the block ends there, `emitted` is exactly the accepted
    drafts up to that EOS, and the drafts after it count neither as accepted nor judged.
    """

    drafted: list[int]  # the K draft tokens
    emitted: list[int]  # accepted drafts + one correction or bonus token (cut after EOS)
    num_accepted: int  # drafts the target accepted and that were emitted (none after an EOS)

    @property
    def num_judged(self) -> int:
        """Drafts the target got to judge: the accepted ones, plus the rejected one if any."""
        rejected = self.num_accepted < len(self.drafted) and len(self.emitted) > self.num_accepted
        return self.num_accepted + rejected


@dataclass
class GenerationOutput:
    """The result of a generation call."""

    sequences: torch.Tensor  # (1, prompt + new) token ids
    stats: GenerationStats
    trace: list[IterationRecord] = field(default_factory=list)


def _cut_after_eos(tokens: list[int],
                   eos: set[int]) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS; say if one was found."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1], True
    return tokens, False


@torch.no_grad()
def speculative_step(
    target: LogitsSource,
    draft: LogitsSource,
    sequence: torch.Tensor,
    num_draft_tokens: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    eos: set[int] = frozenset(),
) -> tuple[torch.Tensor, IterationRecord, bool]:
    """One draft-verify-accept iteration; both caches left ready for the next.

    Args:
        target, draft: the two models wrapped as logits sources (`kv_cache`).
        sequence: the tokens so far, shape (1, n).
        num_draft_tokens: K >= 0 for this iteration (0 makes it one plain
            target step).
        sampling, generator: as in `speculative_generate`.
        eos: token ids after which generation stops.

    Returns:
        (the extended sequence (1, n + emitted), what happened, whether an
        EOS was emitted).
    """
    n = sequence.size(1)
    proposal = draft_tokens(draft, sequence, num_draft_tokens, sampling,
                            generator)
    p = target_distributions(target, sequence, proposal.tokens,
                             sampling)  # (K + 1, V)
    emitted = accept_reject(proposal.tokens, proposal.probs, p, generator,
                            greedy=sampling.greedy)
    num_accepted = len(emitted) - 1
    emitted, hit_eos = _cut_after_eos(emitted, eos)
    # An EOS among the accepted drafts ends the block: the drafts after it
    # are dropped.
    num_accepted = min(num_accepted, len(emitted))
    new = torch.tensor([emitted], dtype=sequence.dtype,
                       device=sequence.device)
    sequence = torch.cat([sequence, new], dim=1)  # (1, n + emitted)
    # Roll both caches back to the prefix and the accepted drafts. The last
    # token of the sequence (the correction or bonus, or an EOS) stays
    # unseen by both models: the next iteration feeds it first, so its
    # logits are always computed fresh.
    keep = min(n + num_accepted, sequence.size(1) - 1)
    target.rollback(keep)
    draft.rollback(keep)
    record = IterationRecord(proposal.tokens.tolist(), emitted, num_accepted)
    return sequence, record, hit_eos


@torch.no_grad()
def speculative_generate(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    num_draft_tokens: int | DraftLengthSchedule = 4,
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | torch.Tensor | None = None,
    use_cache: bool = True,
) -> GenerationOutput:
    """Generate with a draft model proposing and the target model verifying.

    Args:
        target_model: the large model whose distribution the output follows.
        draft_model: the small model; must share the target's vocabulary and
            device.
        input_ids: the prompt, shape (1, n) with n >= 1.
        max_new_tokens: the most tokens to add (exactly this many unless EOS
            comes first).
        num_draft_tokens: K >= 1 per iteration, or a schedule that adapts K
            (`schedules`); a schedule's next_k() may return any integer >= 0
            (0: one plain target step).
        sampling: temperature / top-k / top-p for both models; temperature 0
            is greedy.
        generator: the only source of randomness.
        eos_token_id: stop right after any of these tokens (None: never stop
            early); an integer-like id (int, numpy integer, 0-d tensor) or a
            list / set / 1-d tensor.
        use_cache: keep a KV cache in both models (False: the teaching path
            that recomputes every pass from scratch).

    Returns:
        A `GenerationOutput` with `.sequences` (1, n + new), `.stats` and
        `.trace`.

    Raises:
        ValueError / TypeError: for any malformed argument (see `validation`).
    """
    check_generation_args(
        {"target_model": target_model, "draft_model": draft_model},
        input_ids, max_new_tokens, sampling, generator, num_draft_tokens,
    )
    schedule = as_schedule(num_draft_tokens)
    eos = eos_set(eos_token_id)
    target = make_logits_source(target_model, use_cache)
    draft = make_logits_source(draft_model, use_cache)
    sequence, stats, trace = input_ids, GenerationStats(), []
    while stats.new_tokens < max_new_tokens:
        # Never draft past the budget: K drafts can emit up to K + 1 tokens.
        # The schedule sees the K actually drafted, smaller than it asked for
        # when the budget cut in.
        budget = max_new_tokens - stats.new_tokens
        k = min(next_draft_length(schedule), budget - 1)
        sequence, record, hit_eos = speculative_step(
            target, draft, sequence, k, sampling, generator, eos)
        # Drafts after an accepted EOS never count: the schedule hears of a
        # short block.
        cut = len(record.emitted) == record.num_accepted
        schedule.update(record.num_accepted if cut else k,
                        record.num_accepted)
        stats.iterations += 1
        stats.drafted_tokens += k
        stats.accepted_tokens += record.num_accepted
        stats.judged_tokens += record.num_judged
        stats.new_tokens += len(record.emitted)
        trace.append(record)
        if hit_eos:
            break
    stats.target_calls = target.forward_calls
    stats.draft_calls = draft.forward_calls
    return GenerationOutput(sequence, stats, trace)


@torch.no_grad()
def autoregressive_generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | torch.Tensor | None = None,
    use_cache: bool = True,
) -> GenerationOutput:
    """The baseline: one forward pass of `model` per new token.

    Same arguments and output as `speculative_generate`, without the draft model.
    Its output distribution is the one speculative decoding must reproduce.
    """
    check_generation_args({"model": model}, input_ids, max_new_tokens, sampling, generator)
    eos = eos_set(eos_token_id)
    source = make_logits_source(model, use_cache)
    sequence, stats = input_ids, GenerationStats()
    for _ in range(max_new_tokens):
        probs = logits_to_probs(source.last_logits(sequence, 1), sampling)  # (1, V)
        token = probs.argmax(-1) if sampling.greedy else sample(probs, generator)  # (1,)
        sequence = torch.cat([sequence, token.view(1, 1).to(sequence)], dim=1)  # (1, n + 1)
        stats.iterations += 1
        stats.new_tokens += 1
        if int(token) in eos:
            break
    stats.target_calls = source.forward_calls
    return GenerationOutput(sequence, stats)


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
from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from .drafting import Drafter, LengthCheckingDrafter, ModelDrafter, as_drafter, is_drafter
from .kv_cache import LogitsSource, as_target_source
from .rejection import accept_reject
from .sampling import SamplingConfig, logits_to_probs, sample
from .schedules import DraftLengthSchedule, as_schedule, next_draft_length
from .validation import check_capacity, check_generation_args, check_proposal, eos_set, vocab_size
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

    def count_block(self, record: IterationRecord) -> None:
        """Count one finished draft-verify block: the drafts it proposed, accepted and
        judged, and the tokens it emitted."""
        self.iterations += 1
        self.drafted_tokens += len(record.drafted)
        self.accepted_tokens += record.num_accepted
        self.judged_tokens += record.num_judged
        self.new_tokens += len(record.emitted)

    def __iadd__(self, other: GenerationStats) -> GenerationStats:
        """Add another call's counters to these (totals over several generations)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


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


def cut_after_eos(tokens: list[int],
                   eos: set[int]) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS; say if one was found."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1], True
    return tokens, False


class BlockEnd(NamedTuple):
    """How one draft-verify block closes (`close_block`)."""

    emitted: list[int]  # the block's tokens, cut after the first EOS
    num_accepted: int  # accepted drafts that were emitted (none after an EOS)
    keep: int  # tokens both caches keep: the prefix and the accepted drafts
    hit_eos: bool  # an EOS was emitted: generation stops

    @property
    def cut(self) -> bool:
        """Whether an accepted EOS ended the block before its last token."""
        return len(self.emitted) == self.num_accepted


def close_block(emitted: list[int], num_accepted: int, n: int,
                eos: set[int]) -> BlockEnd:
    """Close a block: what it emits, how many drafts count, what to keep.

    The one rule every decoder (chain, tree, batched) ends a block with.

    Args:
        emitted: the accepted drafts, then one correction or bonus token.
        num_accepted: how many of them are accepted drafts.
        n: the length of the sequence before the block.
        eos: token ids after which generation stops.

    Returns:
        A `BlockEnd`; always `keep == n + len(emitted) - 1`.
    """
    emitted, hit_eos = cut_after_eos(emitted, eos)
    # An EOS among the accepted drafts ends the block: the drafts after it
    # are dropped.
    num_accepted = min(num_accepted, len(emitted))
    # Both caches keep the prefix and the accepted drafts. The last token
    # emitted (the correction or bonus, or an EOS) stays unseen by both
    # models: the next iteration feeds it first, so its logits are always
    # computed fresh.
    keep = min(n + num_accepted, n + len(emitted) - 1)
    return BlockEnd(emitted, num_accepted, keep, hit_eos)


@torch.no_grad()
def speculative_step(
    target: LogitsSource,
    draft: LogitsSource | Drafter,
    sequence: torch.Tensor,
    num_draft_tokens: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    eos: set[int] = frozenset(),
) -> tuple[torch.Tensor, IterationRecord, bool]:
    """One draft-verify-accept iteration; both caches left ready for the next.

    Args:
        target: the target model wrapped as a logits source (`kv_cache`).
        draft: the draft model wrapped as a logits source, or any `Drafter`
            (e.g. chapter 7's prompt lookup), which may propose fewer tokens.
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
    drafter = draft if is_drafter(draft) else ModelDrafter(draft, sampling,
                                                           generator)
    # A model's drafts and q rows are well formed by construction (only
    # their finiteness is checked); any other drafter's are checked in full,
    # before the target runs.
    trusted = isinstance(drafter, ModelDrafter)
    vocab = vocab_size(target.model)
    proposal = drafter.draft(sequence, num_draft_tokens, vocab)  # (K, V)
    if not trusted:
        check_proposal(drafter, proposal, num_draft_tokens, vocab)
    p = target_distributions(target, sequence, proposal.tokens,
                             sampling)  # (K + 1, V)
    emitted = accept_reject(proposal.tokens, proposal.probs, p, generator,
                            greedy=sampling.greedy, trusted=trusted)
    # Cut after an EOS; roll both caches back to the prefix and the
    # accepted drafts (`close_block`).
    block = close_block(emitted, len(emitted) - 1, n, eos)
    new = torch.tensor([block.emitted], dtype=sequence.dtype,
                       device=sequence.device)
    sequence = torch.cat([sequence, new], dim=1)  # (1, n + emitted)
    target.rollback(block.keep)
    drafter.rollback(block.keep)
    record = IterationRecord(proposal.tokens.tolist(), block.emitted,
                             block.num_accepted)
    return sequence, record, block.hit_eos


@torch.no_grad()
def speculative_generate(
    target_model: PreTrainedModel | LogitsSource,
    draft_model: PreTrainedModel | LogitsSource | Drafter,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    num_draft_tokens: int | DraftLengthSchedule | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | torch.Tensor | None = None,
    use_cache: bool = True,
) -> GenerationOutput:
    """Generate with a draft model proposing and the target model verifying.

    Args:
        target_model: the large model whose distribution the output follows,
            or a logits source over it (e.g. `fast.StaticForward`, the
            static-cache and CUDA-graph path), whose cache is emptied first.
        draft_model: the small model (sharing the target's vocabulary and
            device), a logits source over it (e.g. `fast.LeanForward`), or
            a `drafting.Drafter` such as chapter 7's
            `lookup.PromptLookupDrafter`; a cache it holds is emptied first,
            and a `ModelDrafter` takes `sampling` and `generator` from here.
        input_ids: the prompt, shape (1, n) with n >= 1.
        max_new_tokens: the most tokens to add (exactly this many unless EOS
            comes first).
        num_draft_tokens: K >= 1 per iteration, or a schedule that adapts K
            (`schedules`); a schedule's next_k() may return any integer >= 0
            (0: one plain target step). None: 4 for a draft model, the
            drafter's own `num_draft_tokens` for a drafter.
        sampling: temperature / top-k / top-p for both models; temperature 0
            is greedy.
        generator: the only source of randomness.
        eos_token_id: stop right after any of these tokens (None: never stop
            early); an integer-like id (int, numpy integer, 0-d tensor) or a
            list / set / 1-d tensor.
        use_cache: keep a KV cache in both models (False: the teaching path
            that recomputes every pass from scratch); a logits source or a
            drafter keeps its own.

    Returns:
        A `GenerationOutput` with `.sequences` (1, n + new), `.stats` and
        `.trace`; `stats.drafted_tokens` counts the drafts actually proposed.

    Raises:
        ValueError / TypeError: for any malformed argument (see `validation`).
    """
    # Convert once: the target to a logits source, the draft to a drafter.
    target = as_target_source(target_model, use_cache, "target_model")
    drafter = as_drafter(draft_model, sampling, generator, use_cache)
    if num_draft_tokens is None:  # a drafter may carry its own K
        num_draft_tokens = getattr(drafter, "num_draft_tokens", 4)
    # A draft model gets the target's checks (vocabulary, device, context,
    # a fixed cache's length), bare, as a logits source or as a drafter.
    sources = {"target_model": target}
    if isinstance(drafter, ModelDrafter):
        sources["draft_model"] = drafter.source
    check_generation_args({name: source.model for name, source
                           in sources.items()}, input_ids, max_new_tokens,
                          sampling, generator, num_draft_tokens)
    for name, source in sources.items():
        check_capacity(name, source.max_length,
                       input_ids.size(1) + max_new_tokens)
    # A draft that reads the sequence in tokens of its own checks its context.
    if isinstance(drafter, LengthCheckingDrafter):
        drafter.check_length(input_ids, max_new_tokens)
    schedule = as_schedule(num_draft_tokens)
    eos = eos_set(eos_token_id)
    target_calls_before = target.forward_calls
    draft_calls_before = drafter.forward_calls
    sequence, stats, trace = input_ids, GenerationStats(), []
    while stats.new_tokens < max_new_tokens:
        # Never draft past the budget: K drafts can emit up to K + 1 tokens.
        budget = max_new_tokens - stats.new_tokens
        k = min(next_draft_length(schedule), budget - 1)
        sequence, record, hit_eos = speculative_step(
            target, drafter, sequence, k, sampling, generator, eos)
        # The schedule hears of the drafts actually proposed: fewer than K
        # when the budget or a drafter cut in, or an accepted EOS ended
        # the block.
        drafted = len(record.drafted)
        cut = len(record.emitted) == record.num_accepted
        schedule.update(record.num_accepted if cut else drafted,
                        record.num_accepted)
        stats.count_block(record)
        trace.append(record)
        if hit_eos:
            break
    stats.target_calls = target.forward_calls - target_calls_before
    stats.draft_calls = drafter.forward_calls - draft_calls_before
    return GenerationOutput(sequence, stats, trace)


@torch.no_grad()
def autoregressive_generate(
    model: PreTrainedModel | LogitsSource,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | torch.Tensor | None = None,
    use_cache: bool = True,
) -> GenerationOutput:
    """The baseline: one forward pass of `model` per new token.

    Same arguments and output as `speculative_generate`, without the draft model
    (`model` may be a logits source too). Its output distribution is the one
    speculative decoding must reproduce.
    """
    source = as_target_source(model, use_cache, "model")
    check_generation_args({"model": source.model}, input_ids, max_new_tokens, sampling, generator)
    check_capacity("model", source.max_length, input_ids.size(1) + max_new_tokens)
    eos = eos_set(eos_token_id)
    calls_before = source.forward_calls
    sequence, stats = input_ids, GenerationStats()
    for _ in range(max_new_tokens):
        probs = logits_to_probs(source.last_logits(sequence, 1), sampling)  # (1, V)
        token = probs.argmax(-1) if sampling.greedy else sample(probs, generator)  # (1,)
        sequence = torch.cat([sequence, token.view(1, 1).to(sequence)], dim=1)  # (1, n + 1)
        stats.iterations += 1
        stats.new_tokens += 1
        if int(token) in eos:
            break
    stats.target_calls = source.forward_calls - calls_before
    return GenerationOutput(sequence, stats)


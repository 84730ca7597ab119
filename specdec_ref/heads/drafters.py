"""Draft heads as `drafting.Drafter`s: the unchanged decoder verifies them exactly.

A head drafts from the target's features, which the target's verification pass already
computed (`features.FeatureSource`). So the same `FeatureSource` is given twice: to
`speculative_generate` as the target, and to the drafter, which reads its `features`:

    source = FeatureSource(target_model)
    drafter = EagleDrafter(head, source)
    speculative_generate(source, drafter, input_ids, max_new_tokens=64)

At a draft, the sequence x_0..x_{n-1} has n tokens and the target has read n - 1 of them
(the last one emitted is always unseen, `decoder.close_block`): it holds the features
h_0..h_{n-2}. h_{n-2} gave the target's p for x_{n-1}; the heads guess x_n onwards. On
the first round the target has read nothing, so the drafter proposes nothing: that
round is one plain target step, whose pass reads the prompt (no extra target pass).

* `MedusaDrafter`: head k's guess of x_{n+k} from h_{n-2}, one pass for all K heads.
* `EagleDrafter` (EAGLE, Li et al. 2024): the head reads (h_t, x_{t+1}) for every new
  position t <= n - 2 (real features only), then drafts autoregressively on its own
  predicted features. Its stable cache: after each verification every entry built on a
  predicted feature is dropped, and the next draft re-reads the accepted positions with
  the target's real features (the same pass gives the first draft).

Both draw q as the target's p is drawn: `logits_to_probs` with the decoder's
`SamplingConfig` (`bind`, as `ModelDrafter.bind`; a drafter built with another one is
refused). Exactness needs nothing else: chapter 4's rule is exact for any q.
"""

from __future__ import annotations

import copy

import torch

from ..drafting import Draft
from ..sampling import SamplingConfig, logits_to_probs, sample
from .eagle import EagleHead
from .features import FeatureSource, TargetParts
from .medusa import MedusaHeads


class HeadDrafter:
    """What both heads' drafters share: the feature source, sampling, the guards."""

    def __init__(self, source: FeatureSource, num_draft_tokens: int = 4,
                 sampling: SamplingConfig | None = None, generator: torch.Generator | None = None,
                 parts: TargetParts | None = None) -> None:
        if not isinstance(source, FeatureSource):
            raise TypeError(f"source must be a heads.FeatureSource over the target (the same one passed "
                            f"to the decoder as target_model), got {type(source).__name__}")
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}")
        self.source = source
        # What the head's logits go through: the target's parts, or a reduced
        # draft vocabulary over them (`draft_vocab.ReducedParts`).
        self.parts = parts or source.parts
        self.num_draft_tokens = num_draft_tokens  # the decoder's default K for this drafter
        self.sampling, self.generator = sampling, generator
        self.forward_calls = 0  # the head's passes
        self._rounds = 0  # drafts asked for since the last rollback(0)
        # Drafts to follow instead of drawing them (`heads.law` enumerates every
        # branch this way); None: draw from q.
        self.replay: list[int] | None = None

    def bind(self, sampling: SamplingConfig, generator: torch.Generator | None) -> HeadDrafter:
        """This drafter with the decoder's sampling and generator where it has none
        of its own (sharing the head, its cache and the source).

        Raises:
            ValueError: when it was built with a sampling other than the decoder's.
        """
        if self.sampling is not None and self.sampling != sampling:
            raise ValueError(f"the drafter's sampling ({self.sampling}) differs from the decoder's "
                             f"({sampling}): build {type(self).__name__} without sampling, and it "
                             "takes speculative_generate's")
        bound = copy.copy(self)
        bound.sampling, bound.generator = sampling, self.generator or generator
        return bound

    def ready(self, input_ids: torch.Tensor, vocab_size: int) -> bool:
        """Whether the target holds the features of x_0..x_{n-2} (False: draft nothing).

        Raises:
            ValueError: without a sampling configuration; for a vocabulary other than
                the target's; when the target passed to the decoder is not this
                drafter's source (its features never arrive).
        """
        if self.sampling is None:
            raise ValueError(f"this {type(self).__name__} has no sampling configuration: pass it to "
                             "speculative_generate (which hands it its own) or build it with one")
        vocab = self.source.parts.lm_head.weight.size(0)
        if vocab_size != vocab:
            raise ValueError(f"vocab_size={vocab_size}, but the source's LM head has {vocab} rows: "
                             "the heads draft over the target's own vocabulary")
        n, held = input_ids.size(1), self.source.features.size(0)
        self._rounds += 1
        if held < n - 1 and self._rounds > 1:
            raise ValueError(f"the feature source holds {held} features for a sequence of {n} tokens "
                             "after a verification: pass the drafter's FeatureSource to the decoder "
                             "as target_model")
        return n >= 2 and held >= n - 1

    def choose(self, logits: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The `index`-th drafted token and its q, from the head's logits (1, V): ((1,), (1, V))."""
        q = logits_to_probs(logits, self.sampling)  # (1, V)
        if self.replay is not None and index < len(self.replay):
            return torch.tensor([self.replay[index]], device=q.device), q
        token = q.argmax(-1) if self.sampling.greedy else sample(q, self.generator).to(q.device)  # (1,)
        return token, q

    def empty(self) -> Draft:
        """No drafts: the round is one plain target step."""
        vocab = self.source.parts.lm_head.weight.size(0)
        device = self.source.features.device
        return Draft(torch.empty(0, dtype=torch.long, device=device), torch.empty(0, vocab, device=device))

    def rollback(self, length: int) -> None:
        """Forget everything past the first `length` tokens (0: a new sequence)."""
        if length == 0:
            self._rounds = 0


class MedusaDrafter(HeadDrafter):
    """Medusa's heads as a `Drafter`: up to K = len(heads) tokens, all from h_{n-2}."""

    def __init__(self, heads: MedusaHeads, source: FeatureSource, num_draft_tokens: int | None = None,
                 sampling: SamplingConfig | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__(source, num_draft_tokens or len(heads), sampling, generator)
        self.heads = heads

    @torch.no_grad()
    def draft(self, input_ids: torch.Tensor, num_draft_tokens: int, vocab_size: int) -> Draft:
        """min(num_draft_tokens, len(heads)) tokens after `input_ids` (1, n), with q (K', V)."""
        if not self.ready(input_ids, vocab_size) or num_draft_tokens < 1:
            return self.empty()
        n = input_ids.size(1)
        feature = self.source.features[n - 2][None]  # h_{n-2}, (1, H)
        self.forward_calls += 1  # one pass through every head
        tokens, probs = [], []
        for k in range(min(num_draft_tokens, len(self.heads))):
            token, q = self.choose(self.heads.logits(feature, self.source.parts, k), k)  # (1,), (1, V)
            tokens.append(token)
            probs.append(q)
        return Draft(torch.cat(tokens).to(input_ids.device), torch.cat(probs))  # (K,), (K, V)


class StableCache:
    """EAGLE's head cache and how many of its entries the target's real features built.

    Shared by a drafter and its bound copies (`bind`), as a model drafter's cache is."""

    def __init__(self, head: EagleHead) -> None:
        self.kv = head.new_cache()
        self.real = 0  # entries 0..real - 1 read the target's features

    def keep(self, length: int) -> None:
        """Keep the first `length` entries (never more than the real ones)."""
        self.real = min(self.real, length)
        excess = self.kv.get_seq_length() - self.real
        if excess > 0:
            self.kv.crop(-excess)


class EagleDrafter(HeadDrafter):
    """EAGLE's head as a `Drafter`: autoregressive on its own features, a stable cache."""

    def __init__(self, head: EagleHead, source: FeatureSource, num_draft_tokens: int = 4,
                 sampling: SamplingConfig | None = None, generator: torch.Generator | None = None,
                 parts: TargetParts | None = None) -> None:
        super().__init__(source, num_draft_tokens, sampling, generator, parts)
        self.head = head
        self.cache = StableCache(head)

    @torch.no_grad()
    def draft(self, input_ids: torch.Tensor, num_draft_tokens: int,
              vocab_size: int) -> Draft:
        """`num_draft_tokens` tokens after `input_ids` (1, n), with q (K, V)."""
        if not self.ready(input_ids, vocab_size) or num_draft_tokens < 1:
            return self.empty()
        n, parts, cache = input_ids.size(1), self.parts, self.cache
        # 1. The stable cache: only entries of real features, and at least one
        #    position to feed (its output is the first draft's feature).
        cache.keep(n - 2)
        start = cache.real
        ids = input_ids[:, start + 1 : n]  # x_{t+1} for t = start..n-2, (1, m)
        feats = self.source.features[start : n - 1][None]  # h_t, (1, m, H)
        feats = feats.to(self.head.fc.weight.dtype)
        positions = torch.arange(start, n - 1, device=ids.device)[None]
        predicted = self.head(parts.embed(ids), feats, positions,
                              cache.kv)[:, -1:]  # h^_{n-1}, (1, 1, H)
        cache.real = n - 1
        self.forward_calls += 1
        tokens, probs = [], []
        for i in range(num_draft_tokens):
            logits = parts.logits(predicted)[0]  # (1, V)
            token, q = self.choose(logits, i)  # (1,), (1, V)
            tokens.append(token)
            probs.append(q)
            if i + 1 == num_draft_tokens:
                break
            # 2. Draft on its own feature: (h^_t, drafted x_{t+1}) at t.
            position = torch.tensor([[n - 1 + i]], device=ids.device)
            embed = parts.embed(token.view(1, 1).to(ids.device))  # (1, 1, H)
            predicted = self.head(embed, predicted, position, cache.kv)
            self.forward_calls += 1
        tokens_ = torch.cat(tokens).to(input_ids.device)  # (K,)
        return Draft(tokens_, torch.cat(probs))  # (K,), (K, V)

    def rollback(self, length: int) -> None:
        """Drop every entry built on a predicted feature, and any past `length` - 1."""
        super().rollback(length)
        self.cache.keep(max(length - 1, 0))

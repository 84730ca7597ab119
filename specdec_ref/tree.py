"""Speculative decoding with a tree of drafts, verified in one target pass.

A chain drafts one guess per position; a tree drafts several, so one target
pass judges more candidates (SpecInfer, Miao et al. 2024; Medusa, Cai et al.
2024; EAGLE-2, Li et al. 2024). One iteration of `tree_speculative_generate`:

1. draft a tree of shape `widths` = (w_1, .., w_D): the root is the last token
   emitted; each node at depth d - 1 gets up to w_d children drawn from the
   draft's q at that node, without replacement. One batched draft pass per
   level: all nodes of a level go through the draft model together;
2. score the whole tree with one target pass: a 4-D attention mask lets each
   node see the committed tokens and its own ancestors only, and its position
   id is its depth after the root, so its logits are those of the chain root ->
   node (tree attention);
3. walk down the tree with the sibling rule (`tree_verify`): accepted nodes,
   then one correction or bonus token;
4. compact both KV caches to the accepted path: the path's entries are not
   contiguous in the cache, so each layer's keys and values are index-selected.

Nodes are numbered level by level: node 0 is the root, the last token of the
sequence (position n - 1); node j sits in the cache at slot n - 1 + j and has
position id n - 1 + depth(j). Invariants: as `speculative_generate`'s. The
output follows the target's sampling exactly (greedy: its tokens); exactly
`max_new_tokens` tokens unless an EOS comes first (the tree is cut to depth
budget - 1 near the end); generation stops right after an EOS, even one inside
an accepted path; after compaction, the caches give the logits of a fresh pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from .decoder import (
    GenerationOutput,
    GenerationStats,
    IterationRecord,
    cut_after_eos,
)
from .kv_cache import forward_keywords, uses_sliding_window
from .sampling import SamplingConfig, logits_to_probs
from .tree_verify import draw_children, verify_tree
from .validation import as_integer, check_generation_args, eos_set


@dataclass
class DraftTree:
    """Drafted tokens, numbered level by level from the root, node 0."""

    tokens: list[int]  # each node's token (the root's: the last one emitted)
    parents: list[int]  # each node's parent (-1 for the root)
    depths: list[int]  # each node's depth (0 for the root)
    children: list[list[int]]  # each node's children, in the order drawn
    q: list[torch.Tensor] = field(default_factory=list)  # (V,) per parent

    @classmethod
    def rooted(cls, token: int) -> DraftTree:
        """A tree with only its root."""
        return cls([token], [-1], [0], [[]])

    def add(self, parent: int, token: int) -> None:
        """Append a child of `parent` (the next node number)."""
        self.children[parent].append(len(self.tokens))
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append([])

    def lineage(self, node: int) -> list[int]:
        """The node and its ancestors, up to the root."""
        chain = [node]
        while self.parents[chain[-1]] >= 0:
            chain.append(self.parents[chain[-1]])
        return chain


@dataclass
class TreeRecord(IterationRecord):
    """An `IterationRecord` of a tree: `drafted` lists the nodes' tokens level
    by level; `tried` counts the children the target judged (at each node,
    those tried until one was accepted), along the path up to an EOS; `path`
    gives the accepted nodes' numbers; `tries` the children tried at each
    node visited (root first; the last visited node accepted none, unless an
    EOS ended the path); `parents` the drafted tree's shape (node 0 the root,
    -1; children in the order drawn)."""

    tried: int = 0
    path: list[int] = field(default_factory=list)  # accepted, emitted nodes
    tries: list[int] = field(default_factory=list)  # per visited node
    parents: list[int] = field(default_factory=list)  # per node, root: -1

    @property
    def num_judged(self) -> int:
        """Drafted tokens the target judged: children tried along the path."""
        return self.tried


def tree_attention(tree: DraftTree, before: int, start: int, first: int,
                   last: int) -> tuple[torch.Tensor, list[int]]:
    """The mask and position ids of a pass that feeds the committed tokens
    start..before - 1, then the nodes first..last - 1.

    Key j < before is committed token j; key before + k is node k (the
    root, node 0, is the last committed token, at position `before`).

    Returns:
        (allowed, shape (rows, before + last), True where a row may attend;
        each row's position id).
    """
    nodes = range(first, last)
    fed = before - start  # committed rows
    allowed = torch.zeros(fed + len(nodes), before + last, dtype=torch.bool)
    # A committed token sees every token up to itself (causal).
    causal = torch.ones(fed, before, dtype=torch.bool).tril(start)
    allowed[:fed, :before] = causal
    for row, node in enumerate(nodes, start=fed):
        # A node sees the committed tokens and its own lineage only.
        allowed[row, :before] = True
        allowed[row, [before + k for k in tree.lineage(node)]] = True
    # Its position: its depth after the root.
    positions = list(range(start, before))
    positions += [before + tree.depths[node] for node in nodes]
    return allowed, positions


class TreeForward:
    """A model and its `DynamicCache`, fed committed tokens and tree nodes.

    Every pass feeds the committed tokens the cache has not seen, except the
    last one, then a range of nodes, first..last - 1 (the root is node 0),
    through a 4-D mask; it returns the nodes' logits.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        name = type(model).__name__
        if uses_sliding_window(model.config):
            raise ValueError(f"{name} uses sliding-window attention: the "
                             "tree decoder compacts full-attention caches only")
        self.model = model
        self.cache = DynamicCache(config=model.config)
        if any(type(layer) is not DynamicLayer for layer in self.cache.layers):
            raise ValueError(f"{name}'s cache has layers other than "
                             "DynamicLayer: the tree decoder cannot compact it")
        self.forward_calls = 0
        self._cache_kwarg, self._logits_to_keep = forward_keywords(model)

    @property
    def cached_length(self) -> int:
        """Cache entries held (committed tokens, then tree nodes)."""
        return self.cache.get_seq_length()

    @torch.no_grad()
    def forward(self, sequence: torch.Tensor, tree: DraftTree, first: int,
                last: int) -> torch.Tensor:
        """Logits of nodes first..last - 1, shape (last - first, V).

        The cache must hold the committed tokens before the root, or only
        some of them when first == 0 (the rest are fed here, causally),
        then nodes 0..first - 1.
        """
        before = sequence.size(1) - 1  # committed tokens before the root
        seen = self.cached_length
        start = min(seen, before)  # the first committed token fed now
        if seen != (before + first if first else start):
            need = before + first if first else f"at most {before}"
            raise ValueError(f"the cache holds {seen} entries; nodes "
                             f"{first}..{last - 1} need {need}")
        allowed, positions = tree_attention(tree, before, start, first, last)
        # An additive float mask: 0 where allowed, the dtype's min elsewhere;
        # none where it is causal (a chain), so the model takes its own.
        dtype, device = self.model.dtype, sequence.device
        rows, keys = allowed.shape
        causal = torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
        mask = None
        if not torch.equal(allowed, causal):
            mask = torch.zeros(rows, keys, dtype=dtype)  # (rows, keys)
            mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
            mask = mask[None, None].to(device)  # (1, 1, rows, keys)
        ids = sequence[0, start:before].tolist()
        ids += [tree.tokens[node] for node in range(first, last)]
        kwargs = {self._cache_kwarg: self.cache, "use_cache": True}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = last - first
        self.forward_calls += 1
        logits = self.model(
            torch.tensor([ids], device=device),
            attention_mask=mask,
            position_ids=torch.tensor([positions], device=device),
            **kwargs).logits  # (1, rows or last - first, V)
        return logits[0, first - last:]  # (last - first, V)

    def keep(self, slots: list[int]) -> None:
        """Keep only these cache entries (ascending), in this order."""
        length = self.cached_length
        slots = [s for s in slots if s < length]
        if slots == list(range(len(slots))):
            if length > len(slots):
                self.cache.crop(len(slots) - length)  # a prefix: crop
            return
        device = self.cache.layers[0].keys.device
        index = torch.tensor(slots, device=device)
        for layer in self.cache.layers:
            # (B, H, length, D) -> (B, H, kept, D)
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)


@torch.no_grad()
def draft_tree(draft: TreeForward, sequence: torch.Tensor,
               widths: tuple[int, ...], sampling: SamplingConfig,
               generator: torch.Generator | None = None) -> DraftTree:
    """Grow a tree of shape `widths` after `sequence` (1, n).

    One draft pass per level. Sampling draws each node's children from its
    q without replacement (`tree_verify.draw_children`); greedy takes the
    draft's top-w tokens.
    """
    tree = DraftTree.rooted(int(sequence[0, -1]))
    first, last = 0, 1  # the current level's nodes
    for width in widths:
        logits = draft.forward(sequence, tree, first, last)  # (M, V)
        q = logits_to_probs(logits, sampling)  # (M, V)
        if sampling.greedy:
            top = logits.topk(min(width, logits.size(-1)), dim=-1)
            kids = top.indices.tolist()
        else:
            kids = draw_children(q, width, generator)
        for node, tokens in zip(range(first, last), kids, strict=True):
            tree.q.append(q[node - first])
            for token in tokens:
                tree.add(node, token)
        first, last = last, len(tree.tokens)
    return tree


@torch.no_grad()
def tree_speculative_step(
    target: TreeForward,
    draft: TreeForward,
    sequence: torch.Tensor,
    widths: tuple[int, ...],
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    eos: set[int] = frozenset(),
) -> tuple[torch.Tensor, TreeRecord, bool]:
    """One draft-verify-accept iteration over a tree; both caches compacted.

    Returns:
        (the extended sequence (1, n + emitted), what happened, whether an
        EOS was emitted).
    """
    n = sequence.size(1)
    # 1. Draft the tree (no draft pass for a tree of depth 0).
    root = int(sequence[0, -1])
    tree = draft_tree(draft, sequence, widths, sampling, generator) \
        if widths else DraftTree.rooted(root)
    # 2. One target pass over the unseen committed tokens and every node.
    logits = target.forward(sequence, tree, 0, len(tree.tokens))  # (N + 1, V)
    p = logits_to_probs(logits, sampling)  # (N + 1, V)
    # 3. The sibling rule, from the root down.
    q = torch.stack(tree.q) if tree.q else p[:0]  # (E, V)
    path, last, tried = verify_tree(tree.tokens, tree.children, p, q,
                                    generator, greedy=sampling.greedy)
    emitted = [tree.tokens[node] for node in path] + [last]
    emitted, hit_eos = cut_after_eos(emitted, eos)
    num_accepted = min(len(path), len(emitted))  # none after an EOS
    new = torch.tensor([emitted], dtype=sequence.dtype, device=sequence.device)
    sequence = torch.cat([sequence, new], dim=1)  # (1, n + emitted)
    # 4. Keep the committed tokens and the accepted path; the last token
    # emitted stays unseen by both models, as in the chain.
    keep = min(n + num_accepted, sequence.size(1) - 1)
    slots = list(range(n)) + [n - 1 + node for node in path[: keep - n]]
    target.keep(slots)
    draft.keep(slots)
    # An EOS inside the path ends the block there: children tried below it
    # do not count.
    cut = len(emitted) == num_accepted
    judged = sum(tried[:num_accepted] if cut else tried)
    record = TreeRecord(tree.tokens[1:], emitted, num_accepted, tried=judged,
                        path=path[:num_accepted],
                        tries=tried[:num_accepted] if cut else tried,
                        parents=list(tree.parents))
    return sequence, record, hit_eos


def check_widths(widths: object) -> tuple[int, ...]:
    """`widths` as a tuple of Python ints >= 1, at least one level."""
    items = list(widths) if isinstance(widths, (list, tuple)) else None
    values = [as_integer(w) for w in items] if items else None
    if not values or any(w is None or w < 1 for w in values):
        raise ValueError(
            "widths must be a non-empty list or tuple of integers >= 1 "
            f"(children per node, one per level), got {widths!r}")
    return tuple(values)


@torch.no_grad()
def tree_speculative_generate(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    widths: tuple[int, ...] | list[int] = (3, 2, 1),
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | torch.Tensor | None = None,
) -> GenerationOutput:
    """Generate with the draft proposing a tree and the target verifying it.

    Args:
        target_model: the large model whose distribution the output follows.
        draft_model: the small model (same vocabulary and device).
        input_ids: the prompt, shape (1, n) with n >= 1.
        max_new_tokens: exactly this many tokens unless an EOS comes first.
        widths: children per node at each level, e.g. (3, 2, 1): 3 + 6 + 6
            nodes; (1,) * K is the chain of K drafts.
        sampling: temperature / top-k / top-p for both models; 0 is greedy.
        generator: the only source of randomness.
        eos_token_id: stop right after any of these tokens (None: never).

    Returns:
        A `GenerationOutput`; its trace holds a `TreeRecord` per iteration,
        and `stats.tokens_per_target_call` is the block efficiency.

    Raises:
        ValueError / TypeError: for any malformed argument (`validation`),
            or a model whose cache cannot be compacted (sliding windows).
    """
    widths = check_widths(widths)
    models = {"target_model": target_model, "draft_model": draft_model}
    check_generation_args(models, input_ids, max_new_tokens, sampling,
                          generator)
    target, draft = TreeForward(target_model), TreeForward(draft_model)
    eos = eos_set(eos_token_id)
    sequence, stats, trace = input_ids, GenerationStats(), []
    while stats.new_tokens < max_new_tokens:
        # Never past the budget: a tree of depth D emits up to D + 1 tokens.
        depth = min(len(widths), max_new_tokens - stats.new_tokens - 1)
        sequence, record, hit_eos = tree_speculative_step(
            target, draft, sequence, widths[:depth], sampling, generator, eos)
        stats.count_block(record)
        trace.append(record)
        if hit_eos:
            break
    stats.target_calls = target.forward_calls
    stats.draft_calls = draft.forward_calls
    return GenerationOutput(sequence, stats, trace)

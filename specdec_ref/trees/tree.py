"""Speculative decoding with a tree of drafts, verified in one target pass.

A chain drafts one guess per position; a tree drafts several, so one target
pass judges more candidates (SpecInfer, Miao et al. 2024; Medusa, Cai et al.
2024; EAGLE-2, Li et al. 2024). One iteration of `tree_speculative_generate`:

1. draft a tree of shape `widths` = (w_1, .., w_D): the root is the last token
   emitted; each node at depth d - 1 gets up to w_d children drawn from the
   draft's q at that node, without replacement. One batched draft pass per
   level: all nodes of a level go through the draft model together. Or a
   `ConfidentShape`: nodes per level, given where the draft is most confident;
2. score the whole tree with one target pass: a 4-D attention mask lets each
   node see the committed tokens and its own ancestors only, and its position
   id is its depth after the root, so its logits are those of the chain root ->
   node (tree attention, `tree_forward`; with `grouped_eager` attention each
   node's row is bitwise a one-token step's, `fast.tree_attention`);
3. walk down the tree with the sibling rule (`tree_verify`): accepted nodes,
   then one correction or bonus token;
4. compact both KV caches to the accepted path: the path's entries are not
   contiguous in the cache, so each layer's keys and values are index-selected
   (`tree_forward.TreeSource.keep`).

Nodes are numbered level by level: node 0 is the root, the last token of the
sequence (position n - 1); node j sits in the cache at slot n - 1 + j and has
position id n - 1 + depth(j). Invariants: as `speculative_generate`'s. The
output follows the target's sampling exactly (greedy: its tokens); exactly
`max_new_tokens` tokens unless an EOS comes first (the tree is cut to depth
budget - 1 near the end, and to what a `LeanForward` draft's buffers hold:
its nodes take slots after the committed tokens); generation stops right
after an EOS, even one inside an accepted path; after compaction, the caches
give the logits of a fresh pass. Only models whose tree passes are exact are
accepted (`tree_forward.tree_unsupported`: no ALiBi, no sliding window).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ..decoder import (
    GenerationOutput,
    GenerationStats,
    IterationRecord,
    close_block,
)
from ..sampling import SamplingConfig, logits_to_probs
from ..validation import as_integer, check_capacity, check_generation_args, eos_set
from .forward import DraftTree, TreeForward, TreeLogitsSource, TreeSource, tree_attention, tree_source
from .verify import draw_children, verify_tree

__all__ = ["ConfidentShape", "DraftTree", "TreeForward", "TreeRecord", "check_widths",
           "draft_tree", "tree_attention", "tree_speculative_generate",
           "tree_speculative_step"]


@dataclass
class TreeRecord(IterationRecord):
    """An `IterationRecord` of a tree: `drafted` lists the nodes' tokens level
    by level; `path` gives the accepted nodes' numbers; `tries` the children
    tried at each node visited (those tried until one was accepted), root
    first, up to an EOS (the last visited node accepted none, unless an EOS
    ended the path); `parents` the drafted tree's shape (node 0 the root, -1;
    children in the order drawn)."""

    path: list[int] = field(default_factory=list)  # accepted, emitted nodes
    tries: list[int] = field(default_factory=list)  # per visited node
    parents: list[int] = field(default_factory=list)  # per node, root: -1

    @property
    def num_judged(self) -> int:
        """Drafted tokens the target judged: children tried along the path."""
        return sum(self.tries)


@dataclass(frozen=True)
class ConfidentShape:
    """A tree shaped by the draft's confidence (after EAGLE-2, Li et al. 2024):
    level d holds `levels[d - 1]` nodes, given to the (node, rank) pairs with
    the highest confidence, at most `top` children per node.

    A node's confidence is the product of the draft's probabilities along its
    lineage (at temperature 1 when decoding greedily); the r-th child of node
    n is worth confidence(n) times the r-th largest of n's probabilities. How
    many children a node gets is decided from its q alone, before they are
    drawn, so the sibling rule stays exact (`tree_verify`). EAGLE-2 also
    reranks the drafted nodes and drops the least confident; a child dropped
    for its own drawn probability would make the children tried depend on
    the draws, which the rule's proof does not allow, so there is no rerank.
    """

    levels: tuple[int, ...]  # nodes per level
    top: int = 4  # the most children of one node

    def __post_init__(self) -> None:
        # A list is taken as the tuple it spells; anything else is refused by name.
        if isinstance(self.levels, list):
            object.__setattr__(self, "levels", tuple(self.levels))
        if not isinstance(self.levels, tuple) or not self.levels \
                or any(as_integer(n) is None or n < 1 for n in self.levels) \
                or as_integer(self.top) is None or self.top < 1:
            raise ValueError("ConfidentShape needs levels, a non-empty tuple of integers >= 1 "
                             f"(nodes per level), and top >= 1, got {self.levels!r}, {self.top!r}")

    def __len__(self) -> int:
        return len(self.levels)

    def __getitem__(self, depth: slice) -> ConfidentShape:
        return ConfidentShape(self.levels[depth], self.top)


def confident_counts(confidence: torch.Tensor, scores: torch.Tensor,
                     budget: int, top: int) -> list[int]:
    """Children per node: the `budget` (node, rank) pairs worth most, at most
    `top` per node. confidence: (M, V) each node's probabilities; scores:
    (M,) each node's own confidence."""
    values = confidence.topk(min(top, confidence.size(-1)), dim=-1).values  # (M, top), sorted
    worth = (scores[:, None] * values).flatten()  # (M * top,)
    chosen = worth.topk(min(budget, worth.numel())).indices  # rank r of a node only after r - 1
    return torch.bincount(chosen // values.size(1), minlength=len(scores)).tolist()


# How a sampling tree's children are chosen: drawn from q without replacement, or
# the top-w tokens of q (EAGLE-2's trees), verified as point masses.
CHILDREN = ("sampled", "top-k")


@torch.no_grad()
def draft_tree(draft: TreeSource, sequence: torch.Tensor,
               widths: tuple[int, ...] | ConfidentShape, sampling: SamplingConfig,
               generator: torch.Generator | None = None, children: str = "sampled") -> DraftTree:
    """Grow a tree of shape `widths` after `sequence` (1, n).

    One draft pass per level. Sampling draws each node's children from its
    q without replacement (`tree_verify.draw_children`); greedy, or
    children="top-k", takes the draft's top-w tokens. A `ConfidentShape` gives
    each node of a level as many children as `confident_counts` allots it.
    """
    tree = DraftTree.rooted(int(sequence[0, -1]))
    confident = isinstance(widths, ConfidentShape)
    levels = widths.levels if confident else widths
    scores = torch.ones(1, dtype=torch.float64)  # each level node's confidence
    first, last = 0, 1  # the current level's nodes
    for level in levels:
        logits = draft.forward(sequence, tree, first, last)  # (M, V)
        # Greedy needs no q: the children are the draft's top tokens.
        q = None if sampling.greedy else logits_to_probs(logits, sampling)  # (M, V)
        counts = [level] * (last - first)
        if confident:  # the draft's own probabilities, at temperature 1 if greedy
            conf = (logits.double().softmax(-1) if q is None else q.double()).cpu()
            counts = confident_counts(conf, scores, level, widths.top)
        if sampling.greedy or children == "top-k":
            ranked = logits if q is None else q  # top-k of q: never a token q rules out
            top = ranked.topk(min(max(counts), logits.size(-1)), dim=-1)
            kids = [row[:w] for row, w in zip(top.indices.tolist(), counts, strict=True)]
        else:
            kids = [children[:w] for children, w in
                    zip(draw_children(q, max(counts), generator), counts, strict=True)]
        child_scores = []
        for node, tokens in zip(range(first, last), kids, strict=True):
            if q is not None:
                tree.q.append(q[node - first])
            for token in tokens:
                tree.add(node, token)
                if confident:
                    child_scores.append((node - first, token))
        if confident and child_scores:  # each child's confidence: its parent's times its q
            rows, tokens = zip(*child_scores, strict=True)
            scores = scores[list(rows)] * conf[list(rows), list(tokens)]
        first, last = last, len(tree.tokens)
        if first == last:
            break
    return tree


@torch.no_grad()
def tree_speculative_step(
    target: TreeSource,
    draft: TreeSource,
    sequence: torch.Tensor,
    widths: tuple[int, ...] | ConfidentShape,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    eos: set[int] = frozenset(),
    children: str = "sampled",
) -> tuple[torch.Tensor, TreeRecord, bool]:
    """One draft-verify-accept iteration over a tree; both caches compacted.

    Returns:
        (the extended sequence (1, n + emitted), what happened, whether an
        EOS was emitted).
    """
    n = sequence.size(1)
    # 1. Draft the tree (no draft pass for a tree of depth 0).
    root = int(sequence[0, -1])
    tree = draft_tree(draft, sequence, widths, sampling, generator, children) \
        if widths else DraftTree.rooted(root)
    # 2. One target pass over the unseen committed tokens and every node.
    logits = target.forward(sequence, tree, 0, len(tree.tokens))  # (N + 1, V)
    # (Greedy follows the argmax: the logits' is the one-hot p's.)
    p = logits if sampling.greedy else logits_to_probs(logits, sampling)  # (N + 1, V)
    # 3. The sibling rule, from the root down.
    q = torch.stack(tree.q) if tree.q else p[:0]  # (E, V)
    path, last, tried = verify_tree(tree.tokens, tree.children, p, q, generator,
                                    greedy=sampling.greedy, one_hot=children == "top-k")
    emitted = [tree.tokens[node] for node in path] + [last]
    block = close_block(emitted, len(path), n, eos)  # cut after an EOS
    new = torch.tensor([block.emitted], dtype=sequence.dtype,
                       device=sequence.device)
    sequence = torch.cat([sequence, new], dim=1)  # (1, n + emitted)
    # 4. Keep the committed tokens and the accepted path; the last token
    # emitted stays unseen by both models, as in the chain.
    slots = list(range(n)) + [n - 1 + node for node in path[: block.keep - n]]
    target.keep(slots)
    draft.keep(slots)
    # An EOS inside the path ends the block there: children tried below it
    # do not count.
    accepted = block.num_accepted
    record = TreeRecord(tree.tokens[1:], block.emitted, accepted,
                        path=path[:accepted],
                        tries=tried[:accepted] if block.cut else tried,
                        parents=list(tree.parents))
    return sequence, record, block.hit_eos


def draft_slots(widths: tuple[int, ...] | ConfidentShape) -> int:
    """The most nodes the draft is fed while growing a tree of shape `widths`
    (each takes a cache slot after the n - 1 committed tokens): the root and
    every level but the last, whose nodes are never fed; 0 for no tree."""
    if not widths:
        return 0
    if isinstance(widths, ConfidentShape):
        return 1 + sum(widths.levels[:-1])
    count, level = 1, 1
    for width in widths[:-1]:
        level *= width
        count += level
    return count


def check_widths(widths: object) -> tuple[int, ...] | ConfidentShape:
    """`widths` as a tuple of Python ints >= 1, at least one level (or a
    `ConfidentShape`, as it is)."""
    if isinstance(widths, ConfidentShape):
        return widths
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
    draft_model: PreTrainedModel | TreeLogitsSource,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    widths: tuple[int, ...] | list[int] | ConfidentShape = (3, 2, 1),
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | torch.Tensor | None = None,
    children: str = "sampled",
) -> GenerationOutput:
    """Generate with the draft proposing a tree and the target verifying it.

    Args:
        target_model: the large model whose distribution the output follows.
        draft_model: the small model (same vocabulary and device), or a
            `fast.lean.LeanForward` (as `fast.prepare` makes on a CPU) or a
            `fast.StaticForward` over it: a `tree_forward.TreeLogitsSource`.
        input_ids: the prompt, shape (1, n) with n >= 1.
        max_new_tokens: exactly this many tokens unless an EOS comes first.
        widths: children per node at each level, e.g. (3, 2, 1): 3 + 6 + 6
            nodes; (1,) * K is the chain of K drafts. Or a `ConfidentShape`:
            nodes per level, placed by the draft's confidence.
        sampling: temperature / top-k / top-p for both models; 0 is greedy.
        generator: the only source of randomness.
        eos_token_id: stop right after any of these tokens (None: never).
        children: when sampling, "sampled" draws each node's children from q
            without replacement; "top-k" takes q's top tokens (EAGLE-2), judged
            as point masses (`tree_verify.one_hot_step`). Both are exact.

    Returns:
        A `GenerationOutput`; its trace holds a `TreeRecord` per iteration,
        and `stats.tokens_per_target_call` is the block efficiency.

    Raises:
        ValueError / TypeError: for any malformed argument (`validation`), a
            model whose tree passes are not exact (ALiBi, sliding windows, a
            family not in `tree_forward.TREE_MODEL_TYPES`), or a draft whose
            cache cannot hold the prompt and `max_new_tokens`.
    """
    widths = check_widths(widths)
    if children not in CHILDREN:
        raise ValueError(f"children must be one of {CHILDREN}, got {children!r}")
    if not isinstance(draft_model, (PreTrainedModel, TreeLogitsSource, TreeSource)):
        raise TypeError("draft_model must be a transformers PreTrainedModel, a "
                        "fast.lean.LeanForward or fast.StaticForward, or a tree source "
                        f"(heads.trees.MedusaTreeSource), got {type(draft_model).__name__}")
    draft_weights = draft_model.model if isinstance(draft_model, (TreeLogitsSource, TreeSource)) \
        else draft_model
    target_weights = target_model.model if isinstance(target_model, TreeSource) else target_model
    models = {"target_model": target_weights, "draft_model": draft_weights}
    check_generation_args(models, input_ids, max_new_tokens, sampling,
                          generator)
    target = tree_source(target_model, "target_model")
    draft = tree_source(draft_model, "draft_model")
    if isinstance(target_model, TreeSource):  # built by the caller: a fresh sequence
        target.keep([])
    # A source built by the caller may have run before: count this call's passes.
    target_before, draft_before = target.forward_calls, draft.forward_calls
    # A TreeLogitsSource's buffers must hold the whole output, as in the chain.
    check_capacity("draft_model", draft.capacity,
                   input_ids.size(1) + max_new_tokens)
    eos = eos_set(eos_token_id)
    sequence, stats, trace = input_ids, GenerationStats(), []
    while stats.new_tokens < max_new_tokens:
        # Never past the budget: a tree of depth D emits up to D + 1 tokens.
        depth = min(len(widths), max_new_tokens - stats.new_tokens - 1)
        # Nor past a draft's fixed cache: its nodes take slots after the
        # n - 1 committed tokens, so near its end the tree grows shallower
        # (depth 1 always fits: n <= prompt + max_new_tokens - 2).
        while depth and draft.capacity is not None and \
                sequence.size(1) - 1 + draft_slots(widths[:depth]) > draft.capacity:
            depth -= 1
        sequence, record, hit_eos = tree_speculative_step(
            target, draft, sequence, widths[:depth] if depth else (), sampling,
            generator, eos, children)
        stats.count_block(record)
        trace.append(record)
        if hit_eos:
            break
    stats.target_calls = target.forward_calls - target_before
    stats.draft_calls = draft.forward_calls - draft_before
    return GenerationOutput(sequence, stats, trace)

"""Verify a tree of drafts exactly: recursive rejection sampling over siblings.

A draft tree (`specdec_ref.trees.tree`) gives a node up to w children, drafted from
the draft model's distribution q at that node; one target pass gives every node
its own p. Verification walks down from the root. At a node, its children are
tried in the order they were drawn; an accepted child becomes the next node.
When every child is rejected, one token is drawn from what is left of p and the
walk stops; at a leaf, the bonus token is drawn from p.

The sibling rule: recursive rejection sampling (SpecInfer's multi-step
speculative sampling, Miao et al. 2024, draws the children with replacement;
drawing them without replacement follows Jeon et al. 2024, Recursive
Speculative Decoding). The children x_1 .. x_m are drawn from q WITHOUT
replacement: x_i from q_i, which is q with x_1 .. x_{i-1} removed and
renormalised (fewer than w children when q has fewer tokens). With p_1 = p:

1. accept x_i with probability min(1, p_i(x_i) / q_i(x_i)) and stop;
2. after a rejection, p_{i+1} = normalize(max(0, p_i - q_i)); try x_{i+1};
3. if all m children are rejected, emit a token drawn from p_{m+1}.

Why the emitted token follows p. Chapter 4's step works for ANY proposal r:
draw x ~ r, accept it with probability min(1, pi(x) / r(x)), else draw from
normalize(max(0, pi - r)); then P(y) = min(pi(y), r(y)) + sum_x max(0, pi(x) -
r(x)) * residual(y) = pi(y). Here "draw from the residual" is itself such a
step, with target p_{i+1} and proposal q_{i+1}. Induction on the children left:
if what follows a rejection emits p_{i+1} exactly, step i emits p_i exactly.
q_{i+1} depends on the rejected x_i, but p_{i+1} does not, and x_{i+1} was
drawn from q_{i+1} given x_i, independently of the uniform that rejected x_i:
the step holds for any proposal, so conditioning on x_i changes nothing. Hence
the token emitted at a node follows p_1 = p, for any width. A rejected x_i had
p_i(x_i) < q_i(x_i), so p_{i+1}(x_i) = 0: the residual never returns a token
already tried, consistent with q_{i+1}(x_i) = 0. A child's subtree was drafted
given that child alone, so the walk starts afresh at the accepted child, and
the law of the whole path follows by induction on the depth (the bonus at a
leaf comes from p there).

Drawing WITH replacement (every q_i = q) is exact by the same argument; without
replacement never spends a child on a token already rejected, so more children
are accepted. Drawing without replacement but judging against q instead of q_i
(the with-replacement rule on distinct children) is biased, and so is
resampling from p after a rejection (the article's rule): `sibling_law` shows
both. `tree_law` enumerates the law of the tree decoder's first tokens; with
the exact rule it is the target's own (`laws.target_law`), to rounding.

Greedy (temperature 0): the children are the draft's top-w tokens; the walk
follows the child equal to the target's argmax, and emits the argmax where none
is (the longest path that matches the target's greedy choices).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..laws import reference_probs
from ..rejection import residual_distribution
from ..sampling import SamplingConfig, draw_device, sample

# The rule after a rejection: "exact" (q_i and p_{i+1} as above); "q" (q for
# every q_i, on children drawn without replacement: biased); "article"
# (p_{i+1} = p: biased). Only "exact" is used by the decoder.
RULES = ("exact", "q", "article")


def without(q: torch.Tensor, tried: list[int]) -> torch.Tensor:
    """q_i: q with the tried tokens removed, renormalised (float64).

    All zeros when the tried tokens hold all of q's mass.
    """
    q_i = q.double().clone()  # (V,)
    q_i[tried] = 0
    mass = q_i.sum()
    return q_i / mass if mass > 0 else q_i


def draw_children(q: torch.Tensor, width: int,
                  generator: torch.Generator | None = None) -> list[list[int]]:
    """Draw up to `width` distinct children per row of q, without replacement.

    Gumbel-top-k (Kool et al. 2019): the order of log q + Gumbel noise is
    the order of sequential draws, each from q with the earlier ones
    removed and renormalised (the q_i of the rule). Tokens of zero mass are
    never drawn, so a row with fewer than `width` such tokens has fewer
    children.

    Args:
        q: the draft distributions, shape (M, V).
        width: w >= 1, the most children per row.
        generator: the only source of randomness.

    Returns:
        For each row, its children's tokens in the order they were drawn.
    """
    device = draw_device(generator)
    logq = q.to(device, torch.float64).log()  # (M, V), -inf where q = 0
    u = torch.rand(logq.shape, dtype=torch.float64, device=device,
                   generator=generator)  # (M, V)
    tiny = torch.finfo(torch.float64).tiny
    gumbel = -(-u.clamp(min=tiny).log()).log()  # (M, V)
    keys, order = (logq + gumbel).topk(min(width, q.size(-1)), dim=-1)
    found = keys > -torch.inf  # (M, w)
    return [[t for t, ok in zip(row, oks, strict=True) if ok]
            for row, oks in zip(order.tolist(), found.tolist(), strict=True)]


def sibling_step(
    p: torch.Tensor,
    q: torch.Tensor,
    children: list[int],
    generator: torch.Generator | None = None,
    *,
    rule: str = "exact",
) -> tuple[int | None, int, int]:
    """The sibling rule at one node: try its children in order.

    Args:
        p: the target's distribution at the node, shape (V,).
        q: the draft's distribution the children were drawn from, (V,).
        children: their tokens, drawn from q without replacement.
        generator: draws the uniforms and the residual token.
        rule: one of `RULES`; the decoder uses "exact".

    Returns:
        (index of the accepted child or None, the emitted token: that
        child or a draw from the last residual, children tried).
    """
    device = draw_device(generator)
    p_i = p.to(device, torch.float64)  # (V,)
    q = q.to(device, torch.float64)  # (V,)
    for i, x in enumerate(children):
        q_i = without(q, children[:i]) if rule != "q" else q / q.sum()
        u = torch.rand((), dtype=torch.float64, device=device,
                       generator=generator)
        # Accept x iff u * q_i(x) < p_i(x): probability min(1, p_i / q_i).
        if u * q_i[x] < p_i[x]:
            return i, x, i + 1
        # Rejected: what is left of p for the next child.
        if rule != "article":
            p_i = residual_distribution(p_i, q_i)
    return None, int(sample(p_i, generator)), len(children)


def one_hot_step(p: torch.Tensor, children: list[int],
                 generator: torch.Generator | None = None) -> tuple[int | None, int, int]:
    """The sibling rule for children chosen, not drawn: the draft's top-w tokens
    (EAGLE-2's trees, Li et al. 2024b). Child x_i is a proposal from the point
    mass at x_i, so chapter 4's step accepts it with probability
    min(1, p_i(x_i) / 1) = p_i(x_i), and after a rejection the residual
    normalize(max(0, p_i - one-hot(x_i))) is p_i with x_i removed. Exact by the
    same induction as `sibling_step`: each proposal is fixed before the uniform
    that judges it. Returns what `sibling_step` returns."""
    device = draw_device(generator)
    p_i = p.to(device, torch.float64)  # (V,)
    for i, x in enumerate(children):
        u = torch.rand((), dtype=torch.float64, device=device, generator=generator)
        if u < p_i[x]:
            return i, x, i + 1
        p_i = p_i.clone()
        p_i[x] = 0  # the residual: x removed, the rest renormalised
        p_i = p_i / p_i.sum()
    return None, int(sample(p_i, generator)), len(children)


def verify_tree(
    tokens: list[int],
    children: list[list[int]],
    p: torch.Tensor,
    q: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    greedy: bool = False,
    rule: str = "exact",
    one_hot: bool = False,
) -> tuple[list[int], int, list[int]]:
    """Walk down a draft tree from its root, node 0.

    Args:
        tokens: each node's token (the root's is the last one emitted).
        children: each node's children (node indices), in drawing order.
        p: the target's distribution at every node, shape (N + 1, V).
        q: the draft's distribution at every node that has children (the
            first rows: nodes are numbered level by level), (E, V).
        generator: the only source of randomness.
        greedy: follow the target's argmax instead of the sibling rule.
        rule: one of `RULES` (sampling only).
        one_hot: the children were the draft's top tokens, not draws from q
            (`one_hot_step`; sampling only).

    Returns:
        (the accepted nodes, root to deepest; the token emitted after them,
        a correction or the bonus; children tried at each node visited).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    choice = p.argmax(-1).tolist() if greedy else None  # N + 1 ints
    node, path, tried = 0, [], []
    while True:
        kids = children[node]
        if greedy:
            # The child the target would pick, if it was drafted.
            hits = [i for i, c in enumerate(kids) if tokens[c] == choice[node]]
            index = hits[0] if hits else None
            tried.append(index + 1 if hits else len(kids))
            if index is None:
                return path, choice[node], tried
        elif not kids:
            # A leaf, at the last level: the bonus token from p there.
            tried.append(0)
            return path, int(sample(p[node], generator)), tried
        else:
            index, token, count = one_hot_step(p[node], [tokens[c] for c in kids], generator) \
                if one_hot else sibling_step(p[node], q[node], [tokens[c] for c in kids],
                                             generator, rule=rule)
            tried.append(count)
            if index is None:
                return path, token, tried
        node = kids[index]
        path.append(node)


def sibling_outcomes(p: torch.Tensor, q: torch.Tensor, width: int, *,
                     rule: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
    """What the sibling rule does at one node, by exact enumeration.

    Every ordered draw of up to `width` distinct children from q is
    followed, with every accept / reject branch, in float64. Which token
    was accepted is all that matters below the node: the accepted child's
    subtree was drafted given that token alone.

    Args:
        p: the target's distribution, shape (V,); q: the draft's, (V,).
        width: w >= 1, the most children.
        rule: one of `RULES`.

    Returns:
        (accepted, corrected), each (V,) float64: the probability that a
        child with token x is accepted, and that all children are rejected
        and y is drawn from the last residual. They sum to 1 over both.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    p, q = p.double(), q.double() / q.double().sum()
    accepted, corrected = torch.zeros_like(p), torch.zeros_like(p)  # (V,)

    def walk(tried: list[int], p_i: torch.Tensor, reach: float) -> None:
        # `reach`: the probability that `tried` were drawn and all rejected.
        q_i = without(q, tried)
        if len(tried) == width or q_i.sum() == 0:
            corrected.add_(reach * p_i)  # no child left: a draw from p_i
            return
        judge = q if rule == "q" else q_i
        after = p if rule == "article" else residual_distribution(p_i, judge)
        for x in q_i.nonzero().flatten().tolist():
            drawn = reach * float(q_i[x])
            accept = min(1.0, float(p_i[x]) / float(judge[x]))
            accepted[x] += drawn * accept
            if accept < 1:
                walk(tried + [x], after, drawn * (1 - accept))

    walk([], p, 1.0)
    return accepted, corrected


def one_hot_outcomes(p: torch.Tensor, q: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What `one_hot_step` does at one node, by exact enumeration: the children are
    q's top `width` tokens (as `tree.draft_tree` takes them). Returns what
    `sibling_outcomes` returns."""
    p = p.double()
    accepted, corrected = torch.zeros_like(p), torch.zeros_like(p)  # (V,)
    p_i, reach = p, 1.0
    for x in q.double().topk(min(width, q.numel())).indices.tolist():
        accepted[x] += reach * float(p_i[x])
        reach *= 1 - float(p_i[x])
        if reach == 0:
            return accepted, corrected
        p_i = p_i.clone()
        p_i[x] = 0
        p_i = p_i / p_i.sum()
    corrected.add_(reach * p_i)
    return accepted, corrected


def sibling_law(p: torch.Tensor, q: torch.Tensor, width: int, *,
                rule: str = "exact") -> torch.Tensor:
    """The law of the token emitted at one node (accepted child or
    correction), shape (V,) float64: p itself for the "exact" rule."""
    accepted, corrected = sibling_outcomes(p, q, width, rule=rule)
    return accepted + corrected


@torch.no_grad()
def tree_law(target_model: PreTrainedModel, draft_model: PreTrainedModel,
             input_ids: torch.Tensor, widths: tuple[int, ...], *,
             sampling: SamplingConfig = SamplingConfig(), num_tokens: int = 1,
             rule: str = "exact", children: str = "sampled") -> dict[tuple[int, ...], float]:
    """The exact law of the tree decoder's first `num_tokens` tokens.

    Follows `tree.tree_speculative_generate` with max_new_tokens =
    num_tokens: at each node, `sibling_outcomes`; an accepted child goes
    one level down, a correction or a bonus (below the last level) ends
    the block, and the next block's tree is cut to the budget left. One
    pass of each model per context, as `laws.target_law` makes (keep
    V ** num_tokens small).

    children="top-k" follows the trees of q's top tokens (`one_hot_outcomes`).

    Returns:
        {tokens: probability} (float64); "exact" gives `laws.target_law`.
    """
    if sampling.greedy:
        raise ValueError("sampling must have temperature > 0: a greedy "
                         "decoder has no law to enumerate")
    probs: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def p_and_q(context: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        # Both models' processed distributions after prompt + context.
        if context not in probs:
            tail = torch.tensor([context], dtype=input_ids.dtype)
            ids = torch.cat([input_ids, tail.to(input_ids.device)], dim=1)
            probs[context] = tuple(
                reference_probs(model(ids).logits[0, -1], sampling).cpu()
                for model in (target_model, draft_model))
        return probs[context]

    law: dict[tuple[int, ...], float] = {}

    def emit(context: tuple[int, ...], mass: float) -> None:
        # `context` was emitted with probability `mass`: a new block.
        if len(context) >= num_tokens:
            key = context[:num_tokens]
            law[key] = law.get(key, 0.0) + mass
        else:
            depth = min(len(widths), num_tokens - len(context) - 1)
            node(context, widths[:depth], mass)

    def node(context: tuple[int, ...], levels: tuple[int, ...],
             mass: float) -> None:
        # A node reached with probability `mass`; `levels` are below it.
        p, q = p_and_q(context)
        if not levels:
            # A leaf: the bonus token from p.
            for y in p.nonzero().flatten().tolist():
                emit(context + (y,), mass * float(p[y]))
            return
        accepted, corrected = one_hot_outcomes(p, q, levels[0]) if children == "top-k" \
            else sibling_outcomes(p, q, levels[0], rule=rule)
        for y in corrected.nonzero().flatten().tolist():
            emit(context + (y,), mass * float(corrected[y]))
        for x in accepted.nonzero().flatten().tolist():
            if len(context) + 1 >= num_tokens:
                emit(context + (x,), mass * float(accepted[x]))
            else:
                node(context + (x,), levels[1:], mass * float(accepted[x]))

    emit((), 1.0)
    return law

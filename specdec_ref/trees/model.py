"""Chapter 6's model of speed, extended to trees of drafts.

A chain of K drafts, each accepted with probability alpha, emits
(1 - alpha^(K+1)) / (1 - alpha) tokens per target pass. A tree replaces the
single child per node by several, tried in order (`tree_verify`): what
matters is the chance that the r-th child tried is accepted once the r - 1
before it were rejected. Call it a_r, the acceptance at rank r; a_1 is the
chain's alpha.

Model: a_r depends on the rank only, not on the depth or the context. Then a
child of rank r is accepted, given its parent was reached, with probability

    P(rank r) = (1 - a_1) ... (1 - a_{r-1}) a_r,

a node is on the accepted path with the product of these along its lineage,
and the expected number of accepted drafts is their sum over the nodes (the
expected tokens per target pass adds one: the correction or the bonus).
For a chain (every width 1) this is alpha + alpha^2 + ... + alpha^K, chapter
6's formula less one.

Time: one iteration costs one target pass over the tree's N + 1 rows, v(N)
target steps, plus one draft pass per level, each c_d target steps; the
predicted speedup over decoding with the target alone is the expected tokens
per pass over that cost.

`rank_rates` estimates a_r from a decoder's trace (`tree.TreeRecord`s):
where a node was visited, the children it tried and whether it accepted one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def shape_parents(widths: Sequence[int]) -> list[int]:
    """The parents of a tree of shape `widths` (w_1 children for the root,
    w_2 for each of them, ...), numbered level by level; the root's is -1."""
    parents, level = [-1], [0]
    for width in widths:
        nxt = []
        for node in level:
            for _ in range(width):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def sibling_ranks(parents: Sequence[int]) -> list[int]:
    """Each node's rank among its siblings, 1 for the first drawn (the
    root's: 0). Children appear in `parents` in the order they were drawn."""
    seen: dict[int, int] = {}
    ranks = [0]
    for parent in parents[1:]:
        seen[parent] = seen.get(parent, 0) + 1
        ranks.append(seen[parent])
    return ranks


def rank_counts(records: Iterable) -> tuple[list[int], list[int]]:
    """How often the child of each rank was tried, and accepted, over
    `TreeRecord`s' `tries` and `path`: ([tried at rank 1, 2, ...],
    [accepted at rank 1, 2, ...]). Counts from several runs add up."""
    trials: list[int] = []
    accepts: list[int] = []
    for record in records:
        for visited, tried in enumerate(record.tries):
            grow = tried - len(trials)
            trials += [0] * grow
            accepts += [0] * grow
            for rank in range(tried):
                trials[rank] += 1
            if visited < len(record.path):  # this node's child is on the path
                accepts[tried - 1] += 1
    return trials, accepts


def rates_from_counts(trials: Sequence[int], accepts: Sequence[int],
                      max_rank: int | None = None) -> list[float]:
    """a_r = accepted / tried at rank r (0 for a rank never tried)."""
    deepest = len(trials) if max_rank is None else max_rank
    return [accepts[r] / trials[r] if r < len(trials) and trials[r] else 0.0
            for r in range(deepest)]


def rank_rates(records: Iterable, max_rank: int | None = None) -> list[float]:
    """a_r, r = 1, 2, ...: how often the r-th child tried at a node was
    accepted, among the nodes where it was tried (the r - 1 before it
    rejected). Read from `TreeRecord`s' `tries` and `path`.

    Returns:
        [a_1, a_2, ...] up to the deepest rank tried (or `max_rank`); a rank
        never tried gets 0.
    """
    return rates_from_counts(*rank_counts(records), max_rank=max_rank)


def rank_probabilities(rates: Sequence[float]) -> list[float]:
    """P(the child of rank r is the one accepted | its parent was reached),
    for r = 1 .. len(rates)."""
    out, rejected = [], 1.0
    for rate in rates:
        out.append(rejected * rate)
        rejected *= 1.0 - rate
    return out


def expected_accepted(parents: Sequence[int], rates: Sequence[float]) -> float:
    """The expected number of accepted drafts of a tree (`parents`, as in
    `shape_parents`) under the rank model; ranks past `rates` count 0."""
    by_rank = rank_probabilities(rates)
    reach = [1.0] + [0.0] * (len(parents) - 1)  # P(node accepted); root: 1
    for node, rank in enumerate(sibling_ranks(parents)):
        if node:
            chance = by_rank[rank - 1] if rank <= len(by_rank) else 0.0
            reach[node] = reach[parents[node]] * chance  # parents come first
    return sum(reach[1:])


def expected_tokens(parents: Sequence[int], rates: Sequence[float]) -> float:
    """Expected tokens emitted per target pass: accepted drafts + 1."""
    return 1.0 + expected_accepted(parents, rates)


def predicted_speedup(tokens_per_pass: float, verify_cost: float,
                      draft_costs: Sequence[float]) -> float:
    """Tokens per target pass over one iteration's cost in target steps:
    the tree's pass over N drafts, v(N), plus each draft level's pass, c_d."""
    if verify_cost <= 0 or any(c < 0 for c in draft_costs):
        raise ValueError("verify_cost must be > 0 and draft_costs >= 0, got "
                         f"{verify_cost!r} and {list(draft_costs)!r}")
    return tokens_per_pass / (verify_cost + sum(draft_costs))

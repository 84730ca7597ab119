"""How many tokens to draft per iteration: fixed, or adapted as generation runs.

The best K depends on how often drafts are accepted (alpha) and how much a draft
step costs relative to a target step (c): drafting too few wastes the cheap
verification of several tokens, drafting too many wastes draft passes on tokens
that will be rejected. Three schedules share one small interface:

* `FixedDraftLength(k)`: always K (what an int `num_draft_tokens` means);
* `HeuristicDraftLength`: +2 after a fully accepted block, -1 otherwise, within
  bounds (the rule `transformers`' assisted generation uses);
* `ModelBasedDraftLength`: estimates alpha from the acceptances seen so far and
  picks the K that maximises the expected speedup of `analysis.optimal_draft_length`.

No schedule can affect exactness: every token is still accepted or corrected by the
rejection rule, whatever K is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .analysis import VerifyCost, optimal_draft_length
from .validation import as_integer, check_draft_length, check_integer


class DraftLengthSchedule(Protocol):
    """Proposes K before each iteration and learns from what was accepted.

    `next_k()` returns an integer K >= 0 (0: no drafts, one plain target step); the
    decoder raises a `ValueError` / `TypeError` naming the schedule for anything else.
    `update(num_drafted, num_accepted)` follows each iteration: `num_drafted` is the K
    actually drafted, which is less than the K asked for when the token budget cut the
    block short (or, when an accepted draft was an EOS, the drafts up to it), and
    `num_accepted` counts the accepted drafts that were emitted.
    """

    def next_k(self) -> int: ...

    def update(self, num_drafted: int, num_accepted: int) -> None: ...


@dataclass
class FixedDraftLength:
    """Always draft `k` tokens."""

    k: int  # tokens drafted per iteration

    def __post_init__(self) -> None:
        check_integer("k", self.k, minimum=1)

    def next_k(self) -> int:
        return self.k

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """A fixed K learns nothing."""


@dataclass
class HeuristicDraftLength:
    """+2 after a fully accepted block, -1 after any rejection, within [min_k, max_k].

    The rule of `transformers`' assisted generation ("heuristic" schedule), with one
    difference: a block the token budget cut short (fewer drafts than the K proposed)
    that was fully accepted leaves K alone, since it never tested K drafts; a rejection
    in it still counts, as the same rejection would have ended a block of K.
    """

    k: int = 5  # the current K, adapted after every block
    min_k: int = 1  # never draft fewer than this
    max_k: int = 16  # never draft more than this

    def __post_init__(self) -> None:
        for name in ("k", "min_k", "max_k"):
            check_integer(name, getattr(self, name), minimum=1)
        if not self.min_k <= self.k <= self.max_k:
            raise ValueError(f"need min_k <= k <= max_k, got {self.min_k}, {self.k}, {self.max_k}")

    def next_k(self) -> int:
        return self.k

    def update(self, num_drafted: int, num_accepted: int) -> None:
        # A short block (num_drafted < k, including no drafts at all) with no rejection
        # says nothing about K: only a full block of k accepted drafts earns the +2.
        rejected = num_accepted < num_drafted
        if num_drafted < self.k and not rejected:
            return
        step = -1 if rejected else 2
        self.k = max(self.min_k, min(self.max_k, self.k + step))


@dataclass
class ModelBasedDraftLength:
    """Pick K from an estimate of alpha and the draft/target cost ratio.

    alpha is estimated as accepted / judged drafts (those the target got to judge),
    with older iterations weighted down by `memory` so the estimate follows the text,
    and a prior of `prior_alpha` worth `prior_weight` drafts so the first iterations
    do not swing K wildly.
    """

    cost_ratio: float  # c: draft pass time / target pass time, measured on the pair
    verify_cost: VerifyCost = None  # v(K): target pass over K + 1 tokens / a 1-token pass (None: 1)
    min_k: int = 1  # never draft fewer than this
    max_k: int = 12  # never draft more than this
    prior_alpha: float = 0.6  # assumed alpha before any evidence
    prior_weight: float = 8.0  # how many judged drafts the prior counts for
    memory: float = 0.95  # share of past evidence kept per iteration (tracks a changing alpha)
    judged: float = 0.0  # drafts the target judged, decayed by `memory` (none after a rejection)
    accepted: float = 0.0  # accepted drafts, decayed by `memory`

    def __post_init__(self) -> None:
        check_integer("min_k", self.min_k, minimum=1)
        check_integer("max_k", self.max_k, minimum=1)
        if self.min_k > self.max_k:
            raise ValueError(f"need min_k <= max_k, got {self.min_k} > {self.max_k}")
        if not self.cost_ratio >= 0:
            raise ValueError(f"cost_ratio must be >= 0, got {self.cost_ratio!r}")
        if not 0 < self.memory <= 1:
            raise ValueError(f"memory must lie in (0, 1], got {self.memory!r}")
        if not 0 <= self.prior_alpha < 1:
            raise ValueError(f"prior_alpha must lie in [0, 1), got {self.prior_alpha!r}")

    @property
    def alpha(self) -> float:
        """The current estimate of alpha, the chance that one drafted token is accepted."""
        return (self.accepted + self.prior_alpha * self.prior_weight) / (self.judged + self.prior_weight)

    def next_k(self) -> int:
        return optimal_draft_length(
            self.alpha, self.cost_ratio, max_k=self.max_k, min_k=self.min_k, verify_cost=self.verify_cost
        )

    def update(self, num_drafted: int, num_accepted: int) -> None:
        # Drafts after the first rejection were never judged: they say nothing about alpha.
        self.judged = self.memory * self.judged + num_accepted + (num_accepted < num_drafted)
        self.accepted = self.memory * self.accepted + num_accepted



def as_schedule(num_draft_tokens: int | DraftLengthSchedule) -> DraftLengthSchedule:
    """An integer (int, numpy integer) becomes `FixedDraftLength`; a schedule is used as it is.

    Raises:
        TypeError: if `num_draft_tokens` is neither an integer nor a schedule.
        ValueError: if it is an integer below 1.
    """
    if hasattr(num_draft_tokens, "next_k") and hasattr(num_draft_tokens, "update"):
        return num_draft_tokens
    k = as_integer(num_draft_tokens)
    if k is None:
        raise TypeError(
            f"num_draft_tokens must be an integer >= 1 or a schedule (with next_k and update), "
            f"got {num_draft_tokens!r}"
        )
    if k < 1:
        raise ValueError(f"num_draft_tokens must be an integer >= 1 or a schedule, got {num_draft_tokens!r}")
    return FixedDraftLength(k)


def next_draft_length(schedule: DraftLengthSchedule) -> int:
    """`schedule.next_k()` as a checked Python int >= 0.

    Raises:
        TypeError / ValueError: naming the schedule and the value, if next_k() returned
            anything but an integer >= 0 (a float, a bool, a negative number).
    """
    return check_draft_length(schedule.next_k(), f"{type(schedule).__name__}.next_k()")

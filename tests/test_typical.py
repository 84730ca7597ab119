"""Medusa's typical acceptance changes the output law; chapter 4's exact rule does not."""

import torch

from specdec_ref.heads.typical import first_token_law, law_tv, typical_accepts


def _toy():
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64)
    q = torch.tensor([0.70, 0.05, 0.05, 0.05, 0.05, 0.10], dtype=torch.float64)
    return p, q


def test_exact_rule_keeps_the_law():
    p, q = _toy()
    assert law_tv(first_token_law(p, q, "exact"), p) < 1e-12


def test_typical_rule_changes_the_law():
    p, q = _toy()
    law = first_token_law(p, q, "typical")
    assert abs(float(law.sum()) - 1) < 1e-12
    # The drafter over-proposes token 0 and the threshold accepts it whenever drafted.
    assert law_tv(law, p) > 0.1


def test_typical_accepts_reads_only_p():
    p, _ = _toy()
    drafts = torch.arange(6)
    accepted = typical_accepts(p.expand(6, 6), drafts)
    assert accepted[0] and not accepted[-1]

"""The decoder against the official ``_reparam_decoding``: the schedule against ⌊n(S − s)/S⌋ over a grid, the
deterministic top-k's tie rule, the confidence each strategy ranks by, the banned ids and where the repeat
safeguard acts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import icml24.dplm.sampler as sampler
from icml24.dplm.sampler import lowest_k, masked_init, reparam_decode, schedule
from icml24.dplm.tokens import (
    AA_IDS,
    CLS,
    EOS,
    MASK,
    NEVER_SAMPLED,
    OFFICIAL_NEVER_SAMPLED,
    PAD,
    TOKEN_ID,
    VOCAB,
)


class Fixed(nn.Module):
    """A 'network' whose logits at position j are ``table[j]`` whatever the input (B, L, 33)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, input_ids, attention_mask=None):
        return self.table.expand(input_ids.shape[0], -1, -1).clone()


def table(length: int, rows: dict[int, dict[str, float]]) -> torch.Tensor:
    """Logits for [<cls>] + length residues + [<eos>]: -1e4 everywhere except ``rows[j][token] = value``."""
    t = torch.full((length + 2, len(VOCAB)), -1e4)
    for j, row in rows.items():
        for tok, val in row.items():
            t[j, TOKEN_ID[tok]] = val
    return t


def inputs_per_step(monkeypatch) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    real = sampler.logits_of

    def spy(model, x, attn):
        seen.append(x.clone())
        return real(model, x, attn)

    monkeypatch.setattr(sampler, "logits_of", spy)
    return seen


def test_schedule_is_the_exact_formula_over_a_grid():
    n = torch.arange(0, 97)
    for S in range(1, 49):
        for s in range(1, S + 1):
            expect = torch.tensor([(int(m) * (S - s)) // S for m in n])
            assert torch.equal(schedule(n, s, S), expect), (S, s)
    assert int(schedule(torch.tensor([24]), 10, 24)) == 14  # the case (float64 floor gives 13)


def test_the_official_float32_rounding_differs_as_declared():
    """The NOTE(deviation) in ``schedule``: float32 ``(n * (1 - s/S)).long()`` is one below the formula in
    346 of the 646,400 cases n <= 128, S <= 100, and float64 floor in 3,249; never by more than one."""
    n = torch.arange(1, 129)
    off32 = off64 = 0
    for S in range(1, 101):
        s = torch.arange(1, S + 1).unsqueeze(1)
        exact = (n * (S - s)) // S
        f32 = (n.float() * (1 - s.double() / S).float()).long()
        f64 = torch.floor(n.double() * (1.0 - s.double() / S)).long()
        assert ((exact - f32) >= 0).all() and ((exact - f32) <= 1).all()
        off32 += int((f32 != exact).sum())
        off64 += int((f64 != exact).sum())
    assert (off32, off64) == (346, 3249)
    assert int((torch.tensor([22.0]) * (1 - 9 / 22)).long()) == 12 and int(schedule(torch.tensor([22]), 9, 22)) == 13


def test_lowest_k_is_the_official_strict_cutoff():
    score = torch.tensor([[3.0, 1.0, 2.0, 1.0, 0.0]])
    cand = torch.tensor([[True, True, True, True, False]])  # the last is fixed: never masked
    assert lowest_k(score, cand, torch.tensor([2])).tolist() == [[False, True, False, True, False]]
    # a tie at the cutoff: the 2nd smallest equals the 1st, nothing is strictly below it
    assert lowest_k(score, cand, torch.tensor([1])).tolist() == [[False] * 5]
    assert lowest_k(score, cand, torch.tensor([3])).tolist() == [[False, True, True, True, False]]
    assert not lowest_k(score, cand, torch.tensor([0])).any()


def test_tied_confidences_are_all_decoded_at_once(monkeypatch):
    seen = inputs_per_step(monkeypatch)
    t = table(8, {j: {"A": 1.0} for j in range(1, 9)})
    x = reparam_decode(Fixed(t), masked_init(2, 8), max_iter=4, strategy="argmax")
    assert not (seen[1] == MASK).any() and (x[:, 1:-1] == TOKEN_ID["A"]).all()


def test_argmax_ranks_by_the_raw_logit(monkeypatch):
    """Position 1: two residues at logit 5 (log-softmax −0.69); position 2: one at 4 (log-softmax 0). The official
    ``logits.max(-1)`` re-masks position 2; ranking by log-softmax would re-mask position 1."""
    seen = inputs_per_step(monkeypatch)
    t = table(2, {1: {"A": 5.0, "G": 5.0}, 2: {"L": 4.0}})
    reparam_decode(Fixed(t), masked_init(3, 2), max_iter=2, strategy="argmax")
    assert (seen[1][:, 2] == MASK).all() and (seen[1][:, 1] != MASK).all()


def test_vanilla_ranks_by_the_categorical_log_prob(monkeypatch):
    """Position 1: two equal residues (log p = −0.69); position 2: three (log p = −1.10). The official
    ``Categorical.log_prob`` re-masks position 2 in every row; a Gumbel-perturbed score would not."""
    seen = inputs_per_step(monkeypatch)
    t = table(2, {1: {"A": 0.0, "G": 0.0}, 2: {"L": 0.0, "K": 0.0, "E": 0.0}})
    reparam_decode(Fixed(t), masked_init(300, 2), max_iter=2, strategy="vanilla", temperature=2.0,
                   generator=torch.Generator().manual_seed(0))
    assert (seen[1][:, 2] == MASK).all() and (seen[1][:, 1] != MASK).all()


def test_banned_ids_official_five_or_residues_only():
    assert sorted(OFFICIAL_NEVER_SAMPLED) == sorted([MASK, TOKEN_ID["X"], PAD, CLS, EOS])
    assert set(OFFICIAL_NEVER_SAMPLED) < set(NEVER_SAMPLED) and len(NEVER_SAMPLED) == 13
    t = table(6, {j: {"X": 100.0, "B": 50.0, "<unk>": 50.0, "L": 0.0} for j in range(1, 7)})
    g = torch.Generator().manual_seed(0)
    x = reparam_decode(Fixed(t), masked_init(4, 6), max_iter=3, resample_ratio=None, generator=g)
    assert torch.isin(x[:, 1:-1], AA_IDS).all()
    y = reparam_decode(Fixed(t), masked_init(4, 6), max_iter=3, resample_ratio=None, residues_only=False,
                       generator=g)
    assert torch.isin(y[:, 1:-1], torch.tensor([TOKEN_ID["B"], TOKEN_ID["<unk>"]])).all()


@pytest.mark.parametrize("strategy, calls", [("gumbel_argmax", True), ("vanilla", False), ("argmax", False)])
def test_the_repeat_safeguard_acts_only_under_gumbel_argmax(monkeypatch, strategy, calls):
    called = []
    real = sampler._resample_repeats

    def spy(*a, **k):
        called.append(1)
        return real(*a, **k)

    monkeypatch.setattr(sampler, "_resample_repeats", spy)
    t = table(4, {j: {"A": 1.0, "G": 0.5} for j in range(1, 5)})
    reparam_decode(Fixed(t), masked_init(2, 4), max_iter=2, strategy=strategy,
                   generator=torch.Generator().manual_seed(0))
    assert bool(called) == calls


def test_a_redrawn_position_takes_the_redraws_confidence():
    """Official ``resample``: the redrawn token's score is the redraw's max log_softmax(top-p logits + Gumbel)."""
    cand = torch.full((1, 8), TOKEN_ID["G"])
    score = torch.full((1, 8), -123.0)
    logits = table(6, {j: {"G": 0.0, "A": 0.0} for j in range(8)}).unsqueeze(0)
    gen = torch.zeros(1, 8, dtype=torch.bool)
    gen[:, 1:7] = True
    new_cand, new_score = sampler._resample_repeats(cand, score, logits, gen, 0.25, torch.Generator().manual_seed(0))
    assert torch.isin(new_cand[gen], torch.tensor([TOKEN_ID["G"], TOKEN_ID["A"]])).all()
    # the two-way nucleus: the winner's log-softmax lies in [log 1/2, 0]
    assert (new_score[gen] >= torch.log(torch.tensor(0.5)) - 1e-6).all() and (new_score[gen] <= 0).all()
    assert (new_score[~gen] == -123.0).all()


def test_decoded_tokens_are_kept_until_re_masked(monkeypatch):
    """Official "uncond" step: a decoded position outside the k_s lowest keeps its token (its fresh candidate
    only ranks it); it changes only by being re-masked and decoded again. Uniform logits make every fresh
    candidate differ from the kept token with probability 19/20, so a redraw-every-step bug shows at once."""
    from icml24.dplm.tokens import AMINO_ACIDS

    seen = inputs_per_step(monkeypatch)
    t = table(16, {j: dict.fromkeys(AMINO_ACIDS, 0.0) for j in range(1, 17)})
    x = reparam_decode(Fixed(t), masked_init(4, 16), max_iter=8, resample_ratio=None,
                       generator=torch.Generator().manual_seed(0))
    states = [*seen, x]
    kept = 0
    for a, b in zip(states, states[1:], strict=False):
        both = (a != MASK) & (b != MASK)
        both[:, 0] = both[:, -1] = False
        assert torch.equal(a[both], b[both])
        kept += int(both.sum())
    assert kept >= 100  # the check is not vacuous: many (position, step) pairs stay decoded

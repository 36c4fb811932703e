"""LoCoCo's ``local_len`` (the repo's ``--local_len``) and H2O's accumulated scores, against references written from
their definitions (``memory_saver.partition_past_key_values``; H2O: attention summed over every step)."""

from __future__ import annotations

import copy

import pytest
import torch

from icml24.lococo import LoCoCoCompressor, h2o_keep, make_compressors, tiny_llama
from tests.lococo.exact import exact_cache

DT = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_llama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0, dtype=DT).eval()


def _kvs(b=2, h=3, L=50, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, L, d, generator=g, dtype=DT), torch.randn(b, h, L, d, generator=g, dtype=DT),
            torch.rand(b, h, L, generator=g, dtype=DT))


def _ids(b, T, seed=0):
    return torch.randint(0, 256, (b, T), generator=torch.Generator().manual_seed(seed))


def _repo_partition(k, v, s, m_hh, ell):
    """The repo's ``partition_past_key_values``: top-(m_hh − ℓ) of s outside the last ℓ, plus the last ℓ, by a
    boolean mask and ``masked_select`` (position order); the rest with its scores."""
    b, h, L, d = k.shape
    _, idx = torch.topk(s[..., :-ell] if ell else s, m_hh - ell, dim=-1)
    mask = torch.zeros_like(s, dtype=torch.bool).scatter(-1, idx, True)
    if ell:
        mask[:, :, -ell:] = True
    m4 = mask[..., None].expand(-1, -1, -1, d)
    sel = lambda t, m, n: torch.masked_select(t, m).reshape(b, h, n, d)  # noqa: E731
    return (sel(k, m4, m_hh), sel(v, m4, m_hh)), (sel(k, ~m4, L - m_hh), sel(v, ~m4, L - m_hh),
                                                    torch.masked_select(s, ~mask).reshape(b, h, L - m_hh))


@pytest.mark.parametrize("ell", [0, 3, 10])
def test_local_len_matches_the_repo_partition(ell):
    k, v, s = _kvs()
    if ell:
        s[..., -ell:] = 0.0  # the local window has the lowest scores: kept anyway
    c = LoCoCoCompressor(head_dim=8, budget=20, kernel_size=7, local_len=ell).to(DT)
    k2, v2, idx = c(k, v, s)
    (k_hh, v_hh), (k_r, v_r, s_r) = _repo_partition(k, v, s, c.m_hh, ell)
    torch.testing.assert_close(k2[..., :10, :], k_hh, rtol=0, atol=0)
    torch.testing.assert_close(v2[..., :10, :], v_hh, rtol=0, atol=0)
    W = c.weights(k_r, v_r, s_r)
    torch.testing.assert_close(k2[..., 10:, :], W @ k_r)
    torch.testing.assert_close(v2[..., 10:, :], W @ v_r)
    if ell:
        last = torch.arange(50 - ell, 50)
        assert (idx[..., 10 - ell:10] == last).all()  # the last ℓ cache slots, in position order
        top = torch.topk(s[..., :50 - ell], 10 - ell, dim=-1).indices.sort(-1).values
        assert torch.equal(idx[..., :10 - ell], top)
        # not vacuous: without local_len those low-score tokens are dropped from the heavy hitters
        _, _, idx0 = LoCoCoCompressor(head_dim=8, budget=20, kernel_size=7).to(DT)(k, v, s)
        assert not torch.isin(last, idx0[0, 0, :10]).any()


@pytest.mark.parametrize("ell", [0, 4, 10])
def test_local_len_with_lambda_zero_keeps_h2o_set_with_the_same_recent_window(ell):
    k, v, s = _kvs(L=45)
    c = LoCoCoCompressor(head_dim=8, budget=20, kernel_size=7, lambda_init=0.0, learn_lambda=False,
                         local_len=ell).to(DT)
    k2, _, _ = c(k, v, s)
    ref = k.gather(2, h2o_keep(s, 20, recent=ell)[..., None].expand(-1, -1, -1, 8))
    key = lambda t: t[..., 0].sort(-1).values  # noqa: E731 — kept sets (order differs)
    torch.testing.assert_close(key(k2), key(ref), rtol=0, atol=0)


def test_local_len_in_the_cache(model):
    M, B, ell = 16, 8, 5
    comps = make_compressors(num_layers=2, head_dim=16, budget=M, chunk_size=B, kernel_size=5, local_len=ell,
                             seed=0).to(DT)
    cache = exact_cache(model, policy="lococo", budget=M, compressors=comps)
    assert cache.local_len == ell
    n = 0
    with torch.no_grad():
        for j in range(0, 96, B):
            model(input_ids=_ids(1, 96)[:, j:j + B], past_key_values=cache, use_cache=True)
            lay = cache.layers[1]
            if lay.length > M:  # what the next compression will keep: the last ℓ slots verbatim
                probe = copy.deepcopy(cache)
                last = lay.pos[..., -ell:].clone()
                probe.layers[1]._compress()
                assert torch.isin(last, probe.layers[1].pos).all()
                n += 1
    assert n > 0
    with pytest.raises(ValueError, match="does not match the compressors' local_len=5"):
        exact_cache(model, policy="lococo", budget=M, compressors=comps, local_len=2)
    with pytest.raises(ValueError, match="H2O's local window is recent"):
        exact_cache(model, policy="h2o", budget=M, local_len=2)
    with pytest.raises(ValueError, match=r"local_len \(9\) must be <= the heavy-hitter slots m_hh"):
        LoCoCoCompressor(head_dim=8, budget=16, local_len=9)
    with pytest.raises(ValueError, match="local_len must be an int >= 0"):
        make_compressors(num_layers=1, head_dim=8, budget=16, chunk_size=8, kernel_size=3, local_len=-1)


# ---------------------------------------------------------------- H2O: accumulated scores
def test_h2o_accumulated_scores_are_the_sum_over_every_chunk(model):
    """Each kept token's accumulated score is the attention it received summed over every chunk since it arrived
    (tracked here by absolute position), and H2O then keeps the top of those sums, not of the last chunk's."""
    M, B, T = 10, 6, 60
    cache = exact_cache(model, policy="h2o", budget=M, recent=2, accumulate_scores=True)
    ref = torch.zeros(1, 2, T, dtype=torch.float32)  # Σ over chunks of the attention received, per position
    differs = 0
    with torch.no_grad():
        for j in range(0, T, B):
            model(input_ids=_ids(1, T)[:, j:j + B], past_key_values=cache, use_cache=True)
            lay = cache.layers[1]
            ref.scatter_add_(2, lay.pos, lay.scores)  # this chunk's mass, added to every slot's own position
            torch.testing.assert_close(lay.acc_scores, ref.gather(2, lay.pos))
            if lay.length > M:
                probe = copy.deepcopy(cache)
                probe.layers[1]._compress()
                assert torch.equal(probe.layers[1].pos, lay.pos.gather(2, h2o_keep(ref.gather(2, lay.pos), M, 2)))
                differs += not torch.equal(h2o_keep(lay.acc_scores, M, 2), h2o_keep(lay.scores, M, 2))
    assert differs > 0  # the accumulated rule keeps another set than the last-chunk rule at some step

"""The chunked pairwise ranking loss: equal to the unchunked one (values and gradients), bounded memory,
the automatic top-k (recorded, warned once, overridable) and (B, T, V) logits at a language model's V."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from icml24.kd_ranking import AUTO_TOP_K, AUTO_TOP_K_ABOVE, RankingKDLoss


def _unchunked(s, t, k, kind, tau_s=1.0):
    """The former all-at-once implementation: (N, K, C) tensors through autograd (the reference)."""
    s = s / tau_s
    c = s.shape[1]
    order = torch.argsort(t, dim=1, descending=True, stable=True)
    top = order[:, :k]
    s_hi, t_hi = s.gather(1, top), t.gather(1, top)
    above = t_hi[:, :, None] > t[:, None, :]
    diff = s_hi[:, :, None] - s[:, None, :]
    per_pair = F.softplus(-diff) if kind == "pairwise" else 1.0 - torch.tanh(diff)
    per_pair = torch.where(above, per_pair, torch.zeros_like(per_pair))
    n_pairs = above.sum(dim=(1, 2))
    assert c >= k
    return per_pair.sum(dim=(1, 2)) / n_pairs.clamp_min(1).to(per_pair.dtype)


def _value_and_grad(fn, s0, weights):
    s = s0.clone().requires_grad_(True)
    per_row = fn(s)
    (grad,) = torch.autograd.grad((per_row * weights).sum(), s)  # row weights: a non-uniform upstream gradient
    return per_row.detach(), grad


def _data(n, c, seed, ties):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n, c, generator=g, dtype=torch.float64)
    t = (torch.randint(0, 4, (n, c), generator=g).to(torch.float64) if ties
         else torch.randn(n, c, generator=g, dtype=torch.float64))
    return s, t, torch.rand(n, generator=g, dtype=torch.float64)


# C = 23: top_k None / 12 take the sorted path (4K > C), 3 / 5 the top-K selection; chunks from one term to all
@pytest.mark.parametrize("kind", ["pairwise", "kendall_soft"])
@pytest.mark.parametrize("top_k", [None, 12, 5, 3, 1])
@pytest.mark.parametrize("chunk_size", [1, 40, 97, 2**20])
@pytest.mark.parametrize("ties", [False, True])
def test_chunked_equals_unchunked_values_and_gradients(kind, top_k, chunk_size, ties):
    s0, t, w = _data(11, 23, 0, ties)
    k = top_k or 23
    loss = RankingKDLoss(kind=kind, top_k=top_k, tau_s=1.7, reduction="none", chunk_size=chunk_size)
    got, g_got = _value_and_grad(lambda s: loss(s, t), s0, w)
    ref, g_ref = _value_and_grad(lambda s: _unchunked(s, t, k, kind, 1.7), s0, w)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-12, atol=1e-12)


def test_top_k_ties_at_the_kth_place_go_to_the_lower_index():
    t = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    s = torch.randn(1, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    # top 2 = class 0 and class 2 (the first of the tied 2.0s), the selection path (4 * 2 < 13)
    ref = (F.softplus(-(s[0, 0] - s[0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])).sum()
           + F.softplus(-(s[0, 2] - s[0, [1, 5, 6, 7, 8, 9, 10, 11, 12]])).sum()) / 21
    torch.testing.assert_close(RankingKDLoss(top_k=2, chunk_size=5)(s, t), ref)


def test_backward_passes_gradcheck():
    s, t, _ = _data(4, 9, 3, ties=True)
    for top_k in (None, 2):
        loss = RankingKDLoss(top_k=top_k, reduction="none", chunk_size=10)
        assert torch.autograd.gradcheck(lambda x, loss=loss: loss(x, t), (s.clone().requires_grad_(True),))


def test_low_precision_accumulates_in_float32():
    s, t, _ = _data(6, 300, 4, ties=False)
    ref = RankingKDLoss(top_k=None)(s, t)
    got = RankingKDLoss(top_k=None, chunk_size=1000)(s.bfloat16(), t.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), ref, rtol=2e-2, atol=0)


def test_chunked_memory_stays_bounded_for_all_pairs():
    from torch.profiler import ProfilerActivity, profile
    n, c, chunk = 4, 3000, 2**16
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(n, c, generator=g, requires_grad=True), torch.randn(n, c, generator=g)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        got = RankingKDLoss(top_k=None, chunk_size=chunk)(s, t)
        (grad,) = torch.autograd.grad(got, s)
    peak_op = max(e.cpu_memory_usage for e in prof.events())
    # the largest single allocation is one chunk of float32 terms (the (N, C) tensors are 10x smaller here);
    # unchunked it is N·C² float32 = 144 MB
    assert 8 * n * c < 4 * chunk
    assert peak_op <= 4 * chunk + 4096
    s_ref = s.detach().clone().requires_grad_(True)
    ref = _unchunked(s_ref, t, c, "pairwise").mean()
    (grad_ref,) = torch.autograd.grad(ref, s_ref)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(grad, grad_ref)


def _topk_rows_reference(s, t, k):
    out = []
    for si, ti in zip(s, t, strict=True):
        top = torch.argsort(ti, descending=True, stable=True)[:k]
        out.append(torch.cat([F.softplus(-(si[j] - si))[ti[j] > ti] for j in top]).mean())
    return torch.stack(out).mean()


def test_auto_top_k_records_warns_once_and_is_overridden():
    g = torch.Generator().manual_seed(0)
    small = torch.randn(3, AUTO_TOP_K_ABOVE, generator=g, dtype=torch.float64)
    c = AUTO_TOP_K_ABOVE + 1
    s, t = torch.randn(3, c, generator=g, dtype=torch.float64), torch.randn(3, c, generator=g, dtype=torch.float64)
    loss = RankingKDLoss()  # top_k="auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(loss(small, small.flip(1)), RankingKDLoss(top_k=None)(small, small.flip(1)))
    assert loss.auto_top_k == {} and "chose" not in repr(loss)
    with pytest.warns(UserWarning, match=rf"top_k='auto' uses the teacher's top_k={AUTO_TOP_K} classes at C={c}"):
        got = loss(s, t)
    torch.testing.assert_close(got, RankingKDLoss(top_k=AUTO_TOP_K)(s, t))
    torch.testing.assert_close(got, _topk_rows_reference(s, t, AUTO_TOP_K))
    assert loss.auto_top_k == {c: AUTO_TOP_K}
    assert f"top_k='auto' (chose top_k={AUTO_TOP_K} at C={c})" in repr(loss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per C: no second warning
        loss(s, t)
        for explicit in (None, 5):  # an explicit argument overrides, silently
            ref = _unchunked(s, t, explicit or c, "pairwise").mean()
            torch.testing.assert_close(RankingKDLoss(top_k=explicit)(s, t), ref)
        # ListMLE costs O(C log C): "auto" keeps all its positions
        torch.testing.assert_close(RankingKDLoss(kind="listmle")(s, t), RankingKDLoss(kind="listmle", top_k=None)(s, t))


def test_bad_top_k_and_chunk_size():
    with pytest.raises(ValueError, match="top_k must be None, 'auto' or an integer"):
        RankingKDLoss(top_k="all")
    with pytest.raises(ValueError, match="chunk_size"):
        RankingKDLoss(chunk_size=0)


def test_language_model_logits_at_32k_vocabulary():
    b, tt, vocab = 2, 3, 32_000
    g = torch.Generator().manual_seed(0)
    s = torch.randn(b, tt, vocab, generator=g, requires_grad=True)
    t = torch.randn(b, tt, vocab, generator=g)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss = RankingKDLoss()
    with pytest.warns(UserWarning, match="top_k='auto'"):
        got = loss(s, t, mask=mask)
    got.backward()
    keep = mask.bool()
    s_ref = s.detach()[keep].clone().requires_grad_(True)
    ref = _topk_rows_reference(s_ref, t[keep], AUTO_TOP_K)
    ref.backward()
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(s.grad[keep], s_ref.grad)
    assert torch.all(s.grad[~keep] == 0)

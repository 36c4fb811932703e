"""LoCoCo: compressor invariants, the fixed-budget cache on a HF Llama, eviction rules, gradients, bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from icml24.lococo import (
    LoCoCoCache,
    LoCoCoCompressor,
    chunked_nll,
    h2o_keep,
    make_compressors,
    passkey_batch,
    streaming_keep,
    tiny_llama,
    tova_keep,
)
from icml24.lococo.cache import DEFAULT_BUFFER
from tests.lococo.exact import exact_cache

DT = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_llama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0, dtype=DT)


def _comps(model, budget, chunk, lam=0.5, learn=True, seed=0, kernel=5):
    c = model.config
    return make_compressors(num_layers=c.num_hidden_layers, head_dim=c.hidden_size // c.num_attention_heads,
                            budget=budget, chunk_size=chunk, kernel_size=kernel, lambda_init=lam,
                            learn_lambda=learn, seed=seed).to(DT)


def _ids(b, T, seed=0):
    return torch.randint(0, 256, (b, T), generator=torch.Generator().manual_seed(seed))


def _run_chunks(model, ids, cache, chunk):
    logits = []
    for j in range(0, ids.shape[1], chunk):
        logits.append(model(input_ids=ids[:, j:j + chunk], past_key_values=cache, use_cache=True).logits)
        yield j, torch.cat(logits, 1)


# ---------------------------------------------------------------- the compressor (notes §2.2)
def _kvs(b=2, h=3, L=40, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, L, d, generator=g, dtype=DT), torch.randn(b, h, L, d, generator=g, dtype=DT),
            torch.rand(b, h, L, generator=g, dtype=DT))


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_fused_weights_are_convex_for_lambda_in_unit_interval(lam):
    k, v, s = _kvs()
    c = LoCoCoCompressor(head_dim=8, budget=16, kernel_size=5, lambda_init=lam, learn_lambda=False).to(DT)
    W = c.weights(k, v, s)
    assert W.shape == (2, 3, 8, 40) and (W >= 0).all()
    torch.testing.assert_close(W.sum(-1), torch.ones(2, 3, 8, dtype=DT))
    # an unbounded λ outside [0, 1] breaks convexity (the repo's unclamped λ): the property is not vacuous
    c2 = LoCoCoCompressor(head_dim=8, budget=16, kernel_size=5, lambda_init=1.5, bounded_lambda=False).to(DT)
    assert (c2.weights(k, v, s) < 0).any()


def test_compressor_returns_exactly_budget_slots_with_heavy_hitters_verbatim():
    k, v, s = _kvs(L=50)
    c = LoCoCoCompressor(head_dim=8, budget=20, kernel_size=7).to(DT)
    k2, v2, idx = c(k, v, s)
    assert k2.shape == v2.shape == (2, 3, 20, 8)
    hh = torch.topk(s, 10, -1).indices.sort(-1).values
    assert torch.equal(idx[..., :10], hh) and (idx[..., 10:] == -1).all()
    torch.testing.assert_close(k2[..., :10, :], k.gather(2, hh[..., None].expand(-1, -1, -1, 8)))
    # fused keys and values share the same weights: W K_R and W V_R with one W
    c3 = copy.deepcopy(c)
    k3, v3, _ = c3(k, k, s)
    torch.testing.assert_close(k3[..., 10:, :], v3[..., 10:, :])


def test_lambda_zero_is_top_score_selection_and_equals_h2o():
    k, v, s = _kvs(L=50)
    c = LoCoCoCompressor(head_dim=8, budget=20, kernel_size=7, lambda_init=0.0, learn_lambda=False).to(DT)
    k2, v2, _ = c(k, v, s)
    keep = h2o_keep(s, 20, recent=0)  # top-20 by score
    ref = k.gather(2, keep[..., None].expand(-1, -1, -1, 8))
    key = lambda t: t[..., 0].sort(-1).values  # noqa: E731 — compare kept sets (order differs)
    torch.testing.assert_close(key(k2), key(ref))
    assert not torch.equal(key(k2), key(k[..., :20, :]))


# ---------------------------------------------------------------- the cache on a HF Llama
@pytest.mark.parametrize("policy", ["lococo", "h2o", "tova", "streaming"])
@pytest.mark.parametrize("T", [37, 130, 301])
def test_cache_length_stays_within_budget_plus_chunk(model, policy, T):
    M, B = 16, 12
    cache = exact_cache(model, policy=policy, budget=M, compressors=_comps(model, M, B), n_sink=2,
                        recent=4)
    with torch.no_grad():
        for j, _ in _run_chunks(model, _ids(2, T), cache, B):
            assert max(cache.lengths) <= M + B
            assert cache.get_seq_length() == min(j + B, T)  # positions count every token seen
    assert min(cache.lengths) >= min(M, T)


def test_the_default_buffer_compresses_once_every_16_decoded_tokens(model):
    M, B = 16, 8
    cache = LoCoCoCache.from_model(model, policy="streaming", budget=M, n_sink=2)
    assert cache.buffer == DEFAULT_BUFFER == 16
    ids = _ids(1, 80)
    seen = []
    with torch.no_grad():
        model(input_ids=ids[:, :B], past_key_values=cache, use_cache=True)
        for t in range(B, 80):  # one token at a time, as generate() decodes
            model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            seen.append(max(cache.lengths))
    assert max(seen) <= M + DEFAULT_BUFFER + 1 and max(seen) > M + 1  # it buffers instead of compressing
    assert min(seen[len(seen) // 2:]) <= M + 1  # and it does compress back to about M
    n = cache.layers[0].n_compressions
    assert 0 < n <= (80 - B) // DEFAULT_BUFFER + 1


@pytest.mark.parametrize("T", [16, 40, 48])
def test_shorter_than_budget_is_exactly_full_attention(model, T):
    M, B = 32, 16  # T <= M + B: with the one-chunk lag nothing is ever compressed
    with torch.no_grad():
        ref = model(input_ids=_ids(2, T)).logits
        for policy in ("lococo", "h2o", "tova", "streaming"):
            cache = exact_cache(model, policy=policy, budget=M, compressors=_comps(model, M, B))
            *_, (_, out) = _run_chunks(model, _ids(2, T), cache, B)
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
            assert all(layer.n_compressions == 0 for layer in cache.layers)


def test_full_cache_chunked_equals_plain_forward_and_generate(model):
    ids = _ids(2, 70)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        *_, (_, out) = _run_chunks(model, ids, exact_cache(model, policy="full"), 16)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    from transformers import DynamicCache

    kw = dict(max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids[:, :30]))
    g1 = model.generate(ids[:, :30], past_key_values=DynamicCache(config=model.config), **kw)
    g2 = model.generate(ids[:, :30], past_key_values=exact_cache(model, policy="full"), **kw)
    assert torch.equal(g1, g2)
    cache = exact_cache(model, policy="lococo", budget=8, compressors=_comps(model, 8, 30))
    g3 = model.generate(ids[:, :30], past_key_values=cache, **kw)
    assert g3.shape == g1.shape and max(cache.lengths) <= 8 + 1 and cache.get_seq_length() == 41


def _reference_chunked_logits(model, comps, ids, M, B):
    """Independent chunked Llama forward from the weights: RMSNorm, RoPE, SwiGLU, eager attention, LoCoCo memory."""
    cfg = model.config
    H, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=DT) / d))

    def rope(x, pos):
        ang = pos[:, None].to(DT) * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def rms(x, w):
        return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    mem = [None] * cfg.num_hidden_layers
    scores = [None] * cfg.num_hidden_layers
    out = []
    for j in range(0, ids.shape[1], B):
        x = model.model.embed_tokens(ids[:, j:j + B])
        b, q = x.shape[:2]
        pos = torch.arange(j, j + q)
        for li, layer in enumerate(model.model.layers):
            a = layer.self_attn
            hn = rms(x, layer.input_layernorm.weight)
            Q = rope(a.q_proj(hn).view(b, q, H, d).transpose(1, 2), pos)
            K = rope(a.k_proj(hn).view(b, q, H, d).transpose(1, 2), pos)
            V = a.v_proj(hn).view(b, q, H, d).transpose(1, 2)
            if mem[li] is not None:
                Km, Vm = mem[li]
                if Km.shape[2] > M:
                    Km, Vm, _ = comps[li](Km, Vm, scores[li])
                K, V = torch.cat([Km, K], 2), torch.cat([Vm, V], 2)
            L = K.shape[2]
            logit = Q @ K.transpose(-1, -2) / math.sqrt(d)
            logit = logit.masked_fill(torch.arange(L)[None] > (L - q) + torch.arange(q)[:, None], -math.inf)
            P = logit.softmax(-1)
            mem[li], scores[li] = (K, V), P.sum(-2)
            x = x + a.o_proj((P @ V).transpose(1, 2).reshape(b, q, H * d))
            hn = rms(x, layer.post_attention_layernorm.weight)
            m = layer.mlp
            x = x + m.down_proj(F.silu(m.gate_proj(hn)) * m.up_proj(hn))
        out.append(model.lm_head(rms(x, model.model.norm.weight)))
    return torch.cat(out, 1)


def test_hf_integration_matches_an_independent_reference_under_compression(model):
    M, B = 16, 12
    comps = _comps(model, M, B)
    ids = _ids(2, 75)
    with torch.no_grad():
        ref = _reference_chunked_logits(model, comps, ids, M, B)
        cache = exact_cache(model, policy="lococo", budget=M, compressors=comps)
        *_, (_, out) = _run_chunks(model, ids, cache, B)
    assert all(layer.n_compressions > 0 for layer in cache.layers)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)  # HF computes RoPE angles in float32
    full = model(input_ids=ids).logits
    assert (out - full).abs().max() > 1e-3  # compression really changed the outputs


def test_lag_false_gives_the_same_logits_with_at_most_budget_at_rest(model):
    M, B = 16, 12
    comps = _comps(model, M, B)
    ids = _ids(1, 75)
    with torch.no_grad():
        *_, (_, a) = _run_chunks(model, ids, exact_cache(model, budget=M, compressors=comps), B)
        c2 = exact_cache(model, budget=M, compressors=comps, lag=False)
        for _, b in _run_chunks(model, ids, c2, B):  # noqa: B007 — b: the last chunk's logits, used below
            assert max(c2.lengths) <= M
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_lambda_zero_cache_equals_h2o_cache(model):
    M, B = 16, 12
    ids = _ids(2, 80)
    with torch.no_grad():
        *_, (_, a) = _run_chunks(model, ids, exact_cache(
            model, budget=M, compressors=_comps(model, M, B, lam=0.0, learn=False)), B)
        *_, (_, b) = _run_chunks(model, ids, exact_cache(model, policy="h2o", budget=M, recent=0), B)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_cached_keys_are_rope_at_absolute_positions(model):
    M, B = 16, 12
    ids = _ids(1, 90)
    with torch.no_grad():
        full = exact_cache(model, policy="full")
        model(input_ids=ids, past_key_values=full, use_cache=True)
        for policy in ("lococo", "streaming", "h2o"):
            cache = exact_cache(model, policy=policy, budget=M, compressors=_comps(model, M, B))
            for _ in _run_chunks(model, ids, cache, B):
                lay = cache.layers[0]  # layer 0's keys depend on the tokens only
                pos = lay.pos
                ok = pos >= 0
                assert ok.sum() >= M // 2
                ref = full.layers[0].keys.gather(2, pos.clamp_min(0)[..., None].expand(-1, -1, -1, lay.keys.shape[-1]))
                torch.testing.assert_close(lay.keys[ok], ref[ok], rtol=0, atol=1e-12)
            assert int(pos.max()) == 89  # positions never reset


def test_gradient_reaches_the_compressor_only_through_the_current_chunk(model):
    M, B = 16, 12
    comps = _comps(model, M, B)
    ids = _ids(1, 60)
    cache = exact_cache(model, budget=M, compressors=comps)
    lam = comps[0].rho
    for j in range(0, 60, B):
        before = copy.deepcopy([(lay.keys, lay.values, lay.pos, lay.scores, lay.seen) for lay in cache.layers])
        logits = model(input_ids=ids[:, j:j + B], past_key_values=cache, use_cache=True).logits
        loss = logits.logsumexp(-1).mean()
        assert all(not lay.keys.requires_grad and not lay.values.requires_grad for lay in cache.layers)
        compressed = cache.layers[0].n_compressions > 0 and j >= 2 * B
        if not loss.requires_grad:
            assert not compressed
            continue
        (g,) = torch.autograd.grad(loss, lam, allow_unused=True)
        if not compressed:
            continue
        # finite difference of THIS chunk's loss in ρ with the cache state before the chunk held fixed
        fd = []
        for eps in (1e-3, -1e-3):  # HF's RMSNorm runs in float32, so not smaller
            c2 = exact_cache(model, budget=M, compressors=comps)
            for lay, st in zip(c2.layers, before, strict=True):
                lay.keys, lay.values, lay.pos, lay.scores, lay.seen = st
                lay.lazy_initialization(st[0], st[1])
            with torch.no_grad():
                lam.add_(eps)
                fd.append(float(model(input_ids=ids[:, j:j + B], past_key_values=c2, use_cache=True)
                                .logits.logsumexp(-1).mean()))
                lam.sub_(eps)
        assert g is not None and abs(float(g)) > 0
        assert math.isclose(float(g), (fd[0] - fd[1]) / 2e-3, rel_tol=0.03)


# ---------------------------------------------------------------- eviction rules
def test_streaming_llm_keeps_sinks_and_recent_window(model):
    assert streaming_keep(20, 8, 3).tolist() == [0, 1, 2, 15, 16, 17, 18, 19]
    cache = exact_cache(model, policy="streaming", budget=10, n_sink=4)
    with torch.no_grad():
        for _ in _run_chunks(model, _ids(1, 64), cache, 8):
            pass
    # after the last chunk (56..63) the memory compressed before it held {0..3} ∪ {50..55}
    assert cache.positions(1)[0, 0].tolist() == [0, 1, 2, 3, *range(50, 56), *range(56, 64)]


def test_h2o_and_tova_keep_the_tokens_their_rules_name():
    s = torch.tensor([[[5.0, 1.0, 9.0, 0.5, 3.0, 2.0, 8.0, 0.1]]])
    assert h2o_keep(s, 4, recent=1).tolist() == [[[0, 2, 6, 7]]]
    assert h2o_keep(s, 4, recent=0).tolist() == [[[0, 2, 4, 6]]]
    a = torch.tensor([[[0.1, 0.5, 0.25, 0.15], [0.4, 0.1, 0.3, 0.2]]])  # head mean: .25 .3 .275 .175
    assert tova_keep(a, 3).tolist() == [[[0, 1, 2], [0, 1, 2]]]
    assert tova_keep(a, 2, per_head=True).tolist() == [[[1, 2], [0, 2]]]


def test_h2o_cache_keeps_top_scores_and_accumulates_when_asked(model):
    M, B = 10, 8
    for acc in (False, True):
        cache = exact_cache(model, policy="h2o", budget=M, recent=2, accumulate_scores=acc)
        with torch.no_grad():
            for _j, _ in _run_chunks(model, _ids(1, 40), cache, B):
                lay = cache.layers[1]
                s = (lay.acc_scores if acc else lay.scores).clone()
                pos = lay.pos.clone()
                if lay.length > M:
                    want = pos.gather(2, h2o_keep(s, M, 2))
                    probe = copy.deepcopy(cache)
                    probe.layers[1]._compress()
                    assert torch.equal(probe.layers[1].pos, want)
        if acc:
            assert lay.acc_scores.shape == lay.pos.shape


# ---------------------------------------------------------------- data
def test_passkey_puts_the_key_at_the_requested_distance():
    x, a = passkey_batch(n=3, length=300, distance=150, generator=torch.Generator().manual_seed(0))
    for row in x:
        text = bytes(row.tolist()).decode()
        key = text[a:]
        assert text[a - 150:a - 150 + 5] == key and key.isdigit() and len(text) == 300


# ---------------------------------------------------------------- bad input
def test_bad_input_raises_before_compute(model):
    with pytest.raises(ValueError, match="budget"):
        LoCoCoCompressor(head_dim=8, budget=1)
    with pytest.raises(ValueError, match="even"):
        LoCoCoCompressor(head_dim=8, budget=15)
    with pytest.raises(ValueError, match="odd"):
        LoCoCoCompressor(head_dim=8, budget=16, kernel_size=4)
    with pytest.raises(ValueError, match="larger than the fused window"):
        make_compressors(num_layers=1, head_dim=8, budget=16, chunk_size=4, kernel_size=21)
    with pytest.raises(ValueError, match="chunk_size"):
        make_compressors(num_layers=1, head_dim=8, budget=16, chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_nll(model, _ids(1, 8), chunk_size=0, make_cache=None)
    with pytest.raises(ValueError, match="lambda_init"):
        LoCoCoCompressor(head_dim=8, budget=16, lambda_init=1.2)
    with pytest.raises(ValueError, match="head_dim"):
        exact_cache(model, budget=16, compressors=make_compressors(num_layers=2, head_dim=8, budget=16,
                                                                                chunk_size=16, kernel_size=3))
    with pytest.raises(ValueError, match="one compressor per layer"):
        exact_cache(model, budget=16)
    k, v, s = _kvs(d=8)
    with pytest.raises(ValueError, match="head dim"):
        LoCoCoCompressor(head_dim=16, budget=16, kernel_size=3).to(DT)(k, v, s)
    sdpa = tiny_llama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="attn_implementation='lococo'"):
        exact_cache(sdpa, policy="h2o", budget=16)
    cache = LoCoCoCache(num_layers=2, num_kv_heads=2, head_dim=16, policy="h2o", budget=8)
    sdpa(input_ids=_ids(1, 8), past_key_values=cache, use_cache=True)
    with pytest.raises(RuntimeError, match="attn_implementation='lococo'"):
        sdpa(input_ids=_ids(1, 8), past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="policy"):
        exact_cache(model, policy="snap")


def test_padded_attention_mask_is_refused_and_an_all_ones_mask_changes_nothing(model):
    ids = _ids(2, 12)
    plain = model(input_ids=ids, past_key_values=exact_cache(model, policy="full", budget=16),
                  use_cache=True).logits
    ones = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True,
                 past_key_values=exact_cache(model, policy="full", budget=16)).logits
    torch.testing.assert_close(ones, plain, rtol=0, atol=0)
    padded = torch.ones_like(ids)
    padded[1, :3] = 0
    with pytest.raises(ValueError, match=r"padding \(zeros\) in batch rows \[1\]"):
        model(input_ids=ids, attention_mask=padded, use_cache=True,
              past_key_values=exact_cache(model, policy="full", budget=16))


def test_the_experiment_scores_caches_of_exactly_M_slots(model):
    from icml24.lococo import experiment

    M, B, ids = 16, 1, _ids(2, 60)  # token by token: any buffer > 0 keeps more than M slots at some step
    kw = {"policy": "streaming", "budget": M, "n_sink": 2}
    got = experiment._nll(model, ids, chunk=B, cache_kwargs=kw)
    exact = chunked_nll(model, ids, chunk_size=B, make_cache=lambda: exact_cache(model, **kw))
    buffered = chunked_nll(model, ids, chunk_size=B, make_cache=lambda: LoCoCoCache.from_model(model, **kw))
    assert torch.equal(got, exact) and not torch.allclose(got, buffered)

"""A LoCoCo cache as a user meets it: ``model(ids)`` / ``model.generate(ids)`` with a long prompt in one call.

The cache splits a one-call prefill into chunks (``prefill_chunk_size``, default the compressors' chunk) inside the
``"lococo"`` attention, so the attention matrix stays chunk × (M + buffer + chunk) whatever the prompt length and
the result is the chunk-by-chunk loop's, on a HF Llama and a GQA Qwen2 built from configs (no hub)."""

from __future__ import annotations

import pytest
import torch

import icml24.lococo.cache as cache_mod
from icml24.lococo import LoCoCoCache, make_compressors, register_lococo_attention, tiny_llama

DT = torch.float64
M, B = 16, 12


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    register_lococo_attention()
    cfg = Qwen2Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      attn_implementation="lococo")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(DT).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    if request.param == "llama":
        return tiny_llama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0, dtype=DT).eval()
    return _qwen2()


def _head_dim(model):
    c = model.config
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def _cache(model, policy, **kw):
    comps = None
    if policy == "lococo":
        comps = make_compressors(num_layers=model.config.num_hidden_layers, head_dim=_head_dim(model), budget=M,
                                 chunk_size=B, kernel_size=5, seed=0).to(DT)
    knobs = {"h2o": {"recent": 4, "accumulate_scores": True}, "streaming": {"n_sink": 2}}.get(policy, {})
    kw.setdefault("buffer", 0)  # exactly M slots after every chunk (the API default buffers 16 tokens)
    return LoCoCoCache.from_model(model, policy=policy, budget=M, compressors=comps, **knobs, **kw)


def _ids(T, seed=0):
    return torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def attention_sizes(monkeypatch):
    """Records (queries, keys) of every attention the "lococo" implementation computes."""
    seen: list[tuple[int, int]] = []
    inner = cache_mod._attend

    def spy(query, key, *args):
        seen.append((query.shape[2], key.shape[2]))
        return inner(query, key, *args)

    monkeypatch.setattr(cache_mod, "_attend", spy)
    return seen


@pytest.mark.parametrize("policy", ["lococo", "h2o", "tova", "streaming"])
@pytest.mark.parametrize("buffer", [0, 5])
def test_one_call_prefill_equals_the_chunked_loop(model, policy, buffer, attention_sizes):
    ids = _ids(101)
    one, loop = _cache(model, policy, buffer=buffer), _cache(model, policy, buffer=buffer)
    assert one.prefill_chunk == B if policy == "lococo" else M  # "auto": the compressors' chunk, else M
    chunk = one.prefill_chunk
    with torch.no_grad():
        got = model(input_ids=ids, past_key_values=one, use_cache=True).logits
        assert max(q for q, _ in attention_sizes) <= chunk
        assert max(k for _, k in attention_sizes) <= M + buffer + chunk
        want = torch.cat([model(input_ids=ids[:, j:j + chunk], past_key_values=loop, use_cache=True).logits
                          for j in range(0, 101, chunk)], 1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert one.lengths == loop.lengths and one.get_seq_length() == loop.get_seq_length() == 101
    for a, b in zip(one.layers, loop.layers, strict=True):
        assert a.n_compressions == b.n_compressions > 0
        assert torch.equal(a.pos, b.pos)
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-10)
    # the next chunk continues from the same state
    with torch.no_grad():
        nxt = _ids(7, seed=1)
        torch.testing.assert_close(model(input_ids=nxt, past_key_values=one, use_cache=True).logits,
                                   model(input_ids=nxt, past_key_values=loop, use_cache=True).logits,
                                   rtol=0, atol=1e-10)


def test_generate_chunks_its_prefill_by_default(model, attention_sizes):
    ids = _ids(300)[:1]
    kw = dict(max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(ids))
    cache = _cache(model, "lococo")
    gen = model.generate(ids, past_key_values=cache, **kw)
    # no attention over the whole prompt: every one is at most B queries over M + B keys
    assert max(q for q, _ in attention_sizes) <= B and max(k for _, k in attention_sizes) <= M + B
    assert gen.shape == (1, 306) and cache.get_seq_length() == 305 and max(cache.lengths) <= M + B
    # the same tokens as the documented path: an explicit chunked prefill, then generate on the rest
    ref_cache = _cache(model, "lococo")
    with torch.no_grad():
        for j in range(0, 288, B):
            model(input_ids=ids[:, j:j + B], past_key_values=ref_cache, use_cache=True)
    assert torch.equal(model.generate(ids, past_key_values=ref_cache, **kw), gen)
    # transformers' own chunked prefill (generate(..., prefill_chunk_size=)) is not needed; in transformers 5.2 it
    # hands the first decoded token cache_position 301 after 300 prompt tokens, which the cache refuses
    try:
        hf = model.generate(ids, past_key_values=_cache(model, "lococo"), prefill_chunk_size=B, **kw)
    except ValueError as e:
        assert "cache_position starts at 301 but layer 0 has seen 300 tokens" in str(e)
    else:
        assert torch.equal(hf, gen)
    # the one-shot prefill (prefill_chunk_size=None) attends the whole prompt at once: the former behaviour
    attention_sizes.clear()
    model.generate(ids, past_key_values=_cache(model, "lococo", prefill_chunk_size=None), **kw)
    assert max(q for q, _ in attention_sizes) == 300


def test_prefill_errors_name_the_chunked_path():
    sdpa = tiny_llama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0,
                      attn_implementation="sdpa", dtype=DT).eval()
    cache = LoCoCoCache.from_model(sdpa, policy="streaming", budget=M)
    with torch.no_grad(), pytest.raises(ValueError, match="prefill_chunk_size=16.*use_lococo_attention"):
        sdpa(input_ids=_ids(40), past_key_values=cache, use_cache=True)
    with torch.no_grad():  # chunks within the limit, or a one-shot cache, still work under sdpa
        sdpa(input_ids=_ids(16), past_key_values=LoCoCoCache.from_model(sdpa, policy="streaming", budget=M),
             use_cache=True)
        one_shot = LoCoCoCache.from_model(sdpa, policy="streaming", budget=M, prefill_chunk_size=None)
        sdpa(input_ids=_ids(40), past_key_values=one_shot, use_cache=True)
        assert one_shot.lengths == [40, 40]
    # a pre-filled cache with transformers' chunked prefill would restart positions at 0: refused
    model = tiny_llama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0, dtype=DT).eval()
    ids = _ids(60)[:1]
    cache = _cache(model, "lococo")
    with torch.no_grad():
        model(input_ids=ids[:, :24], past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="cache_position starts at 0 but layer 0 has seen 24 tokens"):
        model.generate(ids, past_key_values=cache, prefill_chunk_size=B, max_new_tokens=2, do_sample=False,
                       attention_mask=torch.ones_like(ids))
    with pytest.raises(ValueError, match="prefill_chunk_size must be an int >= 1"):
        _cache(model, "h2o", prefill_chunk_size=0)

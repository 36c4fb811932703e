"""Cross-checks against kvpress 0.5.5, run in a subprocess: ``import kvpress`` patches transformers' attention
registry for the whole process, and the other papers' HF tests must never see that patch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("kvpress") is None,
                                reason="kvpress not installed (pip install 'icml24[kv]')")

SCRIPT = textwrap.dedent('''
    import torch
    from icml24.lococo import LoCoCoCache, tiny_llama, tova_keep, h2o_keep
    from icml24.lococo.kvpress_baselines import kept_positions, make_press, press_prefill, single_shot_losses, PRESSES
    torch.set_num_threads(1)
    model = tiny_llama(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0, dtype=torch.float64)
    model.eval()
    L, M = 40, 12
    ids = torch.randint(0, 256, (2, L), generator=torch.Generator().manual_seed(0))

    def ours(policy, **kw):
        c = LoCoCoCache.from_model(model, policy=policy, budget=M, prefill_chunk_size=None, buffer=0, **kw)  # one shot
        with torch.no_grad():
            model(input_ids=ids, past_key_values=c, use_cache=True)
        return c

    # StreamingLLM: identical kept positions on the single-chunk case
    c = ours("streaming", n_sink=4).compress_now()
    kp = kept_positions(model, ids, press_prefill(model, ids, make_press("StreamingLLMPress", length=L, budget=M,
                                                                          n_sink=4))[0])
    for l in range(2):
        assert torch.equal(c.positions(l), kp[l]), ("streaming", l)

    # TOVA: kvpress scores the last query's head-averaged attention and pins the last token
    c = ours("tova")
    kp = kept_positions(model, ids, press_prefill(model, ids, make_press("TOVAPress", length=L, budget=M))[0])
    for l in range(2):
        a = c.layers[l].last_query.clone()
        a[..., -1] = float("inf")
        assert torch.equal(tova_keep(a, M), kp[l]), ("tova", l)
    c.compress_now()
    same = sum(torch.equal(c.positions(l), kp[l]) for l in range(2))

    # ObservedAttention (H2O-like): attention received, normalised by the queries that can see each key
    c = ours("h2o", recent=0)
    kp = kept_positions(model, ids, press_prefill(model, ids, make_press("ObservedAttentionPress", length=L,
                                                                          budget=M))[0])
    for l in range(2):
        s = c.layers[l].scores / torch.arange(L, 0, -1, dtype=torch.float32)
        assert torch.equal(h2o_keep(s, M, 0), kp[l]), ("observed", l)

    # every press compresses to exactly M entries and runs through the same single-shot path
    for name in PRESSES:
        kn = {"window_size": 8} if name == "SnapKVPress" else {}
        cache, _ = press_prefill(model, ids, make_press(name, length=L, budget=M, **kn))
        assert all(layer.keys.shape[2] == M for layer in cache.layers), name
        loss = single_shot_losses(model, ids, prefix=30, method=name, budget=M, knobs=kn)
        assert loss.shape == (2,) and torch.isfinite(loss).all(), name
    full = single_shot_losses(model, ids, prefix=30, method="full", budget=M)
    ref = torch.nn.functional.cross_entropy(model(input_ids=ids).logits[:, 29:-1].reshape(-1, 256),
                                            ids[:, 30:].reshape(-1), reduction="none").view(2, -1).mean(1)
    torch.testing.assert_close(full, ref.to(full.dtype), rtol=0, atol=1e-6)
    # a press that keeps everything gives the full-cache loss (positions continue after a pruned prefix)
    keep_all = single_shot_losses(model, ids, prefix=30, method="KnormPress", budget=29)
    stream = single_shot_losses(model, ids, prefix=30, method="streaming", budget=M, knobs={"n_sink": 4})
    press = single_shot_losses(model, ids, prefix=30, method="StreamingLLMPress", budget=M, knobs={"n_sink": 4})
    torch.testing.assert_close(stream, press, rtol=0, atol=1e-6)
    assert (keep_all - full).abs().max() < 0.05
    print("OK", same)
''')


def test_streaming_rules_match_kvpress_presses_in_a_subprocess():
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


def test_kvpress_is_not_imported_in_this_process():
    import icml24.lococo  # noqa: F401
    import icml24.lococo.kvpress_baselines  # noqa: F401

    assert "kvpress" not in sys.modules

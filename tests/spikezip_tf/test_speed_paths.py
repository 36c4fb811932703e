"""The faster simulation paths (issue 27 speed): in-place differences, every chunk size on every runner family
(TinyViT, text encoder with masks, Hugging Face BERT sentence pairs with a head, Hugging Face ViT), and the heap
setting (changes no result, can be turned off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial

import pytest
import torch
from torch import nn

from icml24.common.nets import TinyViT
from icml24.spikezip_tf import _fused, calibrate, convert, quantize, simulate
from icml24.spikezip_tf.snn import _differences_
from icml24.spikezip_tf.text import TinyTextEncoder
from tests.spikezip_tf.compare import assert_results_equal

F64 = torch.float64




@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("steps", [1, 2, 5])
def test_in_place_differences_equal_out_of_place(dtype, steps):
    g = torch.Generator().manual_seed(steps)
    Y = torch.randn(steps, 3, 7, generator=g).to(dtype)
    prev = torch.randn(3, 7, generator=g).to(dtype)
    for p in (None, prev):
        ref = torch.cat([Y[:1] if p is None else Y[:1] - p, Y[1:] - Y[:-1]])
        got = Y.clone()
        last = _differences_(got, p)
        assert torch.equal(got, ref)
        assert torch.equal(last, Y[-1])  # the original last row, for the next call
        assert last.data_ptr() != got[-1].data_ptr()  # a copy, not a view of the (overwritten) differences


def _vit(dtype):
    torch.manual_seed(3)
    vit = TinyViT(embed_dim=16, depth=2, num_heads=2, act_layer=nn.ReLU, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    qann = quantize(vit, level=16)
    x = torch.randn(3, 1, 8, 8)
    calibrate(qann, x)
    return convert(qann.to(dtype).eval()), x


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_every_chunk_size_identical_tiny_vit(dtype):
    snn, x = _vit(dtype)
    ref = simulate(snn, x, max_steps=40, chunk=1)
    assert ref.num_steps > 8  # several chunks of every size below
    for chunk in (2, 3, 4, 7, 40):
        assert_results_equal(simulate(snn, x, max_steps=40, chunk=chunk), ref)


def test_every_chunk_size_identical_text_encoder_with_mask():
    torch.manual_seed(4)
    enc = TinyTextEncoder(vocab_size=13, max_len=10, num_classes=3)
    q = quantize(enc, level=16)
    ids = torch.randint(0, 13, (4, 10))
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask[1, 6:] = False
    mask[3, 3:] = False
    calibrate(q, ids, mask=mask)
    snn = convert(q.double().eval())
    ref = simulate(snn, ids, mask=mask, max_steps=80, chunk=1)
    for chunk in (3, 4, 9):
        assert_results_equal(simulate(snn, ids, mask=mask, max_steps=80, chunk=chunk), ref)


def test_every_chunk_size_identical_hf_bert_pairs_and_vit():
    tr = pytest.importorskip("transformers")
    cfg = dict(hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=24, hidden_act="relu",
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(5)
    bert = tr.BertForSequenceClassification(tr.BertConfig(vocab_size=30, max_position_embeddings=20,
                                                          type_vocab_size=2, num_labels=3, **cfg)).eval()
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(3, 30, (3, 9), generator=g)
    tt = torch.zeros_like(ids)
    tt[:, 5:] = 1  # segment B
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    qann = quantize(bert, level=16)
    calibrate(qann, input_ids=ids, attention_mask=mask, token_type_ids=tt)
    snn = convert(qann.double().eval())
    ref = simulate(snn, ids, mask=mask, token_type_ids=tt, max_steps=200, chunk=1)
    with torch.no_grad():
        logits = qann(input_ids=ids, attention_mask=mask, token_type_ids=tt).logits
    assert (ref.logits - logits).abs().max() < 1e-9
    for chunk in (3, 4):
        assert_results_equal(simulate(snn, ids, attention_mask=mask, token_type_ids=tt, max_steps=200, chunk=chunk), ref)
    torch.manual_seed(6)
    vit = tr.ViTModel(tr.ViTConfig(image_size=6, patch_size=2, num_channels=2, **cfg)).eval()
    x = torch.randn(3, 2, 6, 6)
    qv = quantize(vit, level=16)
    calibrate(qv, x)
    snn = convert(qv.double().eval())
    ref = simulate(snn, x, max_steps=200, chunk=1)
    assert ref.pooler_output is not None
    for chunk in (3, 4):
        assert_results_equal(simulate(snn, x, max_steps=200, chunk=chunk), ref)


_CHILD = r"""
import json
from icml24.spikezip_tf import _fused
from tests.spikezip_tf.test_speed_paths import _heap_case
outputs = _heap_case()  # (simulate runs keep_heap first)
print(json.dumps({"padded": _fused.heap_padded, "pad": _fused.HEAP_PAD, "outputs": outputs}))
"""


def _heap_case() -> str:
    """A simulation's outputs (hash) after :func:`simulate` ran ``keep_heap``."""
    import hashlib

    snn, x = _vit(F64)
    res = simulate(snn, x, max_steps=40)
    return hashlib.sha256(res.outputs.numpy().tobytes()).hexdigest()


def _glibc() -> bool:
    return sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")


def test_simulate_applies_the_heap_setting_once(monkeypatch):
    pad = _fused.HEAP_PAD
    try:
        monkeypatch.setattr(_fused, "_HEAP_DONE", False)
        monkeypatch.setattr(_fused, "heap_padded", False)
        monkeypatch.setattr(_fused, "HEAP_PAD", 0)
        assert _fused.keep_heap() is False and _fused.heap_padded is False  # 0: the allocator is left alone
        monkeypatch.setattr(_fused, "_HEAP_DONE", False)
        monkeypatch.setattr(_fused, "HEAP_PAD", 1 << 20)
        snn, x = _vit(F64)
        simulate(snn, x, max_steps=4)  # simulate applies it
        assert _fused._HEAP_DONE and _fused.heap_padded is _glibc()
        assert _fused.keep_heap() is _fused.heap_padded  # once: the same answer afterwards
    finally:  # back to this process's setting
        monkeypatch.setattr(_fused, "_HEAP_DONE", False)
        monkeypatch.setattr(_fused, "HEAP_PAD", pad)
        _fused.keep_heap()


def test_heap_setting_changes_no_result_and_can_be_turned_off():
    here = _heap_case()  # this process: simulate ran keep_heap (on glibc it pads)
    env = dict(os.environ, ICML24_SPIKEZIP_HEAP_PAD="0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=root, capture_output=True, text=True,
                         check=True)
    run = json.loads(out.stdout.strip().splitlines()[-1])
    assert run["pad"] == 0 and run["padded"] is False  # turned off from the environment
    assert run["outputs"] == here  # bit-identical outputs either way

"""Real model families (timm-layout ViTs, Hugging Face BERT/RoBERTa encoders), official checkpoint layout, and
the multi-step simulation's identity with the step-by-step path."""

from __future__ import annotations

import math
import re
from functools import partial

import pytest
import torch
from torch import nn

from icml24.common.nets import TinyViT
from icml24.spikezip_tf import (
    QAttention,
    QSelfAttention,
    STBIFNeuron,
    TinyTextEncoder,
    calibrate,
    convert,
    quantize,
    quantizers,
    simulate,
)
from tests.spikezip_tf.compare import assert_results_equal
from tests.spikezip_tf.timm_like import VisionTransformer

F64 = torch.float64


def pow2_scales(model: nn.Module) -> None:
    for _, q in quantizers(model):
        q.set_scale(2.0 ** round(math.log2(float(q.s.detach()))))


# ------------------------------------------------------------------------------------ timm-layout ViT
@pytest.mark.parametrize("pool", ["token", "avg"])
def test_timm_layout_vit_recognised_by_structure_and_exact(pool):
    torch.manual_seed(0)
    vit = VisionTransformer(global_pool=pool).eval()
    qann = quantize(vit, level=16)
    # every site of the official myquan_replace, found without any icml24 class
    names = {n for n, _ in quantizers(qann)}
    for i in range(2):
        for site in ("norm1.1", "attn.quan_q", "attn.quan_k", "attn.quan_v", "attn.attn_quan",
                     "attn.after_attn_quan", "attn.quan_proj", "norm2.1", "mlp.act.0", "mlp.fc2.1"):
            assert f"blocks.{i}.{site}" in names
    assert {"patch_embed.proj.1", "norm.1"} <= names and len(names) == 22
    assert isinstance(qann.blocks[0].attn, QAttention)
    x = torch.randn(6, 1, 8, 8)
    calibrate(qann, x)
    pow2_scales(qann)
    qann = qann.double().eval()
    res = simulate(convert(qann), x, max_steps=300)
    assert res.quiescent_step is not None
    assert (res.logits - qann(x.double())).abs().max() < 1e-9


def test_timm_layout_vit_rejects_gelu_and_qk_norm():
    with pytest.raises(TypeError, match=re.escape("blocks.0.mlp.act' is GELU")):
        quantize(VisionTransformer(act_layer=nn.GELU), level=16)
    vit = VisionTransformer()
    vit.blocks[1].attn.q_norm = nn.LayerNorm(8)
    with pytest.raises(TypeError, match="blocks.1.attn.q_norm"):
        quantize(vit, level=16)


def _official_vit_keys(depth: int) -> set[str]:
    """The state-dict keys of an official SpikeZIP-TF ViT QANN (``myquan_replace``: LayerNorms and fc2 wrapped
    in ``Sequential(module, MyQuan)``, ``mlp.act`` = ``Sequential(MyQuan, ReLU)``, one ``s`` per MyQuan)."""
    keys = {"cls_token", "pos_embed", "patch_embed.proj.0.weight", "patch_embed.proj.0.bias", "patch_embed.proj.1.s",
            "norm.0.weight", "norm.0.bias", "norm.1.s", "head.weight", "head.bias"}
    for i in range(depth):
        p = f"blocks.{i}."
        keys |= {p + k for k in ("norm1.0.weight", "norm1.0.bias", "norm1.1.s", "norm2.0.weight", "norm2.0.bias",
                                 "norm2.1.s", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                                 "attn.proj.bias", "attn.quan_q.s", "attn.quan_k.s", "attn.quan_v.s",
                                 "attn.attn_quan.s", "attn.after_attn_quan.s", "attn.quan_proj.s",
                                 "mlp.fc1.weight", "mlp.fc1.bias", "mlp.act.0.s", "mlp.fc2.0.weight",
                                 "mlp.fc2.0.bias", "mlp.fc2.1.s")}
    return keys


@pytest.mark.parametrize("make", [lambda: VisionTransformer(), lambda: TinyViT(embed_dim=16, num_heads=2,
                                                                             act_layer=nn.ReLU)])
def test_official_layout_checkpoint_loads_strict_and_marks_scales(make):
    torch.manual_seed(0)
    src = quantize(make(), level=16)
    calibrate(src, torch.randn(4, 1, 8, 8))
    sd = src.state_dict()
    assert set(sd) == _official_vit_keys(2)  # no stray buffers
    torch.manual_seed(1)
    dst = quantize(make(), level=16)
    dst.load_state_dict(sd, strict=True)
    for (_, a), (_, b) in zip(quantizers(src), quantizers(dst), strict=True):
        assert bool(b.initialized) and torch.equal(a.s, b.s)
    dst.train()
    dst(torch.randn(4, 1, 8, 8) * 50)  # a training batch must not re-initialise loaded scales
    assert all(torch.equal(a.s, b.s) for (_, a), (_, b) in zip(quantizers(src), quantizers(dst), strict=True))


# ------------------------------------------------------------------------------------ Hugging Face encoders
def _hf(kind: str, **kw):
    transformers = pytest.importorskip("transformers")
    cfg_cls, model_cls = ((transformers.BertConfig, transformers.BertModel) if kind == "bert"
                          else (transformers.RobertaConfig, transformers.RobertaModel))
    args = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                hidden_act="relu", max_position_embeddings=24, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
    args.update(kw)
    torch.manual_seed(0)
    return model_cls(cfg_cls(**args), add_pooling_layer=False).eval()


def _ids_mask():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 40, (4, 9), generator=g)
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1, 6:] = 0
    mask[3, 4:] = 0
    return ids, mask


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("attn_impl", ["sdpa", "eager"])
def test_hf_encoder_snn_sums_to_qann_last_hidden_state(kind, attn_impl):
    model = _hf(kind)
    model.config._attn_implementation = attn_impl  # bool (sdpa) or additive (eager) masks reach the QANN
    qann = quantize(model, level=16)
    assert isinstance(qann.encoder.layer[0].attention.self, QSelfAttention)
    ids, mask = _ids_mask()
    calibrate(qann, input_ids=ids, attention_mask=mask)
    qann = qann.double().eval()
    ref = qann(input_ids=ids, attention_mask=mask).last_hidden_state
    snn = convert(qann)
    res = simulate(snn, ids, mask=mask, max_steps=300)
    assert res.quiescent_step is not None and res.outputs.shape[1:] == ref.shape
    assert (res.logits - ref).abs().max() < 1e-9
    # the mask matters (otherwise the test could not tell a masked from an unmasked encoder)
    unmasked = qann(input_ids=ids).last_hidden_state
    assert (unmasked[1] - ref[1]).abs().max() > 1e-3


def test_hf_encoder_official_layout_and_errors():
    model = _hf("roberta")
    qann = quantize(model, level=16)
    float_keys = set(model.state_dict())
    keys = set(qann.state_dict())
    expected = {re.sub(r"\.(attention\.output|output)\.dense\.", r".\1.dense.0.", k) for k in float_keys}
    for i in range(2):
        p = f"encoder.layer.{i}."
        expected |= {p + f"attention.self.{n}_quan.s" for n in ("query", "key", "value", "attn", "after_attn")}
        expected |= {p + "attention.output.dense.1.s", p + "intermediate.intermediate_act_fn.0.s",
                     p + "output.dense.1.s"}
    assert keys == expected  # official RoBERTa layout: no quantizer after LayerNorms, no stray buffers
    fresh = quantize(model, level=16)
    fresh.load_state_dict(qann.state_dict(), strict=True)
    with pytest.raises(TypeError, match=re.escape("encoder.layer.0.intermediate.intermediate_act_fn' is GELU")):
        quantize(_hf("bert", hidden_act="gelu"), level=16)


# ------------------------------------------------------------------------------------ multi-step identity


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_multi_step_identical_to_step_by_step(dtype):
    torch.manual_seed(0)
    vit = TinyViT(embed_dim=16, depth=2, num_heads=2, act_layer=nn.ReLU, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    qann = quantize(vit, level=16)
    x = torch.randn(3, 1, 8, 8)
    calibrate(qann, x)
    snn = convert(qann.to(dtype).eval())
    for until in (True, False):
        # the reference simulates every step (also those past quiescence that the default fills with zeros)
        ref = simulate(snn, x, max_steps=30, until_quiescent=until, chunk=1, skip_after_quiescence=False)
        for chunk in (None, 30):
            assert_results_equal(simulate(snn, x, max_steps=30, until_quiescent=until, chunk=chunk), ref)
    if dtype == F64:
        return  # the text encoder (masks, token ids) in float32 only, where rounding differences would show
    torch.manual_seed(1)
    enc = TinyTextEncoder(vocab_size=11, max_len=12, num_classes=3)
    q = quantize(enc, level=16)
    ids = torch.randint(0, 11, (6, 12))
    mask = torch.ones(6, 12, dtype=torch.bool)
    mask[:3, 8:] = False
    calibrate(q, ids, mask=mask)
    snn = convert(q.to(dtype).eval())
    ref = simulate(snn, ids, mask=mask, max_steps=60, chunk=1)
    assert_results_equal(simulate(snn, ids, mask=mask, max_steps=60, chunk=7), ref)


def test_neuron_multi_step_equals_single_steps_and_range_check():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 3, 50, generator=g)
    x[5:8] = 0  # silent steps in the middle: the skip path
    n = STBIFNeuron(threshold=0.3, pos_max=7, neg_min=-8)
    outs = []
    for t in range(12):
        outs.append(n(x[t]))
    n.reset()
    n.steps = 12
    multi = n(x.reshape(36, 50)).reshape(12, 3, 50)
    assert torch.equal(torch.stack(outs), multi)
    with pytest.raises(ValueError, match="neg_min <= 0 <= pos_max"):
        STBIFNeuron(threshold=1.0, pos_max=3, neg_min=1)
    with pytest.raises(ValueError, match="chunk"):
        simulate(convert(quantize(TinyViT(embed_dim=16, num_heads=2, act_layer=nn.ReLU), level=16)),
                 torch.randn(1, 1, 8, 8), max_steps=4, chunk=0)

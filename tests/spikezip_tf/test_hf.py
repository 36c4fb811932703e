"""Hugging Face models end to end: every input reaches the SNN (sentence pairs), poolers and classification
heads as ANN heads, HF ViT, and refusals that name the module before anything is built."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from icml24.common.nets import TinyViT
from icml24.spikezip_tf import (
    AnnHead,
    QSelfAttention,
    SpikeLinear,
    calibrate,
    check_supported,
    convert,
    quantize,
    quantizers,
    simulate,
)

tr = pytest.importorskip("transformers")

F64 = torch.float64
TOL = 1e-9  # float64: the SNN's summed output equals the QANN's up to round-off


def _text_cfg(cls=None, **kw):
    # a shape no other test uses: d = 12, 3 heads, two segments
    args = dict(vocab_size=30, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=24,
                hidden_act="relu", max_position_embeddings=20, type_vocab_size=2, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, num_labels=3)
    args.update(kw)
    return (cls or tr.BertConfig)(**args)


def _vit_cfg(**kw):
    args = dict(image_size=6, patch_size=2, num_channels=2, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                intermediate_size=24, hidden_act="relu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                num_labels=4)
    args.update(kw)
    return tr.ViTConfig(**args)


def _pair_batch():
    """Sentence pairs: [CLS] A [SEP] B [SEP] with segment ids 0 / 1, different split points, padding."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 30, (4, 11), generator=g)
    tt = torch.zeros_like(ids)
    mask = torch.ones_like(ids)
    for row, (split, length) in enumerate([(4, 11), (6, 9), (3, 11), (5, 7)]):
        tt[row, split:length] = 1
        mask[row, length:] = 0
    return ids, tt, mask


def _qann(model, *args, **kwargs):
    torch.manual_seed(1)
    qann = quantize(model.eval(), level=16)
    calibrate(qann, *args, **kwargs)
    return qann.double().eval()


def _snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [(n, type(m)) for n, m in model.named_modules()])


def _assert_untouched(model, snap) -> None:
    sd, types = snap
    now = model.state_dict()
    assert set(now) == set(sd) and all(torch.equal(now[k], sd[k]) for k in sd)
    assert [(n, type(m)) for n, m in model.named_modules()] == types
    assert not quantizers(model)


# ------------------------------------------------------------------------------------ every input reaches the SNN
def test_sentence_pair_token_type_ids_snn_equals_qann():
    torch.manual_seed(0)
    ids, tt, mask = _pair_batch()
    qann = _qann(tr.BertModel(_text_cfg(), add_pooling_layer=False), input_ids=ids, token_type_ids=tt,
                 attention_mask=mask)
    ref = qann(input_ids=ids, token_type_ids=tt, attention_mask=mask).last_hidden_state
    snn = convert(qann)
    res = simulate(snn, ids, mask=mask, token_type_ids=tt, max_steps=300)
    assert res.quiescent_step is not None and res.quiescent_step > 2
    assert (res.logits - ref).abs().max() < TOL
    # identical for every chunk (chunk=1 is the step-by-step path)
    assert torch.equal(simulate(snn, ids, mask=mask, token_type_ids=tt, max_steps=300, chunk=1).outputs,
                       res.outputs)
    # the segment ids matter: without them segment B comes out wrong (the bug this test guards against)
    seg_b = (tt == 1)
    no_tt = simulate(snn, ids, mask=mask, max_steps=300).logits
    assert (no_tt - ref)[seg_b].abs().max() > 1e-2
    # attention_mask= is the same key mask as mask=
    assert torch.equal(simulate(snn, ids, attention_mask=mask, token_type_ids=tt, max_steps=300).outputs,
                       res.outputs)


def test_position_ids_reach_the_snn():
    torch.manual_seed(0)
    ids, tt, mask = _pair_batch()
    pos = (torch.arange(11) + 5).expand(4, -1).contiguous()  # shifted positions
    qann = _qann(tr.BertModel(_text_cfg(), add_pooling_layer=False), input_ids=ids, position_ids=pos)
    ref = qann(input_ids=ids, position_ids=pos, token_type_ids=tt, attention_mask=mask).last_hidden_state
    snn = convert(qann)
    res = simulate(snn, ids, mask=mask, token_type_ids=tt, position_ids=pos, max_steps=300)
    assert (res.logits - ref).abs().max() < TOL
    row = simulate(snn, ids, mask=mask, token_type_ids=tt, position_ids=pos[:1], max_steps=300)  # (1, N) broadcasts
    assert (row.logits - ref).abs().max() < TOL
    assert (simulate(snn, ids, mask=mask, token_type_ids=tt, max_steps=300).logits - ref).abs().max() > 1e-2


def test_inputs_the_runner_does_not_take_are_refused():
    torch.manual_seed(0)
    ids, tt, mask = _pair_batch()
    snn = convert(_qann(tr.BertModel(_text_cfg(), add_pooling_layer=False), input_ids=ids))
    for name in ("inputs_embeds", "head_mask", "encoder_hidden_states"):
        with pytest.raises(TypeError, match=rf"input '{name}', which the runner of BertModel does not take "
                                            r"\(it takes mask, position_ids, token_type_ids\)"):
            simulate(snn, ids, max_steps=10, **{name: torch.zeros(4, 11)})
    with pytest.raises(ValueError, match=r"token_type_ids must have the shape of input_ids \(4, 11\), got \(4, 10\)"):
        simulate(snn, ids, token_type_ids=tt[:, :10], max_steps=10)
    with pytest.raises(TypeError, match="token_type_ids must be an integer tensor"):
        simulate(snn, ids, token_type_ids=tt.double(), max_steps=10)
    with pytest.raises(ValueError, match="not both"):
        simulate(snn, ids, mask=mask, attention_mask=mask, max_steps=10)
    # an image model takes no mask: refused, not ignored
    vit = TinyViT(embed_dim=16, num_heads=2, act_layer=nn.ReLU)
    vsnn = convert(quantize(vit, level=16))
    with pytest.raises(TypeError, match=r"input 'mask', which the runner of TinyViT does not take \(it takes nothing"):
        simulate(vsnn, torch.rand(2, 1, 8, 8), mask=torch.ones(2, 17), max_steps=4)
    with pytest.raises(TypeError, match="input 'attention_mask'"):
        simulate(vsnn, torch.rand(2, 1, 8, 8), attention_mask=torch.ones(2, 17), max_steps=4)


# ------------------------------------------------------------------------------------ poolers and classifier heads
def test_bert_model_with_pooler_converts_pooler_runs_as_ann_head():
    torch.manual_seed(0)
    ids, tt, mask = _pair_batch()
    model = tr.BertModel(_text_cfg())  # the default: with pooler (dense + Tanh)
    assert isinstance(model.pooler.activation, nn.Tanh)
    qann = _qann(model, input_ids=ids, token_type_ids=tt, attention_mask=mask)
    assert not any(n.startswith("pooler") for n, _ in quantizers(qann))  # the pooler stays real-valued
    out = qann(input_ids=ids, token_type_ids=tt, attention_mask=mask)
    snn = convert(qann)
    assert type(snn.net.pooler.dense) is nn.Linear and isinstance(snn.net.pooler.activation, nn.Tanh)
    res = simulate(snn, ids, mask=mask, token_type_ids=tt, max_steps=300)
    assert (res.logits - out.last_hidden_state).abs().max() < TOL
    assert res.pooler_output.shape == out.pooler_output.shape
    assert (res.pooler_output - out.pooler_output).abs().max() < TOL
    assert out.pooler_output.abs().max() > 0.1  # not a trivially zero head


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_sequence_classification_logits_equal_qann(kind):
    torch.manual_seed(0)
    ids, tt, mask = _pair_batch()
    if kind == "bert":
        model, kw = tr.BertForSequenceClassification(_text_cfg()), dict(token_type_ids=tt)
    else:
        cfg = _text_cfg(tr.RobertaConfig, type_vocab_size=1, max_position_embeddings=24, pad_token_id=1)
        model, kw = tr.RobertaForSequenceClassification(cfg), {}
    qann = _qann(model, input_ids=ids, attention_mask=mask, **kw)
    ref = qann(input_ids=ids, attention_mask=mask, **kw).logits
    snn = convert(qann)
    assert isinstance(snn.head, AnnHead)
    res = simulate(snn, ids, mask=mask, max_steps=300, **kw)
    assert res.outputs.shape[1:] == ref.shape == (4, 3)
    assert res.quiescent_step is not None and res.quiescent_step > 2
    assert (res.logits - ref).abs().max() < TOL
    # the running sum after step t is the head applied to the encoder output accumulated so far
    assert (res.cumulative()[-1] - ref).abs().max() < TOL
    assert (res.cumulative()[0] - ref).abs().max() > 1e-6  # the first step alone is not the answer
    assert torch.equal(simulate(snn, ids, mask=mask, max_steps=300, chunk=1, **kw).outputs, res.outputs)
    # the head is untouched by quantize and convert; the encoder spikes
    head_lin = snn.net.classifier if kind == "bert" else snn.net.classifier.out_proj
    assert type(head_lin) is nn.Linear
    base = snn.net.bert if kind == "bert" else snn.net.roberta
    assert isinstance(base.encoder.layer[0].attention.self.query, SpikeLinear)


# ------------------------------------------------------------------------------------ Hugging Face ViT
def test_hf_vit_model_sites_and_exactness():
    torch.manual_seed(0)
    model = tr.ViTModel(_vit_cfg())  # with pooler
    x = torch.randn(5, 2, 6, 6)
    qann = _qann(model, x)
    names = {n for n, _ in quantizers(qann)}
    for i in range(2):
        p = f"encoder.layer.{i}."
        for site in ("layernorm_before.1", "attention.attention.query_quan", "attention.attention.key_quan",
                     "attention.attention.value_quan", "attention.attention.attn_quan",
                     "attention.attention.after_attn_quan", "attention.output.dense.1",
                     "intermediate.intermediate_act_fn.0", "output.dense.1", "layernorm_after.1"):
            assert p + site in names
    assert {"embeddings.patch_embeddings.projection.1", "layernorm.1"} <= names and len(names) == 22
    assert isinstance(qann.encoder.layer[0].attention.attention, QSelfAttention)
    out = qann(x.double())
    snn = convert(qann)
    res = simulate(snn, x, max_steps=300)
    assert res.quiescent_step is not None and res.quiescent_step > 2
    assert (res.logits - out.last_hidden_state).abs().max() < TOL
    assert (res.pooler_output - out.pooler_output).abs().max() < TOL
    assert torch.equal(simulate(snn, x, max_steps=300, chunk=1).outputs, res.outputs)
    # a checkpoint in this layout loads strictly into a fresh QANN
    fresh = quantize(tr.ViTModel(_vit_cfg()), level=16)
    fresh.load_state_dict(qann.state_dict(), strict=True)


def test_hf_vit_for_image_classification_logits_equal_qann():
    torch.manual_seed(0)
    x = torch.randn(5, 2, 6, 6)
    qann = _qann(tr.ViTForImageClassification(_vit_cfg()), x)
    ref = qann(x.double()).logits
    res = simulate(convert(qann), x, max_steps=300)
    assert res.outputs.shape[1:] == ref.shape == (5, 4)
    assert (res.logits - ref).abs().max() < TOL
    assert (res.cumulative()[0] - ref).abs().max() > 1e-6


# ------------------------------------------------------------------------------------ refusals, before anything
def _refused(model, exc, pattern):
    snap = _snapshot(model)
    with pytest.raises(exc, match=pattern):
        quantize(model, level=16)
    _assert_untouched(model, snap)
    with pytest.raises(exc, match=pattern):
        check_supported(model)


def test_unsupported_models_are_refused_up_front_and_left_untouched():
    torch.manual_seed(0)
    # a task head that is not supported
    _refused(tr.BertForTokenClassification(_text_cfg()), TypeError,
             r"cannot convert the Hugging Face wrapper BertForTokenClassification")
    _refused(tr.ViTForMaskedImageModeling(_vit_cfg()), TypeError, r"ViTForMaskedImageModeling")
    # GELU in the encoder is named, not the pooler's Tanh
    _refused(tr.BertForSequenceClassification(_text_cfg(hidden_act="gelu")), TypeError,
             re.escape("'bert.encoder.layer.0.intermediate.intermediate_act_fn' is GELU"))
    _refused(tr.ViTModel(_vit_cfg(hidden_act="gelu")), TypeError,
             re.escape("'encoder.layer.0.intermediate.intermediate_act_fn' is GELU"))
    # an unknown leaf anywhere in the encoder: its path and type
    bert = tr.BertModel(_text_cfg())
    bert.encoder.layer[1].output.dropout = nn.BatchNorm1d(11)
    _refused(bert, TypeError, re.escape("cannot convert module 'encoder.layer.1.output.dropout' of type BatchNorm1d"))
    vit = tr.ViTModel(_vit_cfg())
    vit.encoder.layer[0].attention.output.dropout = nn.Sigmoid()
    _refused(vit, TypeError, re.escape("module 'encoder.layer.0.attention.output.dropout' is Sigmoid"))
    # a ReLU that no quantizer can absorb (outside an FFN)
    tv = TinyViT(embed_dim=16, num_heads=2, act_layer=nn.ReLU)
    tv.head = nn.Sequential(nn.Linear(16, 10), nn.ReLU())
    _refused(tv, TypeError, re.escape("module 'head.1' is a ReLU outside an FFN"))
    # a decoder (causal self-attention, cross-attention)
    _refused(tr.BertModel(_text_cfg(is_decoder=True, add_cross_attention=True)), TypeError,
             re.escape("'encoder.layer.0.attention.self' (BertSelfAttention) is decoder (causal)"))
    # a mask token (masked image modelling) and a model type without any runner
    _refused(tr.ViTModel(_vit_cfg(), use_mask_token=True), TypeError, re.escape("'embeddings.mask_token'"))
    _refused(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)), TypeError, "no runner for Sequential")

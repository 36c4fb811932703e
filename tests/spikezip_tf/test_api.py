"""Unit tests of SpikeZIP-TF: neuron/operator equivalences (float64), whole-model exactness, errors."""

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
    Quantizer,
    SpikeLinear,
    SpikeMatmul,
    SpikingLayerNorm,
    SpikingModel,
    SpikingSoftmax,
    STBIFNeuron,
    TinyTextEncoder,
    additive_mask,
    calibrate,
    convert,
    count_macs,
    quantize,
    quantizers,
    simulate,
)

F64 = torch.float64


def q_ref(x: torch.Tensor, s: float, lo: int, hi: int) -> torch.Tensor:
    """The quantizer's integer level clamp(floor(x/s + 1/2), lo, hi), computed independently."""
    return torch.clamp(torch.floor(x / s + 0.5), lo, hi)


def run_neuron(n: STBIFNeuron, schedule: torch.Tensor, max_extra: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed ``schedule`` (T, ...) then zeros until no spike; return (sum of outputs, stacked outputs)."""
    n.reset()
    outs = [n(x) for x in schedule]
    for _ in range(max_extra):
        o = n(torch.zeros_like(schedule[0]))
        outs.append(o)
        if not o.ne(0).any():
            break
    else:
        raise AssertionError("neuron did not become quiet")
    o = torch.stack(outs)
    return o.sum(0), o


def neuron(s: float, sym: bool, level: int = 16, **kw) -> STBIFNeuron:
    q = Quantizer(level=level, sym=sym)  # only for its range
    return STBIFNeuron(threshold=torch.tensor(s, dtype=F64), pos_max=q.pos_max, neg_min=q.neg_min, **kw)


def pow2_scales(model: nn.Module) -> None:
    for _, q in quantizers(model):
        q.set_scale(2.0 ** round(math.log2(float(q.s.detach()))))


def tiny_vit(seed: int, **kw) -> TinyViT:
    torch.manual_seed(seed)
    args = dict(embed_dim=16, depth=2, num_heads=2, act_layer=nn.ReLU, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    args.update(kw)
    return TinyViT(**args)


# ------------------------------------------------------------------------------------------- 1. quantizer
def test_quantizer_formula_round_half_up_and_ranges():
    q = Quantizer(level=16, sym=True)
    q.set_scale(0.25)
    assert (q.neg_min, q.pos_max) == (-8, 7)
    x = torch.tensor([0.125, -0.125, 0.375, 10.0, -10.0, 0.1], dtype=F64)
    # ties go up (floor(x/s + 0.5)), unlike torch.round's half-to-even: 0.125/0.25 = 0.5 -> 1, -0.5 -> 0
    torch.testing.assert_close(q.double()(x), torch.tensor([0.25, 0.0, 0.5, 1.75, -2.0, 0.0], dtype=F64))
    u = Quantizer(level=16, sym=False)
    assert (u.neg_min, u.pos_max) == (0, 15)


def test_quantizer_lsq_init_and_straight_through_gradient():
    torch.manual_seed(0)
    q = Quantizer(level=16, sym=False)
    x = torch.randn(64, 8, requires_grad=True)
    q.train()
    y = q(x)
    torch.testing.assert_close(q.s.detach(), 2 * x.detach().abs().mean() / math.sqrt(15))
    y.sum().backward()
    s = q.s.detach()
    inside = (x.detach() / s + 0.5 >= 0) & (x.detach() / s + 0.5 < 16)
    torch.testing.assert_close(x.grad, inside.float())  # STE: 1 inside the clamp range, 0 outside
    assert q.s.grad is not None and q.s.grad.abs() > 0


def test_quantizer_lsq_gradient_scale_and_exact_step():
    """QAT gets LSQ's gradient g * dL/ds; the effective step equals ``q.s`` bit for bit (the SNN threshold uses
    ``q.s``), in eval/no_grad and with grad, whatever the batch size (g depends on numel)."""
    torch.manual_seed(0)
    q = Quantizer(level=16, sym=True)
    x = torch.randn(32, 8)
    # a step like 0.1 + eps is one where (s - s*g) + s*g != s in float32 for some g
    scales = torch.rand(2000, generator=torch.Generator().manual_seed(1)) * 3 + 1e-3
    for sv in scales.tolist():
        q.set_scale(sv)
        s = q.s.detach().clone()
        ref = torch.clamp(torch.floor(x / s + 0.5), -8, 7) * s  # independent formula with exactly q.s
        q.eval()
        with torch.no_grad():
            assert torch.equal(q(x), ref)
            assert torch.equal(q(x[:3]), ref[:3])  # another batch size: same step
        assert torch.equal(q(x), ref)  # grad enabled: same value
    # the LSQ gradient of s: (d/ds of the output) * g, g = 1 / sqrt(p_max * numel)
    q.set_scale(0.25)
    q.train()
    xd = torch.randn(16, 4, dtype=F64)
    q64 = q.double()
    q64(xd).sum().backward()
    s = 0.25
    lvl = xd / s + 0.5
    inside = (lvl >= -8) & (lvl < 8)
    dyds = torch.where(inside, torch.floor(lvl) - xd / s, torch.clamp(torch.floor(lvl), -8, 7))
    g = 1.0 / math.sqrt(7 * xd.numel())
    torch.testing.assert_close(q64.s.grad, dyds.sum() * g, atol=1e-12, rtol=1e-9)


# ------------------------------------------------------------------------------------------ 2. ST-BIF
@pytest.mark.parametrize("s", [0.25, 0.2718])
@pytest.mark.parametrize("sym", [True, False])
def test_stbif_single_shot_equals_quantizer(s, sym):
    g = torch.Generator().manual_seed(1)
    n = neuron(s, sym)
    x = (torch.rand(2000, generator=g, dtype=F64) - 0.5) * 2 * 20 * s  # includes values far outside the range
    total, outs = run_neuron(n, x[None])
    level = q_ref(x, s, n.neg_min, n.pos_max)
    assert torch.equal(n.acc, level)  # integer spike count == quantized level, exactly
    torch.testing.assert_close(total, level * s, atol=1e-12, rtol=0)
    assert set(torch.unique(outs).tolist()) <= {-s, 0.0, s}  # ternary, at most one spike per step
    assert (level == n.pos_max).any() and (level == n.neg_min).any()  # the clamp was exercised


@pytest.mark.parametrize("sym", [True, False])
def test_stbif_multi_step_any_schedule_dyadic_exact(sym):
    g = torch.Generator().manual_seed(2)
    s = 0.125
    n = neuron(s, sym)
    # increments on a dyadic grid, both signs: every partial sum is exact in float64
    sched = torch.randint(-40, 41, (12, 3000), generator=g).to(F64) / 64
    total, outs = run_neuron(n, sched)
    level = q_ref(sched.sum(0), s, n.neg_min, n.pos_max)
    assert torch.equal(n.acc, level)
    assert torch.equal(total, level * s)
    assert set(torch.unique(outs).tolist()) <= {-s, 0.0, s}
    assert (outs < 0).any()  # negative spikes were needed to correct overshoot


def test_stbif_multi_step_generic_scale():
    g = torch.Generator().manual_seed(3)
    s = 0.2718
    n = neuron(s, True)
    sched = torch.randn(8, 3000, generator=g, dtype=F64) * s
    total, _ = run_neuron(n, sched)
    X = sched.sum(0)
    level = q_ref(X, s, n.neg_min, n.pos_max)
    far = ((X / s + 0.5) - torch.floor(X / s + 0.5) - 0.5).abs() < 0.5 - 1e-9  # not within 1e-9 of a tie
    assert far.float().mean() > 0.999
    assert torch.equal(n.acc[far], level[far])
    torch.testing.assert_close(total, level * s, atol=1e-12, rtol=0)


def test_stbif_ablations_break_equivalence():
    x = torch.tensor([0.3, 0.9, -0.3], dtype=F64)
    # no half init: floor instead of round-half-up
    n = neuron(0.25, True, v_init=0.0)
    total, _ = run_neuron(n, x[None])
    torch.testing.assert_close(total, torch.tensor([0.25, 0.75, -0.5], dtype=F64))
    # no negative spikes: the spike fired on +0.3 cannot be taken back when -0.3 arrives
    sched = torch.tensor([[0.3], [-0.3]], dtype=F64)
    total, _ = run_neuron(neuron(0.25, True), sched)
    assert total.item() == 0.0  # = Q(0)
    total, _ = run_neuron(neuron(0.25, True, negative_spikes=False), sched)
    assert total.item() == 0.25


# ------------------------------------------------------------------------------------------- 3. operators
def test_product_rule_sums_to_matrix_product():
    g = torch.Generator().manual_seed(4)
    T = 9
    a = torch.randint(-1, 2, (T, 2, 3, 5, 4), generator=g).to(F64) * 0.37
    b = torch.randint(-1, 2, (T, 2, 3, 4, 6), generator=g).to(F64) * 0.11
    op = SpikeMatmul()
    op.reset()
    out = torch.stack([op(a[t], b[t]) for t in range(T)]).sum(0)
    torch.testing.assert_close(out, a.sum(0) @ b.sum(0), atol=1e-12, rtol=0)


def test_spiking_softmax_and_layernorm_sum_to_function_of_sum():
    g = torch.Generator().manual_seed(5)
    xs = torch.randn(7, 3, 5, 8, generator=g, dtype=F64)
    sm = SpikingSoftmax(dim=-1)
    torch.testing.assert_close(torch.stack([sm(x) for x in xs]).sum(0), torch.softmax(xs.sum(0), -1),
                               atol=1e-12, rtol=0)
    ln = nn.LayerNorm(8, eps=1e-6).double()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5, generator=g)
        ln.bias.uniform_(-0.5, 0.5, generator=g)
    sln = SpikingLayerNorm(ln)
    torch.testing.assert_close(torch.stack([sln(x) for x in xs]).sum(0).detach(), ln(xs.sum(0)).detach(),
                               atol=1e-12, rtol=0)
    # zero input after convergence -> exactly zero output (what makes quiescence detection sound)
    assert torch.equal(sm(torch.zeros_like(xs[0])), torch.zeros_like(xs[0]))


def test_spike_linear_adds_bias_once():
    lin = nn.Linear(4, 3).double()
    op = SpikeLinear(lin)
    xs = torch.randn(5, 2, 4, dtype=F64)
    out = torch.stack([op(x) for x in xs]).sum(0)
    torch.testing.assert_close(out.detach(), lin(xs.sum(0)).detach(), atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------- 4. whole tiny ViT, exact
@pytest.mark.parametrize("seed", range(10))
def test_whole_tiny_vit_snn_equals_qann_dyadic(seed):
    qann = quantize(tiny_vit(seed), level=16)
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    calibrate(qann, x)
    pow2_scales(qann)
    qann = qann.double().eval()
    with torch.no_grad():
        ref = qann(x.double())
    res = simulate(convert(qann), x, max_steps=256)
    assert res.quiescent_step is not None and res.quiescent_step < 255
    assert (res.sample_quiescent_step >= 0).all()
    torch.testing.assert_close(res.logits, ref, atol=1e-9, rtol=0)
    assert ref.std() > 1e-3  # logits are not degenerate
    assert all(v > 0 for v in res.spikes_per_layer.values() if v is not None)


def test_qattention_with_mask_equivalence_text_encoder():
    for seed in range(2):
        torch.manual_seed(seed)
        te = TinyTextEncoder(vocab_size=12, max_len=10, num_classes=3, embed_dim=16, depth=2, num_heads=2)
        qann = quantize(te, level=8)
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 12, (4, 10), generator=g)
        mask = torch.arange(10)[None] < torch.randint(3, 11, (4, 1), generator=g)
        calibrate(qann, ids, mask=mask)
        pow2_scales(qann)
        qann = qann.double().eval()
        with torch.no_grad():
            ref = qann(ids, mask=mask)
        snn = convert(qann)
        res = simulate(snn, ids, mask=mask, max_steps=256)
        assert res.quiescent_step is not None
        torch.testing.assert_close(res.logits, ref, atol=1e-9, rtol=0)
        # padded positions carry no information: changing them changes nothing
        ids2 = torch.where(mask, ids, (ids + 5) % 12)
        torch.testing.assert_close(simulate(snn, ids2, mask=mask, max_steps=256).logits, ref, atol=1e-9, rtol=0)


def test_fp32_conversion_close_and_ablation_far():
    qann = quantize(tiny_vit(0), level=16)
    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    calibrate(qann, x)  # generic (non-dyadic) scales
    with torch.no_grad():
        ref = qann.eval()(x)
    torch.testing.assert_close(simulate(convert(qann), x, max_steps=256).logits, ref, atol=1e-4, rtol=0)
    bad = simulate(convert(qann, dtype=F64, negative_spikes=False), x, max_steps=256).logits
    assert (bad - ref.double()).abs().max() > 1e-3


# -------------------------------------------------------------------------------------- 5. the tie limit
def test_known_limit_commensurate_scales_tie():
    """Documented limit: when the exact input sum lies on a rounding tie (X/s = k + 1/2) and the QANN and the
    SNN reach it by different float roundings, they can disagree by one level, even in float64. Dyadic
    scales make all sums exact and remove the case."""
    n = neuron(0.1, True)
    total, _ = run_neuron(n, torch.tensor([[0.1], [0.05]], dtype=F64))  # SNN: 0.5 + 1.0 -> 1.5 + 0.5 -> spikes 2
    qann = q_ref(torch.tensor([0.1 + 0.05], dtype=F64), 0.1, -8, 7) * 0.1  # 0.15000000000000002/0.1 = 1.5000..02
    assert n.acc.item() == 2 and qann.item() == pytest.approx(0.2)
    q_single = q_ref(torch.tensor([0.15], dtype=F64), 0.1, -8, 7)  # 0.15/0.1 = 1.4999999999999998 -> level 1
    assert q_single.item() == 1.0 and total.item() != q_single.item() * 0.1  # disagreement by one level
    n2 = neuron(0.125, True)  # dyadic: the same tie is resolved identically
    total2, _ = run_neuron(n2, torch.tensor([[0.125], [0.0625]], dtype=F64))
    assert total2.item() == q_ref(torch.tensor([0.1875], dtype=F64), 0.125, -8, 7).item() * 0.125


# ------------------------------------------------------------------------------------------- 6. reset
def test_reset_gives_identical_reruns_and_batch_size_change():
    qann = quantize(tiny_vit(1), level=16)
    x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    calibrate(qann, x)
    snn = convert(qann, dtype=F64)
    r1 = simulate(snn, x, max_steps=128)
    r2 = simulate(snn, x, max_steps=128)
    assert torch.equal(r1.outputs, r2.outputs) and r1.quiescent_step == r2.quiescent_step
    assert r1.spikes_per_layer == r2.spikes_per_layer
    r3 = simulate(snn, x[:2], max_steps=128)  # another batch size after the implicit reset
    torch.testing.assert_close(r3.logits, r1.logits[:2], atol=1e-12, rtol=0)
    # until_quiescent=False runs the full cap and the extra outputs are exactly zero
    r4 = simulate(snn, x, max_steps=r1.num_steps + 5, until_quiescent=False)
    assert r4.num_steps == r1.num_steps + 5 and torch.equal(r4.outputs[r1.num_steps:], torch.zeros_like(
        r4.outputs[r1.num_steps:]))
    # quiescent_step is the FIRST silent step whether or not the simulation stops there
    assert r1.quiescent_step is not None and r4.quiescent_step == r1.quiescent_step
    assert r1.quiescent_step == r1.num_steps - 1 and (r4.spikes_per_step[r1.quiescent_step:] == 0).all()
    assert (r4.spikes_per_step[: r1.quiescent_step] > 0).all()


def test_qann_is_not_modified_and_structure():
    ann = tiny_vit(2)
    qann = quantize(ann, level=8)
    assert not quantizers(ann)
    assert isinstance(qann.blocks[0].attn, QAttention)
    names = [n for n, _ in quantizers(qann)]
    assert "blocks.0.mlp.act.0" in names and "blocks.0.attn.quan_q" in names and "patch_embed.proj.1" in names
    assert qann.blocks[0].mlp.act[0].neg_min == 0  # the ReLU is merged into an unsigned quantizer
    snn = convert(qann)
    assert isinstance(snn, SpikingModel)
    assert len(snn.neurons()) == len(names)
    assert isinstance(qann.blocks[0].attn.quan_q, Quantizer)  # converting left the QANN intact


def test_count_macs_closed_form():
    ann = tiny_vit(0, embed_dim=16, depth=1, num_heads=2)
    x = torch.rand(1, 1, 8, 8)
    macs = count_macs(ann, x)
    n, d = 17, 16
    assert macs["patch_embed.proj"] == 16 * d * 4
    assert macs["blocks.0.attn.qkv"] == n * d * 3 * d
    assert macs["blocks.0.attn.matmul"] == 2 * n * n * d
    assert macs["blocks.0.mlp.fc1"] == n * d * 4 * d
    assert macs["head"] == d * 10


# ------------------------------------------------------------------------------------------- errors
def test_error_non_relu_activation_names_path():
    gelu = TinyViT(embed_dim=16, depth=2, num_heads=2, act_layer=nn.GELU)
    with pytest.raises(TypeError, match=r"blocks\.0\.mlp\.act.*GELU"):
        quantize(gelu, level=16)
    qann = quantize(tiny_vit(0), level=16)
    qann.blocks[1].mlp.act[1] = nn.SiLU()
    with pytest.raises(TypeError, match=r"'blocks\.1\.mlp\.act\.1' is SiLU"):
        convert(qann)
    qann = quantize(tiny_vit(0), level=16)
    qann.blocks[0].mlp.act = nn.ReLU()  # a bare ReLU with no unsigned quantizer before it
    with pytest.raises(TypeError, match=r"blocks\.0\.mlp\.act"):
        convert(qann)


def test_error_levels_below_two():
    with pytest.raises(ValueError, match="level .* must be an int >= 2, got 1"):
        quantize(tiny_vit(0), level=1)
    with pytest.raises(ValueError, match="must be an int >= 2"):
        Quantizer(level=0, sym=True)


@pytest.mark.parametrize("level", [2, 3])
def test_error_signed_quantizer_needs_four_levels(level):
    # L = 2, 3 with sym=True would give the range [-1, 0]: every positive activation quantised to 0
    with pytest.raises(ValueError, match=rf"a signed quantizer needs level >= 4 \(got {level}\)"):
        Quantizer(level=level, sym=True)
    with pytest.raises(ValueError, match=rf"needs level >= 4 \(got {level}\)"):
        quantize(tiny_vit(0), level=level)
    with pytest.raises(ValueError, match=rf"needs attn_level >= 4 \(got {level}\)"):
        quantize(tiny_vit(0), level=16, attn_level=level)
    u = Quantizer(level=level, sym=False)  # unsigned: [0, L - 1] is a valid range
    assert (u.neg_min, u.pos_max) == (0, level - 1)
    assert Quantizer(level=4, sym=True).pos_max == 1


def test_mask_float_01_is_a_keep_mask_even_when_b_equals_n():
    torch.manual_seed(0)
    te = TinyTextEncoder(vocab_size=12, max_len=6, num_classes=3, embed_dim=16, depth=2, num_heads=2).double()
    te.eval()
    ids = torch.randint(0, 12, (6, 6), generator=torch.Generator().manual_seed(0))  # B == N == 6
    keep = torch.arange(6)[None] < torch.tensor([[2], [3], [4], [5], [6], [6]])
    with torch.no_grad():
        ref = te(ids, mask=keep)
        for m in (keep.double(), keep.float(), keep.long(), keep.int()):
            torch.testing.assert_close(te(ids, mask=m), ref, atol=0, rtol=0)
    torch.testing.assert_close(additive_mask(keep.double(), F64), additive_mask(keep, F64), atol=0, rtol=0)
    # the QANN and the SNN treat the float mask the same way
    qann = quantize(te.float(), level=8)
    calibrate(qann, ids, mask=keep)
    pow2_scales(qann)
    qann = qann.double().eval()
    with torch.no_grad():
        qref = qann(ids, mask=keep)
        torch.testing.assert_close(qann(ids, mask=keep.double()), qref, atol=0, rtol=0)
    res = simulate(convert(qann), ids, mask=keep.double(), max_steps=256)
    torch.testing.assert_close(res.logits, qref, atol=1e-9, rtol=0)


def test_error_mask_shape():
    torch.manual_seed(0)
    te = TinyTextEncoder(vocab_size=12, max_len=8, num_classes=3, embed_dim=16, depth=1, num_heads=2)
    ids = torch.randint(0, 12, (3, 8))
    bad = [torch.ones(3, 7, dtype=torch.bool), torch.ones(8, 3), torch.ones(3, 1, 1, 8), torch.ones(3, 8, 8)]
    qann = quantize(te, level=8)
    calibrate(qann, ids)
    snn = convert(qann)
    for m in bad:
        msg = rf"spikezip_tf: mask must have shape \(3, 8\), got {re.escape(str(tuple(m.shape)))}"
        with pytest.raises(ValueError, match=msg):
            te(ids, mask=m)  # MaskedAttention
        with pytest.raises(ValueError, match=msg):
            qann(ids, mask=m)  # QAttention
        with pytest.raises(ValueError, match=msg):
            simulate(snn, ids, mask=m, max_steps=8)  # SpikingAttention
    with pytest.raises(TypeError, match=r"level \(quantization levels L\) must be an int"):
        quantize(tiny_vit(0), level=16.0)


def test_error_max_steps_and_other_bad_input():
    qann = quantize(tiny_vit(0), level=16)
    snn = convert(qann)
    x = torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match="max_steps must be an int >= 1, got 0"):
        simulate(snn, x, max_steps=0)
    with pytest.raises(TypeError, match="snn must be a SpikingModel"):
        simulate(qann, x, max_steps=8)
    with pytest.raises(ValueError, match="no quantizers"):
        convert(tiny_vit(0))
    with pytest.raises(ValueError, match="already contains Quantizer"):
        quantize(qann, level=16)
    with pytest.raises(ValueError, match="v_init"):
        convert(qann, v_init=1.0)
    with pytest.raises(TypeError, match="no runner"):
        convert(nn.Sequential(nn.Linear(2, 2), Quantizer(level=4, sym=True)))

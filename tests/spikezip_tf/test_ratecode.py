"""The conventional rate-coded baseline: SpikingJelly cross-check on the MLP subset, neuron dynamics, errors."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from icml24.common.nets import MLP, TinyViT
from icml24.spikezip_tf import (
    RateIFNeuron,
    convert,
    quantize,
    quantizers,
    rate_convert,
    rate_simulate,
    simulate,
)


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return MLP(in_features=20, hidden=[32, 16], out_features=5).double().eval(), torch.randn(64, 20).double()


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return TinyViT(embed_dim=16, depth=1, num_heads=2, act_layer=nn.ReLU,
                   norm_layer=partial(nn.LayerNorm, eps=1e-6)).double().eval()


def test_matches_spikingjelly_rate_coding_on_mlp():
    try:
        from spikingjelly.activation_based import ann2snn, functional
    except ImportError as e:  # pragma: no cover - depends on the environment
        pytest.skip(f"spikingjelly not installed (pip install --no-deps spikingjelly==2.0.0): {e}")
    mlp, x = _mlp()
    ours = rate_convert(mlp, x, percentile=99.9)
    y = rate_simulate(ours, x, max_steps=48)
    conv = ann2snn.Converter(recipe=ann2snn.RateCodingRecipe(dataloader=[(x, None)], mode="99.9%"), device="cpu")
    snn = conv.convert(mlp)
    functional.reset_net(snn)
    with torch.no_grad():
        outs = torch.stack([snn(x) for _ in range(48)])
    ref = outs.cumsum(0) / torch.arange(1, 49, dtype=outs.dtype)[:, None, None]
    # same thresholds (SpikingJelly keeps them in float32) and the same spike trains at every step
    sj_thr = sorted(float(m.scale) for n, m in snn.named_modules() if n.endswith("scaler1"))
    assert sorted(ours.thresholds.values()) == pytest.approx(sj_thr, rel=1e-6)
    assert (y - ref).abs().max() < 1e-6
    assert (y[-1] - y[0]).abs().max() > 1e-2  # the outputs do evolve with T


def test_if_neuron_rate_and_reset_by_subtraction():
    n = RateIFNeuron(threshold=0.5)
    x = torch.full((1,), 0.2, dtype=torch.float64)
    spikes = torch.stack([n(x) for _ in range(100)])
    assert set(spikes.unique().tolist()) <= {0.0, 0.5}
    assert spikes.sum() == pytest.approx(0.2 * 100, abs=0.5)  # rate * lambda = input; residual < one spike
    s = RateIFNeuron(threshold=1.0, signed=True)
    out = torch.stack([s(torch.tensor([-0.3])) for _ in range(10)])
    assert out.sum().item() == -3.0 and out.max().item() == 0.0
    u = RateIFNeuron(threshold=1.0)
    assert torch.stack([u(torch.tensor([-0.3])) for _ in range(10)]).abs().sum() == 0  # unsigned: ReLU


def test_mlp_rate_code_converges_to_ann():
    mlp, x = _mlp()
    y = rate_simulate(rate_convert(mlp, x, percentile=100.0), x, max_steps=1024)
    err = (y - mlp(x)).abs().amax(dim=(1, 2))
    assert err[-1] < 0.1 * err[7] and err[-1] < 0.05  # the error shrinks ~1/T with max-normalisation


def test_vit_rate_code_approaches_ann_and_leaves_ann_untouched():
    vit = _vit()
    x = torch.rand(8, 1, 8, 8, dtype=torch.float64)
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    rc = rate_convert(vit, x, percentile=100.0)
    assert all(torch.equal(before[k], v) for k, v in vit.state_dict().items())
    y = rate_simulate(rc, x, max_steps=64)
    err = (y - vit(x)).abs().amax(dim=(1, 2))
    assert err[-1] < 0.5 * err[3]
    assert {type(m).__name__ for _, m in rc.neurons()} == {"RateIFNeuron"}
    assert len(rc.neurons()) == len(quantizers(quantize(vit, level=4)))  # one IF neuron per SpikeZIP site


def test_rate_convert_errors():
    mlp, x = _mlp()
    with pytest.raises(ValueError, match="percentile"):
        rate_convert(mlp, x, percentile=0.0)
    with pytest.raises(ValueError, match="v_init"):
        rate_convert(mlp, x, v_init=1.0)
    with pytest.raises(TypeError, match="GELU"):
        rate_convert(MLP(in_features=4, hidden=[4], out_features=2, act_layer=nn.GELU), x)
    with pytest.raises(TypeError, match="float ANN"):
        rate_convert(quantize(_vit(), level=8), torch.rand(2, 1, 8, 8))
    with pytest.raises(ValueError, match="no ReLU"):
        rate_convert(nn.Linear(20, 3), x)
    with pytest.raises(ValueError, match="max_steps"):
        rate_simulate(rate_convert(mlp, x), x, max_steps=0)
    with pytest.raises(ValueError, match="threshold"):
        RateIFNeuron(threshold=0.0)


def test_negative_spike_ablation_split_signed_vs_unsigned():
    """Signed neurons need -1 spikes to represent negative values at all; unsigned ones only to undo overshoot."""
    torch.manual_seed(1)
    vit = TinyViT(embed_dim=16, depth=1, num_heads=2, act_layer=nn.ReLU, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    qann = quantize(vit, level=16)
    x = torch.rand(32, 1, 8, 8)
    qann.train()
    qann(x)  # initialise the scales
    qann = qann.double().eval()
    ref = qann(x.double()).argmax(-1)
    agree = {}
    for mode in (True, "signed", "unsigned"):
        snn = convert(qann, negative_spikes=mode)
        kinds = {m.neg_min < 0: m.negative_spikes for _, m in snn.neurons()}
        if isinstance(mode, str):
            assert kinds == {True: mode == "signed", False: mode == "unsigned"}
        agree[mode] = (simulate(snn, x, max_steps=40).logits.argmax(-1) == ref).double().mean().item()
    assert agree[True] == 1.0
    assert agree["signed"] > agree["unsigned"] + 0.2  # losing them in signed neurons is far worse
    with pytest.raises(ValueError, match="negative_spikes"):
        convert(qann, negative_spikes="both")

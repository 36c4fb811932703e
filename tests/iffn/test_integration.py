"""IFFN in host models: weight-decay grouping rules, pretrained-weight transfer, Swin-like/windowed inputs,
the learned-shift helpers and the serial (LocalViT/CMT) topology."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from icml24.common.nets import Mlp, TinyViT
from icml24.iffn import (
    IFFN,
    AGeLU,
    agelu_parameter_names,
    agelu_shift_spread,
    agelu_shifts,
    count_flops,
    replace_ffn,
)
from icml24.iffn.experiment import Config, build_vit, param_groups
from tests.iffn._reference import dwconv_at


def _iffn_vit(**kw) -> TinyViT:
    torch.manual_seed(0)
    return TinyViT(img_size=8, patch_size=2, embed_dim=16, depth=2,
                   mlp_layer=functools.partial(IFFN, hidden_ratio=1.0, n_instances=2, **kw))


def _randomize(module: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


# ----------------------------------------------------------------------------------- weight decay
def timm_no_decay_names(model: nn.Module, no_weight_decay_list: tuple[str, ...] = ()) -> set[str]:
    """timm.optim._param_groups.param_groups_weight_decay's rule, re-implemented (timm is not installable here):
    ``param.ndim <= 1 or name.endswith(".bias") or name in no_weight_decay_list`` -> no decay."""
    return {name for name, p in model.named_parameters()
            if p.requires_grad and (p.ndim <= 1 or name.endswith(".bias") or name in no_weight_decay_list)}


def test_agelu_parameters_are_one_dimensional_and_no_decay_under_timm_rule():
    vit = _iffn_vit()
    names = agelu_parameter_names(vit)
    # 2 blocks x (channel-path AGeLU + spatial AGeLU) x a, b, c, d
    assert len(names) == 16 and "blocks.0.mlp.act.c" in names and "blocks.1.mlp.spatial_act.a" in names
    params = dict(vit.named_parameters())
    assert all(params[n].ndim == 1 for n in names)
    assert params["blocks.0.mlp.act.a"].shape == (2 * 16,)
    no_decay = timm_no_decay_names(vit)
    assert set(names) <= no_decay
    # the rule still decays the matrices and the depthwise kernel
    for n in ("blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight", "blocks.0.mlp.dwconv.weight"):
        assert n not in no_decay
    # the experiment's own grouping agrees with timm's on every parameter except cls_token/pos_embed (3-D)
    groups = param_groups(vit, 0.05)
    ours_no_decay = {n for n, p in vit.named_parameters() if any(p is q for q in groups[1]["params"])}
    assert ours_no_decay == no_decay | {"cls_token", "pos_embed"}


def test_agelu_scalar_params_and_fixed_buffers():
    act = AGeLU(6, n_instances=3, param_shape="scalar")
    assert all(getattr(act, k).shape == (3,) for k in "abcd")
    assert act.per_instance("c").shape == (3, 1)
    assert agelu_parameter_names(AGeLU(4, n_instances=2, learnable=False)) == []
    with pytest.raises(ValueError, match="name must be one of"):
        act.per_instance("e")


@pytest.mark.parametrize("n,param_shape", [(3, "channel"), (1, "channel"), (2, "scalar")])
def test_old_two_dimensional_checkpoints_still_load(n, param_shape):
    torch.manual_seed(0)
    m = IFFN(8, hidden_ratio=1.0, n_instances=n, param_shape=param_shape)
    _randomize(m, 1)
    old_state = {k: (v.reshape(-1 if "spatial_act" in k else n, v.numel() // (1 if "spatial_act" in k else n))
                     if k.split(".")[-1] in "abcd" else v) for k, v in m.state_dict().items()}
    assert old_state["act.a"].ndim == 2
    fresh = IFFN(8, hidden_ratio=1.0, n_instances=n, param_shape=param_shape)
    fresh.load_state_dict(old_state)
    x = torch.randn(2, 17, 8)
    torch.testing.assert_close(fresh(x), m(x), rtol=0, atol=0)


def test_transformers_trainer_rule_decays_agelu_and_the_documented_override_fixes_it():
    pytest.importorskip("transformers", reason="transformers is the 'hf' extra")
    from transformers import Trainer
    from transformers.trainer_pt_utils import get_parameter_names

    vit = _iffn_vit(spatial_norm="bn")
    names = set(agelu_parameter_names(vit))
    # Trainer.get_decay_parameter_names does not use self: name patterns ("bias", "*norm*") + LayerNorm modules
    decay = set(Trainer.get_decay_parameter_names(None, vit))
    assert decay == set(get_parameter_names(vit, [nn.LayerNorm], [r"bias", r"layernorm", r"rmsnorm",
                                                                   r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]))
    assert names <= decay  # the name-based rule ignores ndim: AGeLU a, b, c, d ARE decayed
    assert "blocks.0.mlp.fc1.bias" not in decay and "blocks.0.norm1.weight" not in decay
    assert "blocks.0.mlp.spatial_norm.weight" not in decay  # BatchNorm excluded by its name ("_norm")

    class IFFNTrainer(Trainer):  # the README's override
        def get_decay_parameter_names(self, model):
            skip = set(agelu_parameter_names(model))
            return [n for n in super().get_decay_parameter_names(model) if n not in skip]

    fixed = set(IFFNTrainer.get_decay_parameter_names(IFFNTrainer.__new__(IFFNTrainer), vit))
    assert fixed == decay - names and not fixed & names
    assert "blocks.0.mlp.fc2.weight" in fixed


# ------------------------------------------------------------------------------ pretrained weights
def _ffn_vit(seed: int = 0) -> TinyViT:
    torch.manual_seed(seed)
    vit = TinyViT(img_size=8, patch_size=2, embed_dim=16, depth=2)  # FFN r=4: hidden 64
    _randomize(vit, seed + 1)
    return vit


def test_replace_ffn_keeps_weights_at_the_original_ratio():
    ref = _ffn_vit()
    new = _ffn_vit()
    assert replace_ffn(new, keep_weights=True, hidden_ratio=4.0, n_instances=2) == 2
    for b_new, b_ref in zip(new.blocks, ref.blocks, strict=True):
        m, old = b_new.mlp, b_ref.mlp
        assert m.hidden == 64
        torch.testing.assert_close(m.fc1.weight, old.fc1.weight, rtol=0, atol=0)
        torch.testing.assert_close(m.fc1.bias, old.fc1.bias, rtol=0, atol=0)
        torch.testing.assert_close(m.fc2.weight[:, :64], old.fc2.weight, rtol=0, atol=0)
        torch.testing.assert_close(m.fc2.bias, old.fc2.bias, rtol=0, atol=0)
        assert m.fc2.weight.shape == (16, 3 * 64) and not m.fc2.weight[:, 64:].any()  # new paths start silent


def test_replace_ffn_keep_weights_reproduces_the_ffn_with_one_gelu_instance():
    ref = _ffn_vit()
    new = _ffn_vit()
    replace_ffn(new, keep_weights=True, hidden_ratio=None, n_instances=1, agelu_init="gelu", spatial=False)
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(new(x), ref(x))
    # with the spatial branch and zero new columns the function is unchanged too (its fc2 columns are 0)
    new2 = _ffn_vit()
    replace_ffn(new2, keep_weights=True, hidden_ratio=4.0, n_instances=1, agelu_init="gelu")
    torch.testing.assert_close(new2(x), ref(x))
    # without keep_weights it is a different function
    new3 = _ffn_vit()
    replace_ffn(new3, hidden_ratio=None, n_instances=1, agelu_init="gelu", spatial=False)
    assert not torch.allclose(new3(x), ref(x))


@pytest.mark.parametrize("ratio,kept", [(1.0, 16), (8.0, 64)])
def test_replace_ffn_keep_weights_other_widths(ratio, kept):
    ref = _ffn_vit()
    new = _ffn_vit()
    replace_ffn(new, keep_weights=True, new_fc2_columns="init", hidden_ratio=ratio, n_instances=2)
    m, old = new.blocks[0].mlp, ref.blocks[0].mlp
    assert m.hidden == int(ratio * 16)
    torch.testing.assert_close(m.fc1.weight[:kept], old.fc1.weight[:kept], rtol=0, atol=0)
    torch.testing.assert_close(m.fc2.weight[:, :kept], old.fc2.weight[:, :kept], rtol=0, atol=0)
    assert m.fc2.weight[:, kept:].abs().sum() > 0  # "init": the remaining columns keep their fresh init
    if m.hidden > kept:
        assert m.fc1.weight[kept:].abs().sum() > 0


def test_replace_ffn_argument_errors():
    with pytest.raises(ValueError, match="new_fc2_columns must be one of"):
        replace_ffn(_ffn_vit(), keep_weights=True, new_fc2_columns="ones")
    with pytest.raises(TypeError, match="keep_weights must be a bool"):
        replace_ffn(_ffn_vit(), keep_weights=1)
    with pytest.raises(ValueError, match="keep_weights needs the same in/out widths"):
        replace_ffn(_ffn_vit(), keep_weights=True, out_features=8)


# --------------------------------------------------------------------------- Swin-like / windows
class _SwinLikeBlock(nn.Module):
    """timm's SwinTransformerBlock FFN path: the FFN sees the whole stage map flattened to (B, H·W, C)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        x = x.reshape(b, -1, c)
        x = x + self.mlp(self.norm2(x))
        return x.reshape(b, h, w, c)


class _SwinLike(nn.Module):
    """No cls token and no ``num_prefix_tokens`` attribute, like timm's SwinTransformer."""

    def __init__(self, dim: int = 8, depth: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(*[_SwinLikeBlock(dim) for _ in range(depth)])])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[0](x)


def test_replace_ffn_on_a_swin_like_model_uses_no_prefix_tokens():
    torch.manual_seed(0)
    model = _SwinLike()
    assert replace_ffn(model, hidden_ratio=1.0) == 2
    assert all(b.mlp.num_prefix_tokens == 0 for b in model.layers[0])
    x = torch.randn(2, 4, 4, 8)
    y = model(x)
    # each block's IFFN on the flattened map equals IFFN on the channels-last map
    blk = model.layers[0][0]
    z = blk.norm2(x)
    torch.testing.assert_close(blk.mlp(z.reshape(2, 16, 8)).reshape(2, 4, 4, 8), blk.mlp(z))
    assert y.shape == x.shape
    # a non-square stage (2 x 8): the host cannot pass grid_size, so it is given at construction
    model2 = _SwinLike()
    replace_ffn(model2, hidden_ratio=1.0, grid_size=(2, 8))
    x2 = torch.randn(2, 2, 8, 8)
    blk2 = model2.layers[0][0]
    z2 = blk2.norm2(x2)
    torch.testing.assert_close(blk2.mlp(z2.reshape(2, 16, 8)).reshape(2, 2, 8, 8), blk2.mlp(z2))
    assert model2(x2).shape == x2.shape
    with pytest.raises(ValueError, match="grid_size"):  # the constructor's grid does not fit a 3x3 map
        model2(torch.randn(2, 3, 3, 8))
    # same cell count, other shape: the constructor's (2, 8) grid is used, not the square 4x4 inference
    z3 = blk2.norm2(torch.randn(2, 4, 4, 8)).reshape(2, 16, 8)
    torch.testing.assert_close(blk2.mlp(z3), blk2.mlp(z3, grid_size=(2, 8)))
    assert not torch.allclose(blk2.mlp(z3), blk2.mlp(z3, grid_size=(4, 4)))
    # explicit prefix-token counts still win; models with a cls token keep P = 1
    assert replace_ffn(_SwinLike(), num_prefix_tokens=0, hidden_ratio=1.0) == 2
    class _ClsOnly(nn.Module):  # a cls token but no num_prefix_tokens attribute: P is counted, = 1
        def __init__(self) -> None:
            super().__init__()
            self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
            self.blocks = nn.Sequential(_SwinLikeBlock(8))

    cls_model = _ClsOnly()
    replace_ffn(cls_model)
    assert cls_model.blocks[0].mlp.num_prefix_tokens == 1
    vit = TinyViT(img_size=8, patch_size=2, embed_dim=16, depth=1)  # timm's num_prefix_tokens attribute
    replace_ffn(vit)
    assert vit.blocks[0].mlp.num_prefix_tokens == 1


def test_window_tokens_without_prefix_stay_inside_their_window():
    """Windowed input (B·nW, ws², C) with P = 0: each window is its own ws×ws grid."""
    torch.manual_seed(0)
    m = IFFN(8, hidden_ratio=1.0, num_prefix_tokens=0)
    b, nw, ws = 2, 4, 3
    x = torch.randn(b * nw, ws * ws, 8)
    y = m(x)
    torch.testing.assert_close(y, m(x.reshape(b * nw, ws, ws, 8)).reshape(b * nw, ws * ws, 8))
    x2 = x.clone()
    x2[1] += 1.0  # perturb one window: no other window changes
    changed = (m(x2) - y).abs().amax(dim=(1, 2)) > 0
    assert changed.tolist() == [False, True] + [False] * (b * nw - 2)
    # the zero padding of the 3x3 conv is at each window's border: window 0 alone gives the same output
    torch.testing.assert_close(m(x[:1]), y[:1])


def test_constructor_grid_size():
    torch.manual_seed(0)
    m = IFFN(8, hidden_ratio=1.0, num_prefix_tokens=1, grid_size=(3, 5))
    x = torch.randn(2, 16, 8)
    torch.testing.assert_close(m(x), m(x, grid_size=(3, 5)))
    assert not torch.allclose(m(x), m(x, grid_size=(5, 3)))  # forward's grid_size takes precedence
    with pytest.raises(ValueError, match="grid_size must be two ints >= 1"):
        IFFN(8, grid_size=(3, 0))
    with pytest.raises(ValueError, match="grid_size must be two ints >= 1"):
        IFFN(8, grid_size=(3,))


# ----------------------------------------------------------------------------------- learned shifts
def test_agelu_shifts_and_spread():
    vit = _iffn_vit(agelu_shift=0.5)
    shifts = agelu_shifts(vit)
    assert list(shifts) == ["blocks.0.mlp.act", "blocks.1.mlp.act"]
    assert all(t.shape == (2, 16) for t in shifts.values())
    torch.testing.assert_close(shifts["blocks.0.mlp.act"][:, 0], torch.tensor([-0.5, 0.5]))
    assert len(agelu_shifts(vit, channel_only=False)) == 4
    spread = agelu_shift_spread(vit)
    assert spread["std"] == pytest.approx(0.5) and spread["moved_std"] == 0.0 and spread["n_values"] == 64
    assert spread["per_instance_mean"] == pytest.approx([-0.5, 0.5])
    # move the shifts by a known amount: c_k <- c_k + δ_j with δ = 0..15 / 10 on every layer
    delta = torch.arange(16.0) / 10
    with torch.no_grad():
        for b in vit.blocks:
            b.mlp.act.c.add_(delta.repeat(2))
    spread = agelu_shift_spread(vit)
    c = torch.cat([torch.tensor([-0.5, 0.5])[:, None] + delta] * 2, 1).double()
    assert spread["std"] == pytest.approx(float(c.std(unbiased=False)))
    assert spread["min"] == pytest.approx(-0.5) and spread["max"] == pytest.approx(2.0)
    assert spread["moved_max_abs"] == pytest.approx(1.5)
    assert spread["moved_std"] == pytest.approx(float(delta.double().std(unbiased=False)))
    assert spread["per_instance_std"] == pytest.approx([float(delta.double().std(unbiased=False))] * 2)
    # returned tensors are copies
    agelu_shifts(vit)["blocks.0.mlp.act"].zero_()
    assert vit.blocks[0].mlp.act.c.abs().sum() > 0
    assert agelu_shift_spread(TinyViT(img_size=8, patch_size=2, embed_dim=16, depth=1)) == {}
    fixed = build_vit("dwconv_gelu_r1", Config.quick(), "cpu")
    assert agelu_shifts(fixed) == {}  # fixed (buffer) activations are not learned shifts


# ---------------------------------------------------------------------------------- serial topology
def _reference_serial(m: IFFN, x: torch.Tensor, p: int) -> torch.Tensor:
    """Slow reference of fc1 -> DWConv (patch tokens) -> n AGeLU -> fc2 with explicit conv loops."""
    b, n, _ = x.shape
    side = int(round((n - p) ** 0.5))
    w, bias = m.dwconv.weight[:, 0], m.dwconv.bias
    u = x @ m.fc1.weight.T + m.fc1.bias
    a, b_, c, d = (m.act.per_instance(q) for q in "abcd")
    out = torch.zeros(b, n, m.out_features, dtype=x.dtype)
    for bi in range(b):
        for t in range(n):
            if t < p:
                s = u[bi, t]
            else:
                s = dwconv_at(u, w, bias, bi, t, p, side)
            h = torch.cat([a[q] * F.gelu(b_[q] * s + c[q]) + d[q] for q in range(m.n_instances)])
            out[bi, t] = m.fc2.weight @ h + m.fc2.bias
    return out


@pytest.mark.parametrize("p,k", [(1, 3), (0, 5)])
def test_serial_topology_matches_slow_reference(p, k):
    torch.manual_seed(0)
    m = IFFN(6, hidden_ratio=1.0, n_instances=2, kernel_size=k, num_prefix_tokens=p, topology="serial").double()
    _randomize(m, 2)
    assert m.fc2_in == 2 * 6 and not hasattr(m, "spatial_act")
    x = torch.randn(2, p + 16, 6, dtype=torch.float64)
    torch.testing.assert_close(m(x), _reference_serial(m, x, p))


def test_serial_topology_costs_gradients_and_identity_conv():
    torch.manual_seed(0)
    m = IFFN(16, hidden_ratio=1.0, n_instances=2, topology="serial", spatial_norm="bn").eval()
    x = torch.randn(3, 26, 16)
    assert count_flops(m, x) == m.flops(batch_size=3, num_tokens=26)
    assert m.num_params() == sum(t.numel() for t in m.parameters())
    m.train()
    m(x).square().sum().backward()
    assert m.dwconv.weight.grad.abs().sum() > 0 and m.act.c.grad.abs().sum() > 0
    # a 1x1 depthwise conv with weight 1 and bias 0 makes the serial IFFN the no-spatial IFFN
    s = IFFN(8, hidden_ratio=1.0, n_instances=2, kernel_size=1, topology="serial")
    plain = IFFN(8, hidden_ratio=1.0, n_instances=2, spatial=False)
    plain.load_state_dict({k: v for k, v in s.state_dict().items() if not k.startswith("dwconv")})
    with torch.no_grad():
        s.dwconv.weight.fill_(1.0)
        s.dwconv.bias.zero_()
    x = torch.randn(2, 17, 8)
    torch.testing.assert_close(s(x), plain(x))
    with pytest.raises(ValueError, match="topology must be one of"):
        IFFN(8, topology="stacked")



def test_replace_ffn_serial_topology_in_a_vit():
    torch.manual_seed(0)
    vit = TinyViT(img_size=8, patch_size=2, embed_dim=16, depth=2)
    assert replace_ffn(vit, hidden_ratio=1.0, n_instances=2, topology="serial") == 2
    for blk in vit.blocks:
        assert blk.mlp.topology == "serial" and blk.mlp.fc2_in == 2 * 16 and blk.mlp.num_prefix_tokens == 1
    tokens = torch.randn(1, 17, 16)
    flops = count_flops(vit.blocks[0].mlp, tokens)
    assert flops == vit.blocks[0].mlp.flops(batch_size=1, num_tokens=17) == 2 * (17 * 16 * 16 * 3 + 16 * 16 * 9)
    vit(torch.randn(2, 1, 8, 8)).sum().backward()
    assert vit.blocks[0].mlp.dwconv.weight.grad.abs().sum() > 0

# ---------------------------------------------------------------------------- 1-D token sequences, (1, k) kernel
def _reference_1d(m: IFFN, x: torch.Tensor, p: int) -> torch.Tensor:
    """Slow reference of both topologies on a (1, L) grid: a depthwise 1-D conv with zero padding, by loops."""
    b, n, _ = x.shape
    k = m.kernel_hw[1]
    r = k // 2
    w, bias = m.dwconv.weight[:, 0, 0], m.dwconv.bias
    u = x @ m.fc1.weight.T + m.fc1.bias
    conv = torch.zeros_like(u)
    for t in range(p, n):
        s = bias.clone()
        for dj in range(k):
            j = t - p + dj - r
            if 0 <= j < n - p:
                s = s + w[:, dj] * u[:, p + j]
        conv[:, t] = s
    a, b_, c, d = (m.act.per_instance(q) for q in "abcd")
    if m.topology == "serial":
        z = torch.where(torch.arange(n)[None, :, None] < p, u, conv)
        h = torch.cat([a[q] * F.gelu(b_[q] * z + c[q]) + d[q] for q in range(m.n_instances)], -1)
    else:
        h = torch.cat([a[q] * F.gelu(b_[q] * u + c[q]) + d[q] for q in range(m.n_instances)], -1)
        sa, sb, sc, sd = (m.spatial_act.per_instance(q)[0] for q in "abcd")
        hs = sa * F.gelu(sb * conv + sc) + sd
        hs[:, :p] = 0
        h = torch.cat([h, hs], -1)
    return h @ m.fc2.weight.T + m.fc2.bias


@pytest.mark.parametrize("topology", ["parallel", "serial"])
@pytest.mark.parametrize("p,k", [(1, 3), (0, 5)])
def test_one_dimensional_grid_matches_slow_reference_and_counter(topology, p, k):
    torch.manual_seed(0)
    L = 9
    m = IFFN(6, hidden_ratio=1.0, n_instances=2, kernel_size=(1, k), grid_size=(1, L), num_prefix_tokens=p,
             topology=topology).double()
    _randomize(m, 3)
    assert m.dwconv.weight.shape == (6, 1, 1, k) and m.kernel_hw == (1, k)
    assert m.fc2_in == (2 if topology == "serial" else 3) * 6
    x = torch.randn(2, p + L, 6, dtype=torch.float64)
    y = m(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, _reference_1d(m, x, p))
    # costs: the (1, k) kernel costs k MACs per hidden channel and patch token, not k^2
    assert count_flops(m, x) == m.flops(batch_size=2, num_tokens=p + L)
    dense = 2 * (p + L) * (6 * 6 + m.fc2_in * 6)
    assert m.flops(batch_size=1, num_tokens=p + L) == dense + 2 * L * 6 * k
    assert m.num_params() == sum(t.numel() for t in m.parameters())


def test_tuple_kernel_validation():
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        IFFN(8, kernel_size=(1, 4))
    with pytest.raises(ValueError, match="kernel_size must be an int or a pair"):
        IFFN(8, kernel_size=(1, 3, 3))
    with pytest.raises(ValueError, match="kernel_size must be an int >= 1"):
        IFFN(8, kernel_size=(0, 3))
    assert IFFN(8, kernel_size=3).kernel_hw == (3, 3)

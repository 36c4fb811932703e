"""Unit tests of AGeLU / IFFN: reference equivalences, cost formulas against FlopCounterMode, errors."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from icml24.common.nets import Mlp, TinyViT
from icml24.iffn import IFFN, AGeLU, count_flops, ffn_flops_per_token, ffn_num_params, replace_ffn
from tests.iffn._reference import dwconv_at

TIMM_MLP_ARGS = ["in_features", "hidden_features", "out_features", "act_layer", "norm_layer", "bias", "drop",
                 "use_conv"]


def _randomize(module: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


# ----------------------------------------------------------------------------------------------- AGeLU
@pytest.mark.parametrize("param_shape", ["channel", "scalar"])
def test_agelu_gelu_init_equals_gelu_exactly(param_shape):
    x = torch.randn(4, 7, 12) * 3
    act = AGeLU(12, param_shape=param_shape, init="gelu")
    torch.testing.assert_close(act(x), F.gelu(x), rtol=0, atol=0)
    act_n = AGeLU(12, n_instances=3, param_shape=param_shape, init="gelu")
    torch.testing.assert_close(act_n(x), torch.cat([F.gelu(x)] * 3, -1), rtol=0, atol=0)
    torch.testing.assert_close(AGeLU()(x), F.gelu(x), rtol=0, atol=0)  # timm act_layer() usage


def test_agelu_matches_per_instance_formula():
    torch.manual_seed(0)
    act = AGeLU(5, n_instances=3, init="shift")
    _randomize(act, 1)
    u = torch.randn(2, 9, 5)
    a, b, c, d = (act.per_instance(k) for k in "abcd")
    ref = torch.cat([a[k] * F.gelu(b[k] * u + c[k]) + d[k] for k in range(3)], -1)
    torch.testing.assert_close(act(u), ref)


def test_agelu_inits():
    shift = AGeLU(4, n_instances=3, init="shift", shift=0.5)
    torch.testing.assert_close(shift.per_instance("c")[:, 0], torch.tensor([-0.5, 0.0, 0.5]))
    torch.testing.assert_close(shift.per_instance("c"), shift.initial_shifts())
    torch.testing.assert_close(AGeLU(4, n_instances=1, init="shift").per_instance("c"), torch.zeros(1, 4))
    sign = AGeLU(4, n_instances=2, init="sign", shift=0.5)
    torch.testing.assert_close(sign.per_instance("b")[:, 0], torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(sign.per_instance("c"), torch.full((2, 4), 0.5))
    torch.testing.assert_close(sign.per_instance("c"), sign.initial_shifts())
    fixed = AGeLU(4, n_instances=2, init="shift", learnable=False)
    assert list(fixed.parameters()) == [] and {n for n, _ in fixed.named_buffers()} == {"a", "b", "c", "d"}


# ------------------------------------------------------------------------------------- equivalences
@pytest.mark.parametrize("use_ratio", [True, False])
def test_iffn_one_instance_no_spatial_equals_standard_ffn(use_ratio):
    torch.manual_seed(0)
    c = 16
    kw = {"hidden_ratio": 4.0} if use_ratio else {"hidden_ratio": None, "hidden_features": 4 * c}
    iffn = IFFN(c, n_instances=1, spatial=False, agelu_init="gelu", **kw)
    ffn = Mlp(c, 4 * c)
    iffn.fc1.load_state_dict(ffn.fc1.state_dict())
    iffn.fc2.load_state_dict(ffn.fc2.state_dict())
    x = torch.randn(3, 17, c)
    torch.testing.assert_close(iffn(x), ffn(x), rtol=0, atol=0)


def _reference_iffn(m: IFFN, x: torch.Tensor, p: int) -> torch.Tensor:
    """Slow per-token reference of the parallel IFFN (explicit depthwise convolution loops). concat: fc2 reads
    ``[H_1, ..., H_n, H_s]``; add: fc2 reads ``[H_1 + H_s, ..., H_n + H_s]`` (H_s joins every instance block at
    the same channel j)."""
    b, n, c = x.shape
    side = int(round((n - p) ** 0.5))
    w, bias = m.dwconv.weight[:, 0], m.dwconv.bias
    u = x @ m.fc1.weight.T + m.fc1.bias
    out = torch.zeros(b, n, m.out_features, dtype=x.dtype)
    for bi in range(b):
        for t in range(n):
            a, b_, c, d = (m.act.per_instance(q) for q in "abcd")
            hc = torch.cat([a[i] * F.gelu(b_[i] * u[bi, t] + c[i]) + d[i] for i in range(m.n_instances)])
            if t < p:
                hs = torch.zeros(m.hidden, dtype=x.dtype)
            else:
                s = dwconv_at(u, w, bias, bi, t, p, side)
                sa = m.spatial_act
                hs = sa.a * F.gelu(sa.b * s + sa.c) + sa.d
            if m.spatial_merge == "concat":
                h = torch.cat([hc, hs])
            else:  # instance k's channel j (fc2 input k·C' + j) gets spatial channel j
                cp = m.hidden
                h = torch.cat([hc[k * cp:(k + 1) * cp] + hs for k in range(m.n_instances)])
            out[bi, t] = m.fc2.weight @ h + m.fc2.bias
    return out


@pytest.mark.parametrize("p,k", [(1, 3), (0, 5), (2, 3)])
def test_iffn_matches_slow_reference(p, k):
    torch.manual_seed(0)
    m = IFFN(6, hidden_ratio=1.0, n_instances=2, kernel_size=k, num_prefix_tokens=p).double()
    _randomize(m, 2)
    x = torch.randn(2, p + 16, 6, dtype=torch.float64)
    torch.testing.assert_close(m(x), _reference_iffn(m, x, p))


@pytest.mark.parametrize("n", [2, 3])
def test_add_merge_channel_order_matches_slow_reference(n):
    """With n >= 2 the add merge's channel order matters: H_s must be added to channel j of *every* instance
    block (``repeat``), not spread over the blocks (``repeat_interleave``) nor added to one block only."""
    torch.manual_seed(0)
    m = IFFN(6, hidden_ratio=1.0, n_instances=n, spatial_merge="add", num_prefix_tokens=1).double()
    _randomize(m, 3)
    x = torch.randn(2, 1 + 9, 6, dtype=torch.float64)
    torch.testing.assert_close(m(x), _reference_iffn(m, x, 1))
    # the same through fc2's blocks: fc2(add) == sum_k W_k (H_k + H_s)
    u = m.fc1(x)
    g = u[:, 1:].transpose(1, 2).reshape(2, 6, 3, 3)
    hs = m.spatial_act(m.dwconv(g).flatten(2).transpose(1, 2))
    hs = torch.cat([hs.new_zeros(2, 1, 6), hs], dim=1)
    hc = m.act(u).unflatten(-1, (n, 6))
    blocks = m.fc2.weight.unflatten(1, (n, 6))  # (out, n, C')
    y = torch.einsum("onc,btnc->bto", blocks, hc + hs.unsqueeze(2)) + m.fc2.bias
    torch.testing.assert_close(m(x), y)


def test_add_merge_equals_concat_with_tied_fc2():
    """add: fc2(H_c + repeat(H_s)) == concat with fc2 weight [W, W] acting on [H_c, H_s] (n=1)."""
    torch.manual_seed(0)
    add = IFFN(8, hidden_ratio=1.0, n_instances=1, spatial_merge="add")
    cat = IFFN(8, hidden_ratio=1.0, n_instances=1, spatial_merge="concat")
    state = {k: v for k, v in add.state_dict().items() if not k.startswith("fc2")}
    cat.load_state_dict(state, strict=False)
    with torch.no_grad():
        cat.fc2.weight.copy_(torch.cat([add.fc2.weight, add.fc2.weight], 1))
        cat.fc2.bias.copy_(add.fc2.bias)
    x = torch.randn(2, 17, 8)
    torch.testing.assert_close(add(x), cat(x))


def test_channels_last_grid_equals_token_input():
    torch.manual_seed(0)
    m = IFFN(8, hidden_ratio=2.0, num_prefix_tokens=0)
    x = torch.randn(2, 3, 5, 8)  # non-square grid is fine in the (B, H, W, C) layout
    y = m(x)
    assert y.shape == (2, 3, 5, 8)
    torch.testing.assert_close(y.reshape(2, 15, 8), m(x.reshape(2, 15, 8), grid_size=(3, 5)))


def test_cls_tokens_bypass_spatial_branch_and_conv_is_local():
    torch.manual_seed(0)
    m = IFFN(8, hidden_ratio=1.0, n_instances=2, kernel_size=3, num_prefix_tokens=1)
    x = torch.randn(2, 17, 8)
    y = m(x)
    # cls output only depends on the cls input, and equals the channel path with a zero spatial part
    x2 = x.clone()
    x2[:, 1:] = torch.randn(2, 16, 8)
    torch.testing.assert_close(m(x2)[:, 0], y[:, 0], rtol=0, atol=0)
    hc = m.act(m.fc1(x[:, :1]))
    ref = m.fc2(torch.cat([hc, torch.zeros(2, 1, m.hidden)], -1))
    torch.testing.assert_close(y[:, :1], ref)
    # perturbing grid cell (0, 0) changes exactly its 3x3 neighbourhood: cells (0,0),(0,1),(1,0),(1,1)
    x3 = x.clone()
    x3[:, 1] += 1.0
    changed = (m(x3) - y).abs().amax(dim=(0, 2)) > 1e-6
    expected = torch.zeros(17, dtype=torch.bool)
    expected[[1, 2, 5, 6]] = True
    assert torch.equal(changed, expected)


def test_gradients_reach_agelu_params_and_dwconv():
    torch.manual_seed(0)
    m = IFFN(8, hidden_ratio=1.0, n_instances=2, spatial_norm="bn")
    m(torch.randn(4, 17, 8)).square().sum().backward()
    for name in ["act.a", "act.b", "act.c", "act.d", "spatial_act.a", "spatial_act.b", "spatial_act.c",
                 "spatial_act.d", "dwconv.weight", "dwconv.bias", "spatial_norm.weight", "fc1.weight"]:
        grad = m.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


# ------------------------------------------------------------------------------------------- costs
@pytest.mark.parametrize("cfg", [
    {"hidden_ratio": 1.0, "n_instances": 2},
    {"hidden_ratio": 1.5, "n_instances": 3, "spatial_merge": "add", "kernel_size": 5},
    {"hidden_ratio": 0.5, "n_instances": 1, "spatial": False},
    {"hidden_ratio": 2.0, "n_instances": 2, "num_prefix_tokens": 2, "spatial_norm": "bn", "param_shape": "scalar"},
    {"hidden_ratio": None, "hidden_features": 24, "n_instances": 2, "out_features": 10, "bias": False},
])
def test_flops_and_params_match_counter(cfg):
    m = IFFN(16, **cfg).eval()
    p = m.num_prefix_tokens
    n = p + 25
    x = torch.randn(3, n, 16)
    measured = count_flops(m, x)
    assert measured == m.flops(batch_size=3, num_tokens=n)
    assert m.flops_per_token(n) * 3 * n == pytest.approx(measured)
    if p == 0 or not m.spatial:
        assert m.flops_per_token() == pytest.approx(measured / (3 * n))
    assert m.num_params() == sum(t.numel() for t in m.parameters())


def test_cost_table_of_the_notes():
    """C=64 per-token MACs and params (paper notes' table): FFN r=4 32,768 MACs / 33,088 params; IFFN r=1 n=2
    concat 16,960 / 17,920; add 12,864 / 13,824; no spatial 12,288 / 12,928."""
    assert ffn_flops_per_token(in_features=64, hidden_features=256) == 2 * 32768
    assert ffn_num_params(in_features=64, hidden_features=256) == 33088
    for kw, macs, params in [({}, 16960, 17920), ({"spatial_merge": "add"}, 12864, 13824),
                             ({"spatial": False}, 12288, 12928)]:
        m = IFFN(64, hidden_ratio=1.0, n_instances=2, **kw)
        assert m.flops_per_token() == 2 * macs
        assert m.num_params() == params
    mlp = Mlp(64, 128)
    x = torch.randn(2, 17, 64)
    assert count_flops(mlp, x) == 2 * 17 * ffn_flops_per_token(in_features=64, hidden_features=128)
    assert sum(t.numel() for t in mlp.parameters()) == ffn_num_params(in_features=64, hidden_features=128)


# ------------------------------------------------------------------------------ drop-in / timm contract
def test_timm_mlp_signature_contract():
    params = list(inspect.signature(IFFN.__init__).parameters.values())[1:]
    assert [q.name for q in params[:8]] == TIMM_MLP_ARGS
    assert all(q.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for q in params[:8])
    assert all(q.kind is inspect.Parameter.KEYWORD_ONLY for q in params[8:])
    # timm's defaults (act_layer aside: AGeLU replaces it)
    defaults = {q.name: q.default for q in params[:8]}
    assert defaults == {"in_features": inspect.Parameter.empty, "hidden_features": None, "out_features": None,
                        "act_layer": None, "norm_layer": None, "bias": True, "drop": 0.0, "use_conv": False}
    # exactly the call of timm's vision_transformer.Block (with dd = device/dtype)
    layer = functools.partial(IFFN, hidden_ratio=1.0)
    m = layer(in_features=32, hidden_features=128, act_layer=nn.GELU, norm_layer=nn.LayerNorm, bias=True,
              drop=0.1, device="cpu", dtype=torch.float64)
    assert m.hidden == 32 and m.fc1.weight.dtype == torch.float64 and isinstance(m.norm, nn.LayerNorm)
    assert m.norm.normalized_shape == (m.fc2_in,)
    assert m(torch.randn(2, 17, 32, dtype=torch.float64)).shape == (2, 17, 32)
    assert IFFN(32, 128, hidden_ratio=None).hidden == 128  # hidden_ratio=None: use the host's width


def test_hidden_features_is_the_hidden_width_unless_the_ratio_says_otherwise():
    """timm's meaning: ``IFFN(64, 256)`` has hidden width 256 (as ``Mlp(64, 256)``); the paper's reduced ratio
    is asked for explicitly with ``hidden_ratio``."""
    m = IFFN(64, 256)
    assert m.hidden == 256 and m.fc1.out_features == 256 and m.hidden_ratio is None
    assert m.fc2.in_features == 256 * 3  # concat: 2 AGeLU instances + the spatial part
    assert IFFN(64).hidden == 64  # timm: hidden_features or in_features
    assert IFFN(64, 256, hidden_ratio=1.0).hidden == 64
    assert IFFN(64, 256, hidden_ratio=0.5).hidden == 32
    assert IFFN(in_features=64, hidden_features=256, n_instances=1, spatial=False).fc2.in_features == 256


def test_drop_pair_like_timm():
    m = IFFN(8, drop=(0.1, 0.3))
    assert (m.drop1.p, m.drop2.p) == (0.1, 0.3)
    m = IFFN(8, drop=0.2)
    assert (m.drop1.p, m.drop2.p) == (0.2, 0.2)
    with pytest.raises(ValueError, match="drop must be a float or a pair"):
        IFFN(8, drop=(0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match="drop must be in"):
        IFFN(8, drop=(0.1, 1.0))


@pytest.mark.parametrize("spatial", [True, False])
def test_use_conv_equals_channels_last_tokens(spatial):
    """``use_conv=True`` (timm's 1x1-conv Mlp): (B, C, H, W) in and out, fc1/fc2 are 1x1 convs, and the result
    equals the token form on the same grid with the same weights."""
    torch.manual_seed(0)
    conv = IFFN(8, 16, use_conv=True, n_instances=2, spatial=spatial, num_prefix_tokens=1).double()
    assert conv.num_prefix_tokens == 0 and isinstance(conv.fc1, nn.Conv2d) and conv.fc1.kernel_size == (1, 1)
    assert conv.fc1.weight.shape == (16, 8, 1, 1) and conv.fc2.weight.shape == (8, conv.fc2_in, 1, 1)
    tok = IFFN(8, 16, n_instances=2, spatial=spatial, num_prefix_tokens=0).double()
    _randomize(conv, 4)
    state = {k: (t.flatten(1) if k in ("fc1.weight", "fc2.weight") else t) for k, t in conv.state_dict().items()}
    tok.load_state_dict(state)
    x = torch.randn(2, 8, 3, 5, dtype=torch.float64)
    y = conv(x)
    assert y.shape == (2, 8, 3, 5)
    torch.testing.assert_close(y, tok(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
    assert count_flops(conv, x) == conv.flops(batch_size=2, num_tokens=15)
    with pytest.raises(ValueError, match=r"use_conv=True expects \(B, 8, H, W\)"):
        conv(torch.randn(2, 15, 8, dtype=torch.float64))


def test_use_conv_one_gelu_instance_equals_a_1x1_conv_mlp_and_norm_sees_channels_first():
    torch.manual_seed(0)
    m = IFFN(8, 32, use_conv=True, n_instances=1, spatial=False, agelu_init="gelu")
    fc1, fc2 = nn.Conv2d(8, 32, 1), nn.Conv2d(32, 8, 1)  # timm's Mlp(8, 32, use_conv=True)
    m.fc1.load_state_dict(fc1.state_dict())
    m.fc2.load_state_dict(fc2.state_dict())
    x = torch.randn(2, 8, 4, 4)
    # float32 rounding only: the two paths may take different CPU kernels (1.8e-7 apart on some CPUs)
    torch.testing.assert_close(m(x), fc2(F.gelu(fc1(x))), rtol=1e-5, atol=1e-6)
    bn = IFFN(8, 16, use_conv=True, norm_layer=nn.BatchNorm2d)  # a 2-d norm, as timm's conv hosts pass
    assert bn(x).shape == (2, 8, 4, 4) and bn.norm.num_features == bn.fc2_in


def test_drops_into_tiny_vit_and_replace_ffn():
    torch.manual_seed(0)
    vit = TinyViT(img_size=8, patch_size=2, embed_dim=32, depth=2,
                  mlp_layer=functools.partial(IFFN, hidden_ratio=1.0, n_instances=2))
    x = torch.randn(3, 1, 8, 8)
    vit(x).sum().backward()
    assert all(isinstance(b.mlp, IFFN) for b in vit.blocks)
    assert vit.blocks[0].mlp.act.a.grad is not None

    base = TinyViT(img_size=8, patch_size=2, embed_dim=32, depth=3)
    assert replace_ffn(base, hidden_ratio=0.5, n_instances=3, kernel_size=5) == 3
    assert all(isinstance(b.mlp, IFFN) and b.mlp.hidden == 16 and b.mlp.num_prefix_tokens == 1
               for b in base.blocks)
    assert base(x).shape == (3, 10)
    with pytest.raises(ValueError, match=r"3 FFN\(s\) already are IFFNs"):  # never a silent 0
        replace_ffn(base)

    # hidden_ratio=None keeps the old width; with one GeLU instance and copied weights logits are unchanged
    ref = TinyViT(img_size=8, patch_size=2, embed_dim=32, depth=2)
    new = TinyViT(img_size=8, patch_size=2, embed_dim=32, depth=2)
    new.load_state_dict(ref.state_dict())
    replace_ffn(new, hidden_ratio=None, n_instances=1, spatial=False, agelu_init="gelu")
    for b_new, b_ref in zip(new.blocks, ref.blocks, strict=True):
        b_new.mlp.fc1.load_state_dict(b_ref.mlp.fc1.state_dict())
        b_new.mlp.fc2.load_state_dict(b_ref.mlp.fc2.state_dict())
    torch.testing.assert_close(new(x), ref(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device():
    m = IFFN(16, hidden_ratio=1.0, device="cuda")
    y = m(torch.randn(2, 17, 16, device="cuda"))
    assert y.device.type == "cuda"
    assert count_flops(m, torch.randn(2, 17, 16, device="cuda")) == m.flops(batch_size=2, num_tokens=17)


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("kwargs,exc,match", [
    ({"hidden_ratio": 0.0}, ValueError, "hidden_ratio must be a finite number > 0"),
    ({"hidden_ratio": -1.0}, ValueError, "hidden_ratio must be a finite number > 0"),
    ({"hidden_ratio": float("nan")}, ValueError, "hidden_ratio must be a finite number > 0"),
    ({"hidden_ratio": "1"}, TypeError, "hidden_ratio must be a finite number > 0, got str"),
    ({"n_instances": 0}, ValueError, "n_instances must be an int >= 1"),
    ({"n_instances": 2.0}, TypeError, "n_instances must be an int >= 1, got float"),
    ({"kernel_size": 4}, ValueError, "kernel_size must be odd"),
    ({"kernel_size": 0}, ValueError, "kernel_size must be an int >= 1"),
    ({"num_prefix_tokens": -1}, ValueError, "num_prefix_tokens must be an int >= 0"),
    ({"spatial_merge": "sum"}, ValueError, "spatial_merge"),
    ({"spatial_norm": "ln"}, ValueError, "spatial_norm"),
    ({"agelu_init": "zero"}, ValueError, "init must be"),
    ({"drop": 1.0}, ValueError, "drop must be in"),
    ({"bias": (True,)}, ValueError, "bias must be"),
])
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        IFFN(16, **kwargs)


def test_forward_errors():
    m = IFFN(8, hidden_ratio=1.0, num_prefix_tokens=1)
    with pytest.raises(ValueError, match="not a perfect square"):
        m(torch.randn(2, 1 + 15, 8))
    with pytest.raises(ValueError, match="grid_size"):
        m(torch.randn(2, 1 + 16, 8), grid_size=(3, 4))
    with pytest.raises(ValueError, match="needs patch tokens"):
        m(torch.randn(2, 1, 8))
    with pytest.raises(ValueError, match="expected last dimension 8"):
        m(torch.randn(2, 17, 9))
    with pytest.raises(ValueError, match=r"needs \(B, N, C\)"):
        m(torch.randn(17, 8))
    with pytest.raises(ValueError, match="last dimension 5"):
        AGeLU(5)(torch.randn(3, 4))
    with pytest.raises(ValueError, match="num_tokens must be an int >= 1"):
        m.flops(batch_size=1, num_tokens=0)
    assert IFFN(8, spatial=False)(torch.randn(5, 8)).shape == (5, 8)  # no grid needed without the branch


def test_flops_of_channels_last_input_match_the_counter():
    m = IFFN(16, 16, hidden_ratio=1, n_instances=2, spatial=True)
    x = torch.randn(2, 4, 4, 16)  # (B, H, W, C): no prefix tokens
    assert count_flops(m, x) == m.flops(batch_size=2, num_tokens=16, num_prefix_tokens=0)
    assert count_flops(m, x) != m.flops(batch_size=2, num_tokens=16)  # the default assumes a cls token


@pytest.mark.parametrize("grid_size", [(-4, -4), (2.0, 8.0), (4,), "44"])
def test_bad_grid_size(grid_size):
    m = IFFN(16, 16, hidden_ratio=1, n_instances=2, spatial=True)
    with pytest.raises(ValueError, match="grid_size must be two ints >= 1"):
        m(torch.randn(2, 17, 16), grid_size=grid_size)

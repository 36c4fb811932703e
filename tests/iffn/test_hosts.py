"""IFFN in the hosts a user has: a timm-style block built with ``mlp_layer=IFFN`` (timm's exact call, re-written
here since timm cannot be installed), timm's 1x1-conv ``Mlp(use_conv=True)`` and Hugging Face's ``ViTModel``
(built from a tiny ``ViTConfig``, no hub) with its split ``intermediate``/``output`` FFN."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from icml24.common.nets import Attention
from icml24.iffn import IFFN, replace_ffn


class _TimmBlock(nn.Module):
    """timm's ``vision_transformer.Block`` skeleton: its ``mlp_layer(...)`` call verbatim (keywords, the
    ``scale_mlp_norm`` norm, ``proj_bias``/``proj_drop``, ``device``/``dtype``), LayerScale and the residuals."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, proj_bias: bool = True,
                 proj_drop: float = 0.0, init_values: float | None = 1e-5, scale_mlp_norm: bool = False,
                 act_layer=nn.GELU, norm_layer=nn.LayerNorm, mlp_layer=None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = norm_layer(dim, **dd)
        self.attn = Attention(dim, num_heads=num_heads).to(**{k: v for k, v in dd.items() if v is not None})
        self.ls1 = nn.Parameter(torch.full((dim,), init_values or 1.0, **dd))
        self.norm2 = norm_layer(dim, **dd)
        self.mlp = mlp_layer(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer,
                             norm_layer=norm_layer if scale_mlp_norm else None, bias=proj_bias, drop=proj_drop,
                             **dd)
        self.ls2 = nn.Parameter(torch.full((dim,), init_values or 1.0, **dd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1 * self.attn(self.norm1(x))
        return x + self.ls2 * self.mlp(self.norm2(x))


# ---------------------------------------------------------------------------------------------- timm block
def test_timm_block_with_mlp_layer_iffn():
    torch.manual_seed(0)
    blk = _TimmBlock(32, 4, mlp_layer=IFFN, proj_drop=0.1, scale_mlp_norm=True, dtype=torch.float64)
    m = blk.mlp
    assert isinstance(m, IFFN) and m.hidden == 128  # the host's int(dim * mlp_ratio), as timm's Mlp
    assert (m.drop1.p, m.drop2.p) == (0.1, 0.1) and isinstance(m.norm, nn.LayerNorm)
    assert m.fc1.weight.dtype == torch.float64
    x = torch.randn(2, 1 + 16, 32, dtype=torch.float64)
    blk(x).sum().backward()
    assert m.act.c.grad is not None and m.dwconv.weight.grad.abs().sum() > 0
    # the paper's reduced width: an explicit ratio
    red = _TimmBlock(32, 4, mlp_layer=functools.partial(IFFN, hidden_ratio=1.0))
    assert red.mlp.hidden == 32 and red(torch.randn(2, 17, 32)).shape == (2, 17, 32)


def test_timm_conv_mlp_host_use_conv():
    """ConvNeXt-style hosts build ``partial(Mlp, use_conv=True)(dim, int(mlp_ratio*dim), act_layer=...)`` and
    feed (B, C, H, W) maps."""
    layer = functools.partial(IFFN, use_conv=True)
    m = layer(16, 64, act_layer=nn.GELU)
    y = m(torch.randn(2, 16, 5, 7))
    assert y.shape == (2, 16, 5, 7) and m.hidden == 64


def test_replace_ffn_on_a_timm_conv_mlp():
    class _ConvMlp(nn.Module):  # timm's Mlp(16, 64, use_conv=True): 1x1 convs
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Conv2d(16, 64, 1), nn.GELU(), nn.Conv2d(64, 16, 1)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    host = nn.Module()
    host.mlp = _ConvMlp()
    torch.manual_seed(0)
    x = torch.randn(2, 16, 4, 4)
    ref = host.mlp(x)
    assert replace_ffn(host, keep_weights=True, n_instances=1, agelu_init="gelu", spatial=False) == 1
    assert isinstance(host.mlp, IFFN) and host.mlp.use_conv and host.mlp.hidden == 64
    torch.testing.assert_close(host.mlp(x), ref)


# ------------------------------------------------------------------------------------------------ HF ViT
def _hf_vit(seed: int = 0, **kw):
    transformers = pytest.importorskip("transformers", reason="transformers is the 'hf' extra")
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                 image_size=16, patch_size=4, num_channels=3, hidden_act="gelu",
                                 attn_implementation="eager", **kw)
    torch.manual_seed(seed)
    return transformers.ViTModel(cfg, add_pooling_layer=False).eval()


def test_replace_ffn_on_hf_vit_replaces_every_layer():
    vit = _hf_vit()
    assert replace_ffn(vit, hidden_ratio=1.0, n_instances=2) == 2
    for layer in vit.encoder.layer:
        m = layer.intermediate
        assert isinstance(m, IFFN) and m.hidden == 32 and m.out_features == 32
        assert m.num_prefix_tokens == 1  # HF's cls token, found on vit.embeddings
        assert isinstance(layer.output.dense, nn.Identity)  # output keeps dropout + residual
    x = torch.randn(2, 3, 16, 16)
    out = vit(pixel_values=x).last_hidden_state
    assert out.shape == (2, 1 + 16, 32)
    out.sum().backward()
    assert vit.encoder.layer[0].intermediate.dwconv.weight.grad.abs().sum() > 0
    # the default keeps the host width (intermediate_size)
    assert replace_ffn(_hf_vit(), style="hf") == 2


def test_replace_ffn_on_hf_vit_keep_weights_reproduces_the_model():
    ref = _hf_vit()
    new = _hf_vit()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = ref(pixel_values=x).last_hidden_state
    assert replace_ffn(new, keep_weights=True, n_instances=1, agelu_init="gelu", spatial=False) == 2
    with torch.no_grad():
        torch.testing.assert_close(new(pixel_values=x).last_hidden_state, want)
    # with the spatial branch and silent new columns the function is unchanged too
    new2 = _hf_vit()
    replace_ffn(new2, keep_weights=True, n_instances=2, agelu_init="gelu")
    with torch.no_grad():
        out2 = new2(pixel_values=x).last_hidden_state
    # instance 2 (init "gelu", silent fc2 columns) and the spatial part contribute 0
    torch.testing.assert_close(out2, want)


def test_replace_ffn_raises_when_nothing_is_replaced():
    vit = _hf_vit()
    with pytest.raises(ValueError, match="found nothing to replace in ViTModel: no `<block>.mlp`"):
        replace_ffn(vit, style="timm")
    with pytest.raises(ValueError, match="found nothing to replace in Sequential"):
        replace_ffn(nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4)))
    replace_ffn(vit, hidden_ratio=1.0)
    with pytest.raises(ValueError, match=r"2 FFN\(s\) already are IFFNs"):
        replace_ffn(vit)
    with pytest.raises(ValueError, match="style must be one of"):
        replace_ffn(vit, style="keras")


def test_replace_ffn_checks_everything_before_changing_the_model():
    vit = _hf_vit()
    before = {k: t.clone() for k, t in vit.state_dict().items()}
    with pytest.raises(ValueError, match="keep_weights needs the same in/out widths"):
        replace_ffn(vit, keep_weights=True, out_features=8)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        replace_ffn(vit, kernel_size=4)
    assert all(type(layer.intermediate).__name__ == "ViTIntermediate" for layer in vit.encoder.layer)
    after = vit.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)

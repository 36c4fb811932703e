"""Tiny networks shared by several papers: an MLP and a timm-style Vision Transformer.

The ViT follows timm's ``VisionTransformer`` layout and parameter names (``patch_embed.proj``, ``cls_token``,
``pos_embed``, ``blocks.i.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.act, mlp.fc2}``, ``norm``, ``head``)
and its ``mlp_layer`` slot contract: ``mlp_layer(in_features=, hidden_features=, act_layer=, norm_layer=,
bias=, drop=)``, so feed-forward replacements written for timm drop in unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from icml24.common import validate

__all__ = ["MLP", "Mlp", "Attention", "Block", "PatchEmbed", "TinyViT"]


class MLP(nn.Sequential):
    """Fully connected net ``in -> hidden[0] -> ... -> out`` with an activation between layers.

    Args:
        in_features: input width.
        hidden: hidden widths (may be empty: a linear model).
        out_features: output width.
        act_layer: activation module class (default ``nn.ReLU``).
        bias: whether linear layers have biases.
    """

    def __init__(self, *, in_features: int, hidden: Sequence[int], out_features: int,
                 act_layer: Callable[[], nn.Module] = nn.ReLU, bias: bool = True) -> None:
        validate.integer("MLP", "in_features", in_features, minimum=1)
        for i, h in enumerate(hidden):
            validate.integer("MLP", f"hidden[{i}]", h, minimum=1)
        validate.integer("MLP", "out_features", out_features, minimum=1)
        widths = [in_features, *hidden, out_features]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            layers.append(nn.Linear(a, b, bias=bias))
            if i < len(widths) - 2:
                layers.append(act_layer())
        super().__init__(*layers)


class ConvNet1D(nn.Module):
    """The MNIST-1D reference CNN (Greydanus & Kobak, 2020): three stride-2 ReLU convolutions and a linear head.

    Input ``(B, L)`` or ``(B, L, C)`` (channels last, as ``load_mnist1d(as_sequence=True)`` gives) or
    ``(B, C, L)`` with ``channels_last=False``. With the defaults (L = 40, 25 channels) it has the published
    architecture, which reaches ~94% test accuracy on MNIST-1D.
    """

    def __init__(self, *, length: int = 40, in_channels: int = 1, channels: int = 25, num_classes: int = 10,
                 channels_last: bool = True) -> None:
        super().__init__()
        for name, n in (("length", length), ("in_channels", in_channels), ("channels", channels),
                        ("num_classes", num_classes)):
            validate.integer("ConvNet1D", name, n, minimum=1)
        self.in_channels, self.channels_last = in_channels, channels_last
        self.features = nn.Sequential(
            nn.Conv1d(in_channels, channels, 5, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n = self.features(torch.zeros(1, in_channels, length)).shape[1]
        self.head = nn.Linear(n, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        elif self.channels_last:
            x = x.transpose(1, 2)
        if x.dim() != 3 or x.shape[1] != self.in_channels:
            raise ValueError(f"ConvNet1D: expected (B, L[, {self.in_channels}]) input, got {tuple(x.shape)}")
        return self.head(self.features(x))


class Mlp(nn.Module):
    """The standard transformer FFN ``fc2(drop(act(fc1 x)))`` with timm's ``Mlp`` constructor signature."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: Callable[[], nn.Module] = nn.GELU, norm_layer: Callable[[int], nn.Module] | None = None,
                 bias: bool = True, drop: float = 0.0, use_conv: bool = False) -> None:
        super().__init__()
        if use_conv:
            raise ValueError("Mlp: use_conv=True is not supported")
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class Attention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` projection (timm layout)."""

    def __init__(self, dim: int, num_heads: int = 4, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"Attention: dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attn = self.attn_drop(((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1))
        return self.proj_drop(self.proj((attn @ v).transpose(1, 2).reshape(b, n, c)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1 x)``, then ``x + mlp(norm2 x)``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 act_layer: Callable[[], nn.Module] = nn.GELU,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 mlp_layer: Callable[..., nn.Module] = Mlp, drop: float = 0.0) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, proj_drop=drop)
        self.norm2 = norm_layer(dim)
        self.mlp = mlp_layer(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer,
                             norm_layer=None, bias=True, drop=drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    """Non-overlapping patches -> tokens via a strided convolution; output ``(B, num_patches, dim)``."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"PatchEmbed: img_size ({img_size}) must be divisible by patch_size ({patch_size})")
        self.img_size, self.in_chans = img_size, in_chans
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expected = (self.in_chans, self.img_size, self.img_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"PatchEmbed: expected input of shape (B, {', '.join(map(str, expected))}), "
                             f"got {tuple(x.shape)}")
        return self.proj(x).flatten(2).transpose(1, 2)


class TinyViT(nn.Module):
    """A small ViT (cls token, learned positions, pre-norm blocks) for 8×8 digits and similar inputs.

    Args:
        img_size: side of the square input image.
        patch_size: side of a square patch; the token grid is ``img_size // patch_size`` squared.
        in_chans: input channels.
        num_classes: classifier outputs.
        embed_dim: token width ``d``.
        depth: number of blocks.
        num_heads: attention heads.
        mlp_ratio: FFN hidden width = ``mlp_ratio * d``.
        act_layer: FFN activation class (``nn.GELU``; ``nn.ReLU`` for SNN conversion).
        norm_layer: normalisation class taking the width.
        mlp_layer: FFN class with timm's ``mlp_layer`` signature.
        drop: dropout in the blocks.
    """

    num_prefix_tokens = 1

    def __init__(self, *, img_size: int = 8, patch_size: int = 2, in_chans: int = 1, num_classes: int = 10,
                 embed_dim: int = 32, depth: int = 2, num_heads: int = 4, mlp_ratio: float = 4.0,
                 act_layer: Callable[[], nn.Module] = nn.GELU,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 mlp_layer: Callable[..., nn.Module] = Mlp, drop: float = 0.0) -> None:
        super().__init__()
        validate.integer("TinyViT", "depth", depth, minimum=1)
        validate.positive("TinyViT", "mlp_ratio", mlp_ratio)
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, embed_dim) * 0.02)
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, mlp_ratio, act_layer=act_layer, norm_layer=norm_layer, mlp_layer=mlp_layer,
                  drop=drop) for _ in range(depth)])
        self.norm = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)
        nn.init.normal_(self.cls_token, std=0.02)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.norm(self.blocks(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x)[:, 0])

"""A small BERT-style text encoder (token embedding + learned positions + pre-norm blocks with a key mask).

Built from the shared ``common.nets`` blocks so that :func:`icml24.spikezip_tf.quantize` and
:func:`icml24.spikezip_tf.convert` treat it exactly like the tiny ViT. The first token plays the role of
BERT's ``[CLS]`` and feeds the classifier head. No pretrained weights are loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v
from icml24.common.nets import Attention, Block, Mlp
from icml24.spikezip_tf.qann import additive_mask, check_mask

__all__ = ["MaskedAttention", "TextBlock", "TinyTextEncoder"]


class MaskedAttention(Attention):
    """``common.nets.Attention`` with an optional key-padding mask ``(B, N)`` (bool, or nonzero = attend)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        check_mask(mask, b, n)
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = (q * self.scale) @ k.transpose(-2, -1)
        m = additive_mask(mask, scores.dtype)
        if m is not None:
            scores = scores + m
        attn = self.attn_drop(F.softmax(scores, dim=-1))
        return self.proj_drop(self.proj((attn @ v).transpose(1, 2).reshape(b, n, c)))


class TextBlock(Block):
    """``common.nets.Block`` whose attention takes the key mask."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 act_layer: Callable[[], nn.Module] = nn.ReLU,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm, drop: float = 0.0) -> None:
        super().__init__(dim, num_heads, mlp_ratio, qkv_bias, act_layer=act_layer, norm_layer=norm_layer,
                         mlp_layer=Mlp, drop=drop)
        self.attn = MaskedAttention(dim, num_heads=num_heads, qkv_bias=qkv_bias, proj_drop=drop)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask=mask)
        return x + self.mlp(self.norm2(x))


class TinyTextEncoder(nn.Module):
    """Token ids ``(B, N)`` (+ key mask ``(B, N)``, True = real token) -> class logits ``(B, num_classes)``.

    ``h = LN(E[ids] + P[:N])``, then ``depth`` pre-norm blocks, a final LN, and ``head(h[:, 0])``.

    Args:
        vocab_size: number of token ids.
        max_len: longest sequence (size of the position table).
        num_classes: classifier outputs.
        embed_dim: token width ``d``.
        depth: number of blocks.
        num_heads: attention heads.
        mlp_ratio: FFN hidden width = ``mlp_ratio * d``.
        act_layer: FFN activation (``nn.ReLU`` for SNN conversion).
        norm_eps: LayerNorm epsilon.
    """

    def __init__(self, *, vocab_size: int, max_len: int, num_classes: int, embed_dim: int = 32, depth: int = 2,
                 num_heads: int = 4, mlp_ratio: float = 4.0, act_layer: Callable[[], nn.Module] = nn.ReLU,
                 norm_eps: float = 1e-6) -> None:
        super().__init__()
        for k, n in dict(vocab_size=vocab_size, max_len=max_len, num_classes=num_classes, embed_dim=embed_dim,
                         depth=depth, num_heads=num_heads).items():
            v.integer("TinyTextEncoder", k, n, minimum=1)
        norm = partial(nn.LayerNorm, eps=norm_eps)
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab_size, embed_dim)
        self.pos_embed = nn.Parameter(torch.randn(1, max_len, embed_dim) * 0.02)
        self.emb_norm = norm(embed_dim)
        self.blocks = nn.ModuleList([TextBlock(embed_dim, num_heads, mlp_ratio, act_layer=act_layer,
                                               norm_layer=norm) for _ in range(depth)])
        self.norm = norm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() != 2:
            raise ValueError(f"TinyTextEncoder: ids must have shape (B, N), got {tuple(ids.shape)}")
        if ids.shape[1] > self.max_len:
            raise ValueError(f"TinyTextEncoder: sequence length {ids.shape[1]} > max_len {self.max_len}")
        return self.tok_embed(ids) + self.pos_embed[:, : ids.shape[1]]

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.emb_norm(self.embed(ids))
        for blk in self.blocks:
            h = blk(h, mask=mask)
        return self.head(self.norm(h)[:, 0])

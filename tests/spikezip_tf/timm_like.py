"""A stand-in for timm's ``VisionTransformer`` (timm itself must not be installed here): the same module names,
attributes and forward structure (``patch_embed.proj``, ``cls_token``, ``pos_embed``, ``pos_drop``,
``patch_drop``, ``norm_pre``, ``blocks.i.{norm1, attn.{qkv, q_norm, k_norm, attn_drop, proj, proj_drop}, ls1,
drop_path1, norm2, mlp.{fc1, act, drop1, norm, fc2, drop2}, ls2, drop_path2}``, ``norm``, ``fc_norm``,
``head_drop``, ``head``; fused SDPA attention), but none of ``icml24.common.nets``' classes, so that
``quantize``/``convert`` must recognise it by structure."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PatchEmbed(nn.Module):
    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class Attention(nn.Module):
    fused_attn = True

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(self.q_norm(q), self.k_norm(k), v, attn_mask=attn_mask)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, c)))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act_layer: type[nn.Module]) -> None:
        super().__init__()
        self.fc1, self.act, self.drop1 = nn.Linear(dim, hidden), act_layer(), nn.Dropout(0.0)
        self.norm, self.fc2, self.drop2 = nn.Identity(), nn.Linear(hidden, dim), nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, act_layer: type[nn.Module]) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.ls1, self.drop_path1 = nn.Identity(), nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim, act_layer)
        self.ls2, self.drop_path2 = nn.Identity(), nn.Identity()

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class VisionTransformer(nn.Module):
    def __init__(self, *, img_size: int = 8, patch_size: int = 2, in_chans: int = 1, num_classes: int = 10,
                 embed_dim: int = 16, depth: int = 2, num_heads: int = 2, act_layer: type[nn.Module] = nn.ReLU,
                 global_pool: str = "token") -> None:
        super().__init__()
        self.global_pool, self.no_embed_class, self.num_prefix_tokens = global_pool, False, 1
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
        self.reg_token = None
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, embed_dim) * 0.02)
        self.pos_drop, self.patch_drop, self.norm_pre = nn.Dropout(0.0), nn.Identity(), nn.Identity()
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, act_layer) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.fc_norm, self.head_drop = nn.Identity(), nn.Dropout(0.0)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm_pre(self.patch_drop(self.pos_drop(x)))
        return self.norm(self.blocks(x))

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, self.num_prefix_tokens:].mean(dim=1) if self.global_pool == "avg" else x[:, 0]
        return self.head(self.head_drop(self.fc_norm(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

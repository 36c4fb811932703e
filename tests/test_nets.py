"""Shared tiny networks: TinyViT shapes, attention against a reference, input validation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from icml24.common.nets import MLP, Attention, TinyViT


def test_attention_matches_scaled_dot_product_reference():
    torch.manual_seed(0)
    attn = Attention(16, num_heads=4).eval()
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).reshape(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
    ref = attn.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attn(x), ref)


def test_attention_dropout_acts_on_probabilities():
    """Dropout zeroes attention probabilities (timm), it does not rescale the softmax's logits."""
    torch.manual_seed(0)
    attn = Attention(8, num_heads=1, attn_drop=0.999999).train()
    x = torch.randn(1, 4, 8)
    # every probability dropped: the output is the projection's bias alone
    torch.testing.assert_close(attn(x), attn.proj.bias.expand(1, 4, 8))


def test_tiny_vit_shapes_and_bad_input():
    model = TinyViT(num_classes=7, embed_dim=16, depth=1, num_heads=2)
    assert model(torch.rand(3, 1, 8, 8)).shape == (3, 7)
    with pytest.raises(ValueError, match=r"expected input of shape \(B, 1, 8, 8\)"):
        model(torch.rand(3, 1, 9, 9))
    with pytest.raises(ValueError, match="depth must be an int >= 1"):
        TinyViT(depth=0)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        TinyViT(embed_dim=10, num_heads=4)


def test_mlp_widths():
    assert MLP(in_features=4, hidden=[8], out_features=2)(torch.randn(5, 4)).shape == (5, 2)
    with pytest.raises(ValueError, match=r"hidden\[0\] must be an int >= 1"):
        MLP(in_features=4, hidden=[0], out_features=2)

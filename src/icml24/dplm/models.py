"""ESM-style backbones built from a ``transformers.EsmConfig`` (random init, no download), and their features.

The same code takes real weights: ``transformers.EsmForMaskedLM.from_pretrained(path)`` (ESM-2, or a DPLM
checkpoint converted to the HF layout) is a valid ``net`` for :class:`~icml24.dplm.diffusion.DiffusionProteinLM`.
"""

from __future__ import annotations

import torch
from torch import nn

from icml24.common import validate as v
from icml24.dplm.tokens import MASK, PAD, VOCAB


def build_esm(*, hidden: int = 64, layers: int = 2, heads: int = 4, intermediate: int | None = None,
              max_length: int = 1024, causal: bool = False, dropout: float = 0.1) -> nn.Module:
    """A randomly initialised ``EsmForMaskedLM`` over the ESM-2 alphabet (rotary positions).

    ``token_dropout=False``: ESM-2's mask-ratio rescaling of the embeddings would explode at the near-100% mask
    ratios of diffusion training (notes §2.3). ``causal=True`` gives the autoregressive baseline of equal size
    (``is_decoder=True``: HF's ESM then uses a causal attention mask).
    """
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - hf is a core test dependency
        raise ImportError("icml24.dplm needs transformers: pip install 'icml24[hf]'") from e
    for name, x in (("hidden", hidden), ("layers", layers), ("heads", heads), ("max_length", max_length)):
        v.integer("build_esm", name, x, minimum=1)
    if hidden % heads:
        raise ValueError(f"build_esm: hidden ({hidden}) must be divisible by heads ({heads})")
    cfg = transformers.EsmConfig(
        vocab_size=len(VOCAB), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=intermediate or 4 * hidden, position_embedding_type="rotary", token_dropout=False,
        pad_token_id=PAD, mask_token_id=MASK, max_position_embeddings=max_length + 2, is_decoder=causal,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=0.0)
    if causal:
        transformers.logging.set_verbosity_error()  # the "is_decoder=False for bi-directional" hint is intended
    return transformers.EsmForMaskedLM(cfg)


def max_residues(net: nn.Module) -> int | None:
    """Longest protein the network's config allows (max positions − ``<cls>``/``<eos>``), if it says."""
    cfg = getattr(net, "config", None)
    m = getattr(cfg, "max_position_embeddings", None)
    return None if m is None else int(m) - 2


@torch.no_grad()
def residue_features(net: nn.Module, tokens: torch.Tensor, *, batch_size: int = 256) -> torch.Tensor:
    """Frozen last-layer hidden states at the residue positions, (B, L, d) for tokens (B, L + 2)."""
    was = net.training
    net.eval()
    out = []
    for i in range(0, len(tokens), batch_size):
        x = tokens[i:i + batch_size]
        h = net(input_ids=x, attention_mask=(x != PAD).long(), output_hidden_states=True).hidden_states[-1]
        out.append(h[:, 1:-1])
    net.train(was)
    return torch.cat(out)

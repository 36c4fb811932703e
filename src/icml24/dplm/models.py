"""ESM-style backbones built from a ``transformers.EsmConfig`` (random init, no download), and their features.

The same code takes real weights: ``transformers.EsmForMaskedLM.from_pretrained(path)`` (ESM-2, or a DPLM
checkpoint converted to the HF layout) is a valid ``net`` for :class:`~icml24.dplm.diffusion.DiffusionProteinLM`.
"""

from __future__ import annotations

from typing import Any

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


def network_config(net: nn.Module) -> Any | None:
    """The Hugging Face config of ``net`` or of its first submodule that has one (a DPLM wrapper, an adapter)."""
    for m in net.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "vocab_size"):
            return cfg
    return None


def check_vocabulary(owner: str, net: nn.Module) -> None:
    """Refuse, before any compute, a network whose token ids are not the ESM-2 alphabet's.

    Everything here indexes logits and embeddings by ESM-2 ids (33 tokens, ``<pad>`` 1, ``<mask>`` 32): a
    network with another vocabulary would otherwise fail deep inside (an ``IndexError`` on the logits) or,
    worse, run on the wrong tokens. Checks the config's ``vocab_size`` / ``pad_token_id`` / ``mask_token_id``
    and the input-embedding matrix, where the network has them; a plain module with neither passes (the
    sampler then checks the width of its first logits).
    """
    cfg = network_config(net)
    if cfg is not None:
        if cfg.vocab_size != len(VOCAB):
            raise ValueError(f"{owner}: the network's vocabulary has {cfg.vocab_size} tokens; dplm needs the "
                             f"ESM-2 alphabet of {len(VOCAB)} (icml24.dplm.tokens.VOCAB)")
        for name, want in (("pad_token_id", PAD), ("mask_token_id", MASK)):
            got = getattr(cfg, name, None)
            if got is not None and got != want:
                raise ValueError(f"{owner}: the network's config has {name}={got}; the ESM-2 alphabet's is {want}")
        if getattr(cfg, "token_dropout", False) and getattr(cfg, "mask_token_id", None) is None:
            raise ValueError(f"{owner}: the network uses token_dropout but its config has no mask_token_id "
                             f"(ESM-2's is {MASK})")
    for m in net.modules():
        try:
            emb = m.get_input_embeddings() if callable(getattr(m, "get_input_embeddings", None)) else None
        except (NotImplementedError, AttributeError):
            emb = None
        if isinstance(emb, nn.Embedding):
            if emb.num_embeddings != len(VOCAB):
                raise ValueError(f"{owner}: the network's input embeddings have {emb.num_embeddings} rows; dplm "
                                 f"needs the ESM-2 alphabet of {len(VOCAB)} tokens")
            break


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

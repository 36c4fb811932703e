"""Structure-conditioned generation through an adapter on a frozen DPLM (the paper's inverse-folding recipe,
official ``cond_dplm.py`` / ``dplm_adapter.py``), with a per-residue structure string as the condition.

The adapter reads the frozen network's last hidden states h, cross-attends to embedded structure tokens
(3-state secondary structure, with learned positions) and adds a feed-forward block, both residual::

    h' = h + CrossAttn(LN(h), S, S);   h'' = h' + FFN(LN(h'));   logits = lm_head(h'')

Only the adapter trains, with the same reweighted diffusion loss as DPLM.

NOTE(deviation): the official adapter replaces the last transformer layer by a copy of it plus cross-attention
to GVP-Transformer structure features; here the new block sits after the last layer (the frozen network is left
whole) and the condition is a structure string, not 3-D coordinates.
"""

from __future__ import annotations

import torch
from torch import nn

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.dplm.diffusion import diffusion_loss, q_sample
from icml24.dplm.tokens import PAD

OWNER = "dplm.adapter"


class StructureAdapter(nn.Module):
    """A frozen HF masked LM (``.esm`` body + ``.lm_head``, e.g. ``EsmForMaskedLM``) plus a trainable adapter.

    Args:
        net: the pretrained DPLM network; its parameters are frozen here.
        n_structure: number of structure classes (3 for H/E/C); one extra id marks ``<cls>``/``<eos>`` slots.
        max_length: longest protein (residues) the structure embedding covers.
        heads: attention heads of the cross-attention.
    """

    def __init__(self, net: nn.Module, *, n_structure: int = 3, max_length: int = 1024, heads: int = 4) -> None:
        super().__init__()
        v.integer(OWNER, "n_structure", n_structure, minimum=1)
        v.integer(OWNER, "max_length", max_length, minimum=1)
        if not (hasattr(net, "esm") and hasattr(net, "lm_head")):
            raise TypeError(f"{OWNER}: net must be an EsmForMaskedLM-like model with .esm and .lm_head")
        self.net = net
        for p in net.parameters():
            p.requires_grad_(False)
        d = net.config.hidden_size
        self.n_structure = n_structure
        self.adapter_structure = nn.Embedding(n_structure + 1, d)
        self.adapter_position = nn.Embedding(max_length + 2, d)
        self.adapter_ln1, self.adapter_ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.adapter_cross = nn.MultiheadAttention(d, heads, batch_first=True)
        self.adapter_ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        nn.init.zeros_(self.adapter_ffn[-1].weight)
        nn.init.zeros_(self.adapter_ffn[-1].bias)
        nn.init.zeros_(self.adapter_cross.out_proj.weight)  # starts as the identity on the frozen model

    def structure_tokens(self, structure: torch.Tensor) -> torch.Tensor:
        """Per-residue classes (B, L) -> (B, L + 2) with the special id at the ``<cls>``/``<eos>`` slots."""
        v.tensor(OWNER, "structure", structure, ndim=2)
        if structure.numel() and (structure.min() < 0 or structure.max() >= self.n_structure):
            raise ValueError(f"{OWNER}: structure classes must lie in 0..{self.n_structure - 1}")
        edge = torch.full((len(structure), 1), self.n_structure, dtype=torch.long, device=structure.device)
        return torch.cat([edge, structure.long(), edge], 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                structure: torch.Tensor) -> torch.Tensor:
        s_tok = self.structure_tokens(structure)
        if s_tok.shape != input_ids.shape:
            raise ValueError(f"{OWNER}: structure must have one class per residue: tokens {tuple(input_ids.shape)} "
                             f"need structure of shape {(input_ids.shape[0], input_ids.shape[1] - 2)}, "
                             f"got {tuple(structure.shape)}")
        h = self.net.esm(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pos = torch.arange(s_tok.shape[1], device=s_tok.device)
        s = self.adapter_structure(s_tok) + self.adapter_position(pos)
        h = h + self.adapter_cross(self.adapter_ln1(h), s, s, need_weights=False)[0]
        h = h + self.adapter_ffn(self.adapter_ln2(h))
        return self.net.lm_head(h)

    def conditioned_on(self, structure: torch.Tensor) -> nn.Module:
        """A module ``(input_ids, attention_mask) -> logits`` for the samplers, with the structure bound."""
        return _Bound(self, structure)


class _Bound(nn.Module):
    def __init__(self, adapter: StructureAdapter, structure: torch.Tensor) -> None:
        super().__init__()
        self.adapter, self.structure = adapter, structure

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.adapter(input_ids, attention_mask, structure=self.structure)


def train_adapter(adapter: StructureAdapter, tokens: torch.Tensor, structure: torch.Tensor, *, steps: int,
                  batch_size: int = 32, lr: float = 1e-3, num_timesteps: int = 100,
                  generator: torch.Generator | None = None) -> list[float]:
    """Train the adapter's parameters only, with the reweighted diffusion loss (official: T = 100, lr 1e-3)."""
    v.integer(OWNER, "steps", steps, minimum=1)
    params = [p for n, p in adapter.named_parameters() if n.startswith("adapter_")]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=1e-4)
    adapter.train()
    adapter.net.eval()
    losses = []
    for _ in progress(range(steps), desc="structure adapter"):
        idx = torch.randint(len(tokens), (batch_size,), generator=generator)
        x0 = tokens[idx]
        t = torch.randint(1, num_timesteps + 1, (batch_size,), generator=generator)
        xt, mask = q_sample(x0, t, num_timesteps, generator=generator)
        logits = adapter(xt, (x0 != PAD).long(), structure=structure[idx])
        loss = diffusion_loss(logits, x0, mask, t, num_timesteps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    adapter.eval()
    return losses

"""Absorbing-state discrete diffusion for protein LMs (DPLM §3; official ``byprot/models/lm/dplm.py``), and the
two baselines' objectives on the same backbone: masked LM (ESM-2, 15% with 80/10/10) and autoregressive LM.

Forward process (``q_sample``): t ~ U{1..T} per sequence; every maskable token (not ``<cls>``/``<pad>``/``<eos>``,
not a motif position) becomes ``<mask>`` independently with probability t/T.

Reweighted loss (official ``RDMCrossEntropyLoss`` with ``weight: linear``)::

    loss = Σ_{b,i} CE_{b,i} · w(t_b) · m_{b,i} / Σ_{b,i} m_{b,i},     w(t) = (T − (t − 1)) / T

over masked positions m only, normalised by the number of masked tokens in the batch.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v
from icml24.dplm.tokens import AA_IDS, MASK, SPECIAL_IDS

OWNER = "dplm"


def maskable_positions(tokens: torch.Tensor, partial_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean (B, L): positions that noise may touch (not special tokens, not ``partial_mask``, e.g. a motif)."""
    keep = torch.zeros_like(tokens, dtype=torch.bool)
    for s in SPECIAL_IDS:
        keep |= tokens == s
    if partial_mask is not None:
        keep |= partial_mask
    return ~keep


def q_sample(tokens: torch.Tensor, t: torch.Tensor, num_timesteps: int, *, partial_mask: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x_t: each maskable token replaced by ``<mask>`` with probability t/T. Returns (x_t, mask (B, L) bool)."""
    p = (t.to(torch.float32) / num_timesteps).unsqueeze(1)
    u = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    mask = (u < p) & maskable_positions(tokens, partial_mask)
    return tokens.masked_fill(mask, MASK), mask


def loss_weight(t: torch.Tensor, num_timesteps: int, weighting: Literal["linear", "constant"] = "linear"
                ) -> torch.Tensor:
    """w(t) = (T − (t − 1)) / T ("linear", the official default) or 1 ("constant")."""
    if weighting == "constant":
        return torch.ones_like(t, dtype=torch.float32)
    return (num_timesteps - (t.to(torch.float32) - 1)) / num_timesteps


def diffusion_loss(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, t: torch.Tensor,
                   num_timesteps: int, weighting: Literal["linear", "constant"] = "linear") -> torch.Tensor:
    """The reweighted cross-entropy over masked positions, normalised by the batch's masked-token count."""
    ce = F.cross_entropy(logits.transpose(1, 2).float(), tokens, reduction="none")
    w = loss_weight(t, num_timesteps, weighting).unsqueeze(1)
    m = mask.to(ce.dtype)
    return (ce * w * m).sum() / m.sum().clamp_min(1.0)


def mlm_inputs(tokens: torch.Tensor, *, prob: float = 0.15, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """ESM-2's masked-LM corruption: select ``prob`` of maskable tokens; of those 80% ``<mask>``, 10% a random
    amino acid, 10% unchanged. Returns (inputs, selected (B, L) bool)."""
    u = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    selected = (u < prob) & maskable_positions(tokens)
    r = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    aa = AA_IDS.to(tokens.device)
    random_aa = aa[torch.randint(len(aa), tokens.shape, generator=generator, device=tokens.device)]
    out = torch.where(selected & (r < 0.8), torch.full_like(tokens, MASK), tokens)
    return torch.where(selected & (r >= 0.8) & (r < 0.9), random_aa, out), selected


def masked_ce(logits: torch.Tensor, tokens: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the selected positions (the MLM loss)."""
    ce = F.cross_entropy(logits.transpose(1, 2).float(), tokens, reduction="none")
    return (ce * selected).sum() / selected.sum().clamp_min(1)


def next_token_ce(logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Autoregressive loss: logits at i predict token i + 1 (``<pad>`` targets ignored)."""
    target = tokens[:, 1:]
    if attention_mask is not None:
        target = target.masked_fill(attention_mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), target, ignore_index=-100)


def logits_of(net: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of a Hugging Face masked/causal LM (``.logits``) or of a plain module returning a tensor."""
    if inputs_embeds is not None:
        out = net(inputs_embeds=inputs_embeds, attention_mask=attention_mask)
    else:
        out = net(input_ids=input_ids, attention_mask=attention_mask)
    return out.logits if hasattr(out, "logits") else out


class DiffusionProteinLM(nn.Module):
    """DPLM: a bidirectional masked-LM network trained as an absorbing discrete diffusion model.

    Args:
        net: any network with ``net(input_ids=..., attention_mask=...)`` returning logits over the ESM-2
            alphabet (a ``transformers.EsmForMaskedLM`` built from a config, or real ESM-2/DPLM weights).
        num_timesteps: T of the forward process (500 in the official pretraining configs).
        weighting: w(t), ``"linear"`` (official default) or ``"constant"``.

    Example::

        dplm = DiffusionProteinLM(build_esm(hidden=64, layers=2), num_timesteps=500)
        loss = dplm.loss(encode(["MKTAYIAK", "GSSGSSG"]))
        samples = generate(dplm, length=32, num_samples=4, max_iter=32)
    """

    def __init__(self, net: nn.Module, *, num_timesteps: int = 500,
                 weighting: Literal["linear", "constant"] = "linear") -> None:
        super().__init__()
        self.net = net
        self.num_timesteps = v.integer(OWNER, "num_timesteps", num_timesteps, minimum=1)
        self.weighting = v.one_of(OWNER, "weighting", weighting, ("linear", "constant"))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return logits_of(self.net, input_ids, attention_mask, inputs_embeds)

    def loss(self, tokens: torch.Tensor, *, partial_mask: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """One Monte-Carlo estimate of the reweighted diffusion loss on a batch of clean token ids (B, L)."""
        v.tensor(OWNER, "tokens", tokens, ndim=2)
        t = torch.randint(1, self.num_timesteps + 1, (tokens.shape[0],), generator=generator, device=tokens.device)
        x_t, mask = q_sample(tokens, t, self.num_timesteps, partial_mask=partial_mask, generator=generator)
        attn = (tokens != SPECIAL_IDS[1]).long()
        return diffusion_loss(self(x_t, attn), tokens, mask, t, self.num_timesteps, self.weighting)

"""Training loops for the three objectives on one backbone: diffusion (DPLM), masked LM, autoregressive LM.

Every objective sees the same sequences in the same order for the same number of steps (equal tokens seen).
Optimiser as the official configs: AdamW, betas (0.9, 0.98), weight decay 0.01, linear warmup then linear decay.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.dplm.diffusion import DiffusionProteinLM, logits_of, masked_ce, mlm_inputs, next_token_ce
from icml24.dplm.tokens import PAD

Objective = Literal["diffusion", "mlm", "ar"]
OBJECTIVES: tuple[str, ...] = ("diffusion", "mlm", "ar")


def objective_loss(net: nn.Module, tokens: torch.Tensor, objective: Objective, *, num_timesteps: int = 500,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """One stochastic estimate of ``objective``'s training loss on clean tokens (B, L)."""
    attn = (tokens != PAD).long()
    if objective == "diffusion":
        return DiffusionProteinLM(net, num_timesteps=num_timesteps).loss(tokens, generator=generator)
    if objective == "mlm":
        x, selected = mlm_inputs(tokens, generator=generator)
        return masked_ce(logits_of(net, x, attn), tokens, selected)
    return next_token_ce(logits_of(net, tokens, attn), tokens, attn)


def train_lm(net: nn.Module, tokens: torch.Tensor, *, objective: Objective, steps: int, batch_size: int, lr: float,
             warmup: int = 100, weight_decay: float = 0.01, num_timesteps: int = 500,
             generator: torch.Generator | None = None) -> list[float]:
    """Train ``net`` in place on ``tokens`` (N, L) with ``objective``; returns the per-step training losses."""
    v.one_of("train_lm", "objective", objective, OBJECTIVES)
    v.integer("train_lm", "steps", steps, minimum=1)
    v.integer("train_lm", "batch_size", batch_size, minimum=1)
    v.positive("train_lm", "lr", lr)
    v.integer("train_lm", "warmup", warmup, minimum=0)
    if batch_size > len(tokens):
        raise ValueError(f"train_lm: batch_size {batch_size} exceeds the {len(tokens)} training sequences")
    opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / max(warmup, 1), max(0.0, (steps - s) / max(steps - warmup, 1))))
    net.train()
    losses = []
    perm = torch.randperm(len(tokens), generator=generator)
    pos = 0
    for _ in progress(range(steps), desc=f"train {objective}"):
        if pos + batch_size > len(perm):
            perm, pos = torch.randperm(len(tokens), generator=generator), 0
        batch = tokens[perm[pos:pos + batch_size]]
        pos += batch_size
        loss = objective_loss(net, batch, objective, num_timesteps=num_timesteps, generator=generator)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    net.eval()
    return losses


@torch.no_grad()
def validation_loss(net: nn.Module, tokens: torch.Tensor, objective: Objective, *, num_timesteps: int = 500,
                    repeats: int = 4, batch_size: int = 256, seed: int = 0) -> float:
    """Mean of ``objective``'s own loss on held-out tokens, with fixed noise (``repeats`` draws per sequence)."""
    net.eval()
    g = torch.Generator().manual_seed(seed)
    total = []
    for _ in range(repeats if objective != "ar" else 1):
        for i in range(0, len(tokens), batch_size):
            total.append(float(objective_loss(net, tokens[i:i + batch_size], objective,
                                              num_timesteps=num_timesteps, generator=g)))
    return sum(total) / len(total)


@torch.no_grad()
def autoregressive_nll(net: nn.Module, tokens: torch.Tensor, *, batch_size: int = 256) -> torch.Tensor:
    """Exact per-residue NLL (nats) of each sequence under a causal LM, residue positions only (no ``<eos>``)."""
    net.eval()
    out = []
    for i in range(0, len(tokens), batch_size):
        x = tokens[i:i + batch_size]
        logp = torch.log_softmax(logits_of(net, x, (x != PAD).long()).float(), -1)
        nll = -logp[:, :-2].gather(-1, x[:, 1:-1].unsqueeze(-1)).squeeze(-1)
        out.append(nll.mean(1))
    return torch.cat(out)


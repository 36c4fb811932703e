"""DPLM's iterative decoder (official ``generate`` / ``_reparam_decoding``, strategy
"reparam-uncond-deterministic-linear") and the left-to-right sampler of the autoregressive baseline.

Reparameterised decoding, per step s = 1..S, on every row::

    logits = net(x);   logits[{mask, X, specials, ...}] = −inf;   (+ η ∇_onehot log p_φ(y | x) with guidance)
    cand = argmax(logits + Gumbel);  score = log_softmax(logits + Gumbel)[cand]      (exact T = 1 sampling)
    k_s = floor(n · (1 − s/S))                       positions left masked after step s (linear schedule)
    low = the k_s lowest scores among generated positions (decoded ones included: "uncond" re-masking)
    x[masked & ~low] = cand;  x[low] = <mask>

Fixed positions (``partial_mask``, e.g. a motif) are never masked or changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.dplm.diffusion import OWNER, logits_of, maskable_positions
from icml24.dplm.models import check_vocabulary
from icml24.dplm.tokens import AA_IDS, CLS, EOS, MASK, NEVER_SAMPLED, TOKEN_ID, VOCAB, validate_sequence

GuidanceFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def schedule(n: torch.Tensor, step: int, max_iter: int) -> torch.Tensor:
    """k_s = floor(n (1 − s/S)): how many generated positions stay masked after step s (linear schedule)."""
    return torch.floor(n.to(torch.float64) * (1.0 - step / max_iter)).to(torch.long)


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32).clamp_(1e-10, 1 - 1e-10)
    return -torch.log(-torch.log(u))


def _resample_repeats(cand: torch.Tensor, logits: torch.Tensor, gen_pos: torch.Tensor, ratio: float,
                      generator: torch.Generator | None) -> torch.Tensor:
    """Redraw the positions holding a residue that fills more than ``ratio`` of a row, from top-p 0.95 + Gumbel.

    NOTE(deviation): the official safeguard re-masks those tokens and runs the network once more; here they are
    redrawn from the same step's logits (no second forward pass), the frequency counted over generated positions.
    """
    counts = torch.zeros(cand.shape[0], logits.shape[-1], device=cand.device)
    counts.scatter_add_(1, cand, gen_pos.to(counts.dtype))
    limit = ratio * gen_pos.sum(1, keepdim=True).clamp_min(1)
    hot = counts > limit
    redo = hot.gather(1, cand) & gen_pos
    if not redo.any():
        return cand
    probs = torch.softmax(logits, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > 0.95
    nucleus = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, ~drop)
    masked_logits = logits.masked_fill(~nucleus, float("-inf"))
    redraw = (masked_logits + gumbel_like(masked_logits, generator)).argmax(-1)
    return torch.where(redo, redraw, cand)


def _checked_width(logits: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] != len(VOCAB):
        raise ValueError(f"{OWNER}: the model's logits have {logits.shape[-1]} classes; dplm needs the ESM-2 "
                         f"alphabet of {len(VOCAB)} tokens")
    return logits


@torch.no_grad()
def reparam_decode(model: nn.Module, init: torch.Tensor, *, partial_mask: torch.Tensor | None = None,
                   max_iter: int = 500, strategy: Literal["gumbel_argmax", "vanilla", "argmax"] = "gumbel_argmax",
                   temperature: float = 1.0, resample_ratio: float | None = 0.25, guidance: GuidanceFn | None = None,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Decode ``init`` (token ids with ``<mask>`` where residues are to be generated) into full sequences.

    Args:
        model: a network mapping ``(input_ids, attention_mask)`` to logits (DPLM or the MLM baseline).
        init: (B, L) token ids; every maskable position (not special, not ``partial_mask``) is generated.
        partial_mask: (B, L) bool, positions kept fixed (motif scaffolding).
        max_iter: S, decoding steps (official default 500).
        strategy: ``gumbel_argmax`` (official default; T = 1 sampling, ``temperature`` ignored as in the
            official code), ``vanilla`` (categorical at ``temperature``) or ``argmax`` (deterministic).
        resample_ratio: the repeat safeguard's frequency threshold (official 0.25); None disables it.
        guidance: ``fn(x, logits) -> delta`` added to the logits at every step (classifier guidance).
    """
    v.tensor(OWNER, "init", init, ndim=2)
    v.integer(OWNER, "max_iter", max_iter, minimum=1)
    v.one_of(OWNER, "strategy", strategy, ("gumbel_argmax", "vanilla", "argmax"))
    v.positive(OWNER, "temperature", temperature)
    if resample_ratio is not None:
        v.probability(OWNER, "resample_ratio", resample_ratio, open_low=True)
    check_vocabulary(OWNER, model)
    gen_pos = maskable_positions(init, partial_mask)
    x = init.masked_fill(gen_pos, MASK)
    attn = torch.ones_like(x)
    n = gen_pos.sum(1)
    is_masked = gen_pos.clone()
    banned = torch.tensor(NEVER_SAMPLED, device=x.device)
    for step in progress(range(1, max_iter + 1), desc="dplm decode"):
        logits = _checked_width(logits_of(model, x, attn)).float()
        if guidance is not None:
            with torch.enable_grad():
                logits = logits + guidance(x, logits)
        logits[..., banned] = float("-inf")
        if strategy == "gumbel_argmax":
            noisy = logits + gumbel_like(logits, generator)
        elif strategy == "vanilla":
            noisy = logits / temperature + gumbel_like(logits, generator)
        else:
            noisy = logits
        cand = noisy.argmax(-1)
        if resample_ratio is not None and strategy != "argmax":
            cand = _resample_repeats(cand, logits, gen_pos, resample_ratio, generator)
        score = torch.log_softmax(noisy, -1).gather(-1, cand.unsqueeze(-1)).squeeze(-1)
        k = schedule(n, step, max_iter)
        rank_score = score.masked_fill(~gen_pos, float("inf"))
        rank = rank_score.argsort(dim=1, stable=True).argsort(dim=1)
        low = (rank < k.unsqueeze(1)) & gen_pos
        newly = is_masked & ~low
        x = torch.where(newly, cand, x).masked_fill(low, MASK)
        is_masked = low
    return x


def masked_init(num_samples: int, length: int, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[<cls>] + <mask> * length + [<eos>]`` for ``num_samples`` rows."""
    x = torch.full((num_samples, length + 2), MASK, dtype=torch.long, device=device)
    x[:, 0], x[:, -1] = CLS, EOS
    return x


def scaffold_init(motif: str, *, length: int, start: int, num_samples: int, device: torch.device | str = "cpu"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked rows of ``length`` residues with ``motif`` fixed at residue index ``start``; returns (init, partial_mask)."""
    validate_sequence("scaffold_init", motif)
    v.integer("scaffold_init", "length", length, minimum=1)
    if len(motif) > length:
        raise ValueError(f"scaffold_init: motif of length {len(motif)} is longer than the requested length {length}")
    v.integer("scaffold_init", "start", start, minimum=0)
    if start + len(motif) > length:
        raise ValueError(f"scaffold_init: motif at start {start} runs past the end (start + {len(motif)} > {length})")
    x = masked_init(num_samples, length, device=device)
    pm = torch.zeros_like(x, dtype=torch.bool)
    for j, a in enumerate(motif):
        x[:, 1 + start + j] = TOKEN_ID[a]
        pm[:, 1 + start + j] = True
    return x, pm


def generate(model: nn.Module, *, length: int, num_samples: int, max_iter: int | None = None,
             max_length: int | None = None, device: torch.device | str = "cpu", **kwargs) -> torch.Tensor:
    """Unconditional generation of ``num_samples`` proteins of ``length`` residues (token ids, (B, length + 2)).

    ``max_iter`` defaults to ``length`` (one net unmasking per step); other keywords go to :func:`reparam_decode`.
    """
    v.integer(OWNER, "length", length, minimum=1)
    if max_length is not None and length > max_length:
        raise ValueError(f"{OWNER}: length {length} exceeds the model's maximum {max_length}")
    v.integer(OWNER, "num_samples", num_samples, minimum=1)
    return reparam_decode(model, masked_init(num_samples, length, device=device),
                          max_iter=length if max_iter is None else max_iter, **kwargs)


@torch.no_grad()
def generate_autoregressive(net: nn.Module, *, length: int, num_samples: int, temperature: float = 1.0,
                            generator: torch.Generator | None = None, device: torch.device | str = "cpu"
                            ) -> torch.Tensor:
    """Left-to-right sampling from a causal LM over the 20 amino acids (the AR baseline), (B, length + 2)."""
    v.integer(OWNER, "length", length, minimum=1)
    v.integer(OWNER, "num_samples", num_samples, minimum=1)
    v.positive(OWNER, "temperature", temperature)
    check_vocabulary(OWNER, net)
    aa = AA_IDS.to(device)
    x = torch.full((num_samples, 1), CLS, dtype=torch.long, device=device)
    for _ in range(length):
        logits = _checked_width(logits_of(net, x, torch.ones_like(x)))[:, -1, aa].float() / temperature
        nxt = aa[(logits + gumbel_like(logits, generator)).argmax(-1)]
        x = torch.cat([x, nxt.unsqueeze(1)], 1)
    return torch.cat([x, torch.full((num_samples, 1), EOS, dtype=torch.long, device=device)], 1)

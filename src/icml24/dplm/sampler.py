"""DPLM's iterative decoder (official ``generate`` / ``_reparam_decoding``, strategy
"reparam-uncond-deterministic-linear") and the left-to-right sampler of the autoregressive baseline.

Reparameterised decoding, per step s = 1..S, on every row::

    logits = net(x);   logits[banned] = −inf;   (+ η ∇_onehot log p_φ(y | x) with guidance)
    gumbel_argmax: cand = argmax(logits + G);  score = log_softmax(logits + G)[cand]     (exact T = 1 sampling)
    vanilla:       cand ~ Cat(softmax(logits / T));  score = log_softmax(logits / T)[cand]
    argmax:        score, cand = max(logits)                                          (raw logits, as official)
    k_s = ⌊n (S − s) / S⌋                          positions left masked after step s (linear schedule)
    low = {generated i : score_i < the (k_s + 1)-th smallest score}  (decoded ones included: "uncond" re-masking)
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
from icml24.dplm.tokens import (
    AA_IDS,
    CLS,
    EOS,
    MASK,
    NEVER_SAMPLED,
    OFFICIAL_NEVER_SAMPLED,
    TOKEN_ID,
    VOCAB,
    validate_sequence,
)

GuidanceFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def schedule(n: torch.Tensor, step: int, max_iter: int) -> torch.Tensor:
    """k_s = ⌊n (S − s) / S⌋: how many generated positions stay masked after step s (linear schedule).

    NOTE(deviation): exact integer arithmetic. The official ``(n.float() * (1 - s / S)).long()`` rounds in
    float32 and is one below the formula in 346 of the 646,400 cases n ≤ 128, S ≤ 100, 1 ≤ s ≤ S (e.g.
    n = S = 22, s = 9: 12, not 13); float64 ``floor(n (1 − s/S))`` (this function before issue 28) was one
    below in 3,249 (n = S = 24, s = 10: 13, not 14).
    """
    return (n.to(torch.long) * (max_iter - step)) // max_iter


def lowest_k(score: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The official deterministic ``topk_masking``: candidates whose score is strictly below the row's
    (k + 1)-th smallest candidate score (non-candidates count as +inf). Exactly k positions without ties;
    tied scores at the cutoff stay unmasked, so ties mask fewer."""
    s = score.masked_fill(~candidates, float("inf"))
    cutoff = s.sort(dim=-1).values.gather(-1, k.clamp_max(s.shape[-1] - 1).unsqueeze(-1))
    return (s < cutoff) & candidates


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32).clamp_(1e-10, 1 - 1e-10)
    return -torch.log(-torch.log(u))


def _resample_repeats(cand: torch.Tensor, score: torch.Tensor, logits: torch.Tensor, gen_pos: torch.Tensor,
                      ratio: float, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Redraw the positions holding a residue that fills more than ``ratio`` of a row, from top-p 0.95 + Gumbel;
    a redrawn position's score is the redraw's log_softmax(filtered logits + Gumbel) (as official).

    NOTE(deviation): the official safeguard re-masks those tokens and runs the network once more; here they are
    redrawn from the same step's logits (no second forward pass), the frequency counted over generated positions.
    """
    counts = torch.zeros(cand.shape[0], logits.shape[-1], device=cand.device)
    counts.scatter_add_(1, cand, gen_pos.to(counts.dtype))
    limit = ratio * gen_pos.sum(1, keepdim=True).clamp_min(1)
    hot = counts > limit
    redo = hot.gather(1, cand) & gen_pos
    if not redo.any():
        return cand, score
    probs = torch.softmax(logits, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > 0.95
    nucleus = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, ~drop)
    masked_logits = logits.masked_fill(~nucleus, float("-inf"))
    noisy = masked_logits + gumbel_like(masked_logits, generator)
    redraw_score, redraw = torch.log_softmax(noisy, -1).max(-1)
    return torch.where(redo, redraw, cand), torch.where(redo, redraw_score, score)


def _checked_width(logits: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] != len(VOCAB):
        raise ValueError(f"{OWNER}: the model's logits have {logits.shape[-1]} classes; dplm needs the ESM-2 "
                         f"alphabet of {len(VOCAB)} tokens")
    return logits


@torch.no_grad()
def reparam_decode(model: nn.Module, init: torch.Tensor, *, partial_mask: torch.Tensor | None = None,
                   max_iter: int = 500, strategy: Literal["gumbel_argmax", "vanilla", "argmax"] = "gumbel_argmax",
                   temperature: float = 1.0, resample_ratio: float | None = 0.25, guidance: GuidanceFn | None = None,
                   residues_only: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Decode ``init`` (token ids with ``<mask>`` where residues are to be generated) into full sequences.

    Args:
        model: a network mapping ``(input_ids, attention_mask)`` to logits (DPLM or the MLM baseline).
        init: (B, L) token ids; every maskable position (not special, not ``partial_mask``) is generated.
        partial_mask: (B, L) bool, positions kept fixed (motif scaffolding).
        max_iter: S, decoding steps (official default 500).
        strategy: ``gumbel_argmax`` (official default; T = 1 sampling, ``temperature`` ignored as in the
            official code; confidence log_softmax(logits + G)[cand]), ``vanilla`` (categorical at
            ``temperature``; confidence log_softmax(logits / T)[cand], the official ``Categorical.log_prob``)
            or ``argmax`` (deterministic; confidence the raw maximum logit, as official).
        resample_ratio: the repeat safeguard's frequency threshold (official 0.25); None disables it. As in the
            official code it acts only under ``gumbel_argmax``.
        guidance: ``fn(x, logits) -> delta`` added to the logits at every step (classifier guidance).
        residues_only: never emit a token outside the 20 amino acids (13 ids banned). False bans only the
            official 5 (``<mask>``, ``X``, ``<pad>``, ``<cls>``, ``<eos>``), so ``<unk>``, B, U, Z, O, ``.``,
            ``-`` and ``<null_1>`` can be emitted.

    NOTE(deviation): ``residues_only=True`` (the default) bans 13 ids where the official decoder bans 5: this
    package's oracles (the grammar's likelihood and posteriors, ``tokens_to_residue_ids``) and validators are
    defined over the 20 amino acids only; a trained network gives the 8 extra ids ~0 probability anyway.
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
    banned = torch.tensor(NEVER_SAMPLED if residues_only else OFFICIAL_NEVER_SAMPLED, device=x.device)
    for step in progress(range(1, max_iter + 1), desc="dplm decode"):
        logits = _checked_width(logits_of(model, x, attn)).float()
        if guidance is not None:
            with torch.enable_grad():
                logits = logits + guidance(x, logits)
        logits[..., banned] = float("-inf")
        if strategy == "gumbel_argmax":
            score, cand = torch.log_softmax(logits + gumbel_like(logits, generator), -1).max(-1)
            if resample_ratio is not None:
                cand, score = _resample_repeats(cand, score, logits, gen_pos, resample_ratio, generator)
        elif strategy == "vanilla":
            # a Gumbel-max draw from Categorical(softmax(logits / T)), ranked by that distribution's log-prob
            scaled = logits / temperature
            cand = (scaled + gumbel_like(scaled, generator)).argmax(-1)
            score = torch.log_softmax(scaled, -1).gather(-1, cand.unsqueeze(-1)).squeeze(-1)
        else:
            score, cand = logits.max(-1)
        low = lowest_k(score, gen_pos, schedule(n, step, max_iter))
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

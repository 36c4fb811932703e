"""Representations of a pretrained protein LM: frozen-feature probes and fine-tuning (DPLM §4.3, issue item 4).

Two tasks, each in two ways, identical for every pretrained network (DPLM, masked LM, autoregressive LM):

* per-residue secondary structure (3 classes; labels −1 are ignored), and
* sequence classification (e.g. antimicrobial vs other peptides from ``modlamp``), on features mean-pooled over
  the residue positions h̄ = (1/L) Σ_i h_i of the last layer.

Frozen probe: a standardised logistic regression on the frozen features. Fine-tuning: a copy of the network plus
a linear head, all trained with cross-entropy (AdamW, linear warmup/decay, a small lr, a fixed step budget); the
pretrained network itself is left untouched. The paper fine-tunes with the SaProt pipeline (notes §2.6.4).
"""

from __future__ import annotations

import copy
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.dplm.tokens import PAD, SPECIAL_IDS

OWNER = "dplm.represent"
Task = Literal["residue", "sequence"]


def residue_mask(tokens: torch.Tensor) -> torch.Tensor:
    """Boolean (B, L): residue positions (not ``<cls>``/``<eos>``/``<pad>``/other special tokens)."""
    keep = torch.ones_like(tokens, dtype=torch.bool)
    for s in SPECIAL_IDS:
        keep &= tokens != s
    return keep


def _last_hidden(net: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return net(input_ids=tokens, attention_mask=(tokens != PAD).long(), output_hidden_states=True).hidden_states[-1]


def _pool(h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    m = residue_mask(tokens).unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp_min(1.0)


@torch.no_grad()
def pooled_features(net: nn.Module, tokens: torch.Tensor, *, batch_size: int = 256) -> torch.Tensor:
    """Frozen last-layer features mean-pooled over each sequence's residues: (B, d) for tokens (B, L + 2)."""
    v.tensor(OWNER, "tokens", tokens, ndim=2)
    was = net.training
    net.eval()
    out = [_pool(_last_hidden(net, x), x) for x in tokens.split(batch_size)]
    net.train(was)
    return torch.cat(out)


def linear_probe_accuracy(f_train: np.ndarray, y_train: np.ndarray, f_test: np.ndarray, y_test: np.ndarray) -> float:
    """Accuracy (%) of a standardised logistic-regression probe fit on (f_train, y_train)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len(f_train) != len(y_train) or len(f_test) != len(y_test):
        raise ValueError(f"{OWNER}: features and labels must have the same length")
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(f_train, y_train)
    return float((clf.predict(f_test) == y_test).mean() * 100)


class FineTuned(nn.Module):
    """A (copied) pretrained network with a linear head on its last hidden states.

    ``task="residue"``: logits (B, L, C) at the residue positions of tokens (B, L + 2);
    ``task="sequence"``: logits (B, C) from the residue-mean-pooled features.
    """

    def __init__(self, net: nn.Module, *, n_classes: int, task: Task) -> None:
        super().__init__()
        v.one_of(OWNER, "task", task, ("residue", "sequence"))
        v.integer(OWNER, "n_classes", n_classes, minimum=2)
        self.net, self.task = net, task
        self.head = nn.Linear(net.config.hidden_size, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = _last_hidden(self.net, tokens)
        return self.head(_pool(h, tokens) if self.task == "sequence" else h[:, 1:-1])


def fine_tune(net: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, *, task: Task, n_classes: int,
              lr: float, steps: int, batch_size: int = 32, warmup: int = 10, weight_decay: float = 0.01,
              generator: torch.Generator | None = None) -> FineTuned:
    """Fine-tune a copy of ``net`` with a new linear head; every parameter trains (``net`` is not modified).

    Args:
        net: a pretrained backbone (``EsmForMaskedLM``-like, with ``config.hidden_size``).
        tokens: token ids (N, L + 2).
        labels: (N, L) per-residue classes for ``task="residue"`` (−1 = ignore), or (N,) for ``"sequence"``.
        lr: peak AdamW lr (linear warmup for ``warmup`` steps, then linear decay to 0 at ``steps``).
        steps: optimiser steps of batch ``batch_size`` (the same budget for every backbone).
    """
    v.tensor(OWNER, "tokens", tokens, ndim=2)
    v.one_of(OWNER, "task", task, ("residue", "sequence"))
    want = (len(tokens), tokens.shape[1] - 2) if task == "residue" else (len(tokens),)
    if tuple(labels.shape) != want:
        raise ValueError(f"{OWNER}: labels must have shape {want} for task {task!r} and tokens "
                         f"{tuple(tokens.shape)}, got {tuple(labels.shape)}")
    v.positive(OWNER, "lr", lr)
    v.integer(OWNER, "steps", steps, minimum=1)
    v.integer(OWNER, "batch_size", batch_size, minimum=1)
    v.integer(OWNER, "warmup", warmup, minimum=0)
    model = FineTuned(copy.deepcopy(net), n_classes=n_classes, task=task).to(tokens.device)
    for p in model.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / max(warmup, 1), max(0.0, (steps - s) / max(steps - warmup, 1))))
    labels = labels.to(tokens.device)
    model.train()
    bs = min(batch_size, len(tokens))
    perm, pos = torch.randperm(len(tokens), generator=generator), 0
    for _ in progress(range(steps), desc=f"fine-tune {task}"):
        if pos + bs > len(perm):
            perm, pos = torch.randperm(len(tokens), generator=generator), 0
        idx = perm[pos:pos + bs]
        pos += bs
        logits = model(tokens[idx])
        loss = F.cross_entropy(logits.reshape(-1, n_classes), labels[idx].reshape(-1), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


@torch.no_grad()
def fine_tuned_accuracy(model: FineTuned, tokens: torch.Tensor, labels: torch.Tensor, *,
                        batch_size: int = 256) -> float:
    """Accuracy (%) of a fine-tuned model on (tokens, labels); labels −1 are ignored."""
    model.eval()
    pred = torch.cat([model(x).argmax(-1) for x in tokens.split(batch_size)]).cpu()
    y = labels.cpu()
    keep = y >= 0
    return float((pred[keep] == y[keep]).float().mean() * 100)

"""Plug-and-play classifier guidance toward secondary structure (DPLM §4; the official code is unreleased).

A per-residue secondary-structure head p_φ(y_i | x_t) is trained on the frozen DPLM's last hidden states of
*noised* inputs x_t (random t), so it can read partially masked sequences. Guidance is first-order
(DiGress-style, notes §2.6): with one-hot inputs,

    log p_φ(y | x_{t−1}) ≈ log p_φ(y | x_t) + ⟨∇_{x_t} log p_φ(y | x_t), x_{t−1} − x_t⟩

so the guided logits are ``logits + η · ∇_{onehot(x_t)} Σ_i log p_φ(y_i | x_t)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.dplm.diffusion import q_sample
from icml24.dplm.tokens import PAD, VOCAB

OWNER = "dplm.guidance"


def _embedding_matrix(net: nn.Module) -> torch.Tensor:
    return net.get_input_embeddings().weight


def _hidden(net: nn.Module, *, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None
            ) -> torch.Tensor:
    out = net(input_ids=input_ids, inputs_embeds=inputs_embeds, output_hidden_states=True)
    return out.hidden_states[-1]


def train_structure_head(net: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, *, n_classes: int = 3,
                         steps: int = 300, batch_size: int = 64, lr: float = 3e-3, num_timesteps: int = 500,
                         generator: torch.Generator | None = None) -> nn.Linear:
    """Fit a linear SS head on the frozen ``net``'s features of noised inputs x_t (t ~ U{1..T}).

    Args:
        tokens: clean token ids (N, L + 2); labels: per-residue classes (N, L).
    """
    v.tensor(OWNER, "tokens", tokens, ndim=2)
    v.tensor(OWNER, "labels", labels, ndim=2)
    if labels.shape != (tokens.shape[0], tokens.shape[1] - 2):
        raise ValueError(f"{OWNER}: labels must have shape (N, L) = {(tokens.shape[0], tokens.shape[1] - 2)} for "
                         f"tokens {tuple(tokens.shape)}, got {tuple(labels.shape)}")
    v.integer(OWNER, "steps", steps, minimum=1)
    net.eval()
    trainable = [p for p in net.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    d = _embedding_matrix(net).shape[1]
    head = nn.Linear(d, n_classes).to(tokens.device)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in progress(range(steps), desc="SS head"):
        idx = torch.randint(len(tokens), (batch_size,), generator=generator)
        x0 = tokens[idx]
        t = torch.randint(1, num_timesteps + 1, (batch_size,), generator=generator)
        xt, _ = q_sample(x0, t, num_timesteps, generator=generator)
        with torch.no_grad():
            h = _hidden(net, input_ids=xt)[:, 1:-1]
        loss = F.cross_entropy(head(h).reshape(-1, n_classes), labels[idx].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for p in trainable:
        p.requires_grad_(True)
    return head.eval()


class StructureGuidance:
    """``guidance(x, logits) -> η ∇_{onehot(x)} Σ_i log p_φ(target_i | x)`` for :func:`reparam_decode`.

    Args:
        net: the frozen DPLM network (the one being sampled).
        head: a per-residue SS head from :func:`train_structure_head`.
        target: class index per residue (length L) or one class for every residue.
        scale: η, the guidance strength (0 disables it).
    """

    def __init__(self, net: nn.Module, head: nn.Module, *, target: int | Sequence[int], scale: float) -> None:
        self.net, self.head = net, head
        self.scale = v.non_negative(OWNER, "scale", scale)
        self.target = target

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.scale == 0:
            return torch.zeros_like(logits)
        n_res = x.shape[1] - 2
        target = torch.as_tensor(self.target, device=x.device).long()
        target = target.expand(n_res) if target.dim() == 0 else target
        if target.shape != (n_res,):
            raise ValueError(f"{OWNER}: target must have one class per residue ({n_res}), got {tuple(target.shape)}")
        onehot = F.one_hot(x, len(VOCAB)).to(_embedding_matrix(self.net).dtype).requires_grad_(True)
        h = _hidden(self.net, inputs_embeds=onehot @ _embedding_matrix(self.net))[:, 1:-1]
        logp = torch.log_softmax(self.head(h), -1).gather(-1, target.expand(len(x), -1).unsqueeze(-1))
        (grad,) = torch.autograd.grad(logp.sum(), onehot)
        return self.scale * grad.masked_fill((x == PAD).unsqueeze(-1), 0.0)


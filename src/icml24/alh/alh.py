"""ALH: "Augmenting Decision with Hypothesis in Reinforcement Learning" (Quang & Lauw, ICML 2024, PMLR 235).

No arXiv id. Official code: https://github.com/nbtpj/ALH (``code/online/memTD3.py``).

A hypothesis h ∈ R^k is a permutation-invariant summary of a set O of transitions o = (s, a, r), made by an
encoder E and trained with a decoder D as a denoising autoencoder:

    u(o) = E(o) / max(‖E(o)‖, ε)                       (unit code, ε = 0.03)
    enc(O) = mean_{o∈O} u(o),    enc(O, h) = normalize(enc(O) + h)   (incremental update)
    DAE(X, h) = MSE(D([X + ξ, h]), X),  ξ ~ 𝒩(0, (0.2 · range_col(X))²)
    L_mem = DAE(O₁, h₁) + DAE(O, h) − MSE(h₁, h₀) − MSE(h, h₀),  h₁ = enc(O₁), h = enc(O₂, h₁)

(the last two terms are the diversity term pushing hypotheses away from the learnable prior h₀, itself fit by
DAE(O, h₀)). Actor and critics take [s, h]; in the RL update h is the encoding of a random subset of the batch
that contains the row itself, detached. When acting, h' starts at h₀ and absorbs one transition at a time:
h' ← normalize(u(s, a, r) + h'). ALH-a updates h' every training step and resets it per episode; ALH-g never
updates it during training and acts with the hypothesis left by the last evaluation.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml24.alh.td3 import TD3Agent
from icml24.common import validate as v

__all__ = ["SetMemory", "ALHAgent", "subset_indices"]


def subset_indices(batch_size: int, subset_size: int, *, generator: torch.Generator,
                   device: str | torch.device = "cpu") -> torch.Tensor:
    """``(B, m)`` row indices: row i is a random subset (with repeats) of the batch that contains i.

    Draw m indices uniformly, shift them so the smallest becomes i (mod B): the anchor row is always present
    (official ``sample_encode``).
    """
    idx = torch.randint(0, batch_size, (batch_size, subset_size), generator=generator, device=device)
    return (idx - idx.min(dim=1, keepdim=True).values + torch.arange(batch_size, device=device)[:, None]) % batch_size


class SetMemory(nn.Module):
    """Encoder E and decoder D of transitions (3-layer Sigmoid MLPs; official ``MemFFW``).

    Args:
        state_dim, action_dim: task sizes; a transition is x = [s, a, r] of size state_dim + action_dim + 1.
        hidden: width of E and D (paper: 256 on MuJoCo, 64 on MultiNormEnv).
        hypo_dim: k, size of a hypothesis (paper: 64).
        ae_noise: DAE noise scale relative to each column's batch range (paper: 0.2).
        eps: ε of the unit-norm code (paper: 0.03).
    """

    def __init__(self, *, state_dim: int, action_dim: int, hidden: int = 64, hypo_dim: int = 64,
                 ae_noise: float = 0.2, eps: float = 0.03) -> None:
        super().__init__()
        v.integer("SetMemory", "hidden", hidden, minimum=1)
        v.integer("SetMemory", "hypo_dim", hypo_dim, minimum=1)
        v.non_negative("SetMemory", "ae_noise", ae_noise)
        v.positive("SetMemory", "eps", eps)
        d = state_dim + action_dim + 1
        self.in_dim, self.hypo_dim, self.ae_noise, self.eps = d, hypo_dim, ae_noise, eps
        self.encoder = nn.Sequential(nn.Linear(d, hidden), nn.Sigmoid(), nn.Linear(hidden, hidden), nn.Sigmoid(),
                                     nn.Linear(hidden, hypo_dim))
        self.decoder = nn.Sequential(nn.Linear(d + hypo_dim, hidden), nn.Sigmoid(), nn.Linear(hidden, hidden),
                                     nn.Sigmoid(), nn.Linear(hidden, d))

    @staticmethod
    def transitions(s: torch.Tensor, a: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """x = [s, a, r] rows."""
        return torch.cat([s, a, r.reshape(-1, 1)], dim=-1)

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        return F.normalize(z, dim=-1, eps=self.eps)

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        """u(o) = E(o) / max(‖E(o)‖, ε), one per row."""
        return self.normalize(self.encoder(x))

    def encode(self, x: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        """enc(O) = mean of the codes of the rows of ``x`` (not renormalised), or normalize(enc(O) + prev)."""
        h = self.codes(x).mean(dim=-2)
        if prev is not None:
            h = self.normalize(h + prev.detach())
        return h

    def subset_encode(self, x: torch.Tensor, subset_size: int, *, generator: torch.Generator) -> torch.Tensor:
        """h_i = enc(subset_i) for every row i, each subset containing row i (:func:`subset_indices`).

        E acts row-wise, so the codes are computed once for the B rows and gathered, instead of running E on
        B·m rows as the official code does (same numbers, ≈ m times cheaper).
        """
        idx = subset_indices(x.shape[0], subset_size, generator=generator, device=x.device)
        # NOTE(deviation): E once per row, then gathered (official: E on all B·m subset rows; same numbers)
        return self.codes(x)[idx].mean(dim=1)

    def dae_loss(self, x: torch.Tensor, h: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
        """DAE(X, h) = MSE(D([X + ξ, h]), X), ξ ~ 𝒩(0, 1) · ae_noise · (max_col X − min_col X)."""
        rng = x.max(dim=0).values - x.min(dim=0).values
        noise = torch.randn(x.shape, generator=generator, device=x.device) * rng * self.ae_noise
        hh = h.expand(x.shape[0], -1) if h.dim() == 1 else h
        return F.mse_loss(self.decoder(torch.cat([x + noise, hh], dim=-1)), x)


class ALHAgent(TD3Agent):
    """TD3 whose actor and critics are conditioned on a hypothesis (ALH-g or ALH-a).

    Args:
        variant: ``"g"`` (ALH-g: the acting hypothesis is only updated during evaluation and reused for training
            rollouts) or ``"a"`` (ALH-a: updated every training step, reset at each episode end). The runner
            reads :attr:`watch_during_training`.
        hypo_dim: k, size of h (paper: 64).
        mem_hidden: width of E and D (paper: same as ``hidden``).
        subset_size: m, rows per subset in the RL update (paper: B/2 on MuJoCo, 128 on MultiNormEnv).
        mem_every: memory update period in TD3 iterations (paper: 10).
        mem_lr: Adam lr of E, D and of h₀ (paper: 3e-4).
        ae_noise, eps: see :class:`SetMemory`.
        **td3: every :class:`~icml24.alh.td3.TD3Agent` argument.
    """

    def __init__(self, *, state_dim: int, action_dim: int, max_action: float | None = None,
                 variant: Literal["g", "a"] = "g",
                 hypo_dim: int = 64, mem_hidden: int | None = None, subset_size: int = 128, mem_every: int = 10,
                 mem_lr: float = 3e-4, ae_noise: float = 0.2, eps: float = 0.03, **td3: Any) -> None:
        v.one_of("ALHAgent", "variant", variant, ("g", "a"))
        v.integer("ALHAgent", "hypo_dim", hypo_dim, minimum=1)
        v.integer("ALHAgent", "subset_size", subset_size, minimum=1)
        v.integer("ALHAgent", "mem_every", mem_every, minimum=1)
        v.positive("ALHAgent", "mem_lr", mem_lr)
        v.non_negative("ALHAgent", "ae_noise", ae_noise)
        super().__init__(state_dim=state_dim, action_dim=action_dim, max_action=max_action, _hypo_dim=hypo_dim,
                         **td3)
        hidden = td3.get("hidden", 256) if mem_hidden is None else mem_hidden
        self.variant, self.subset_size, self.mem_every = variant, subset_size, mem_every
        # E and D are drawn from the agent's local initialisation generator, after actor and critics
        self.mem = self._build(lambda: SetMemory(state_dim=state_dim, action_dim=action_dim, hidden=hidden,
                                                 hypo_dim=hypo_dim, ae_noise=ae_noise, eps=eps))
        self.h0 = nn.Parameter(torch.zeros(hypo_dim, device=self.device))
        self.mem_opt = torch.optim.Adam(self.mem.parameters(), lr=mem_lr, fused=True)
        self.h0_opt = torch.optim.Adam([self.h0], lr=mem_lr)
        self._h: torch.Tensor | None = None  # h', the acting hypothesis (None = h0)

    @property
    def watch_during_training(self) -> bool:
        return self.variant == "a"

    # ------------------------------------------------------------------ acting (adaptive rollout)
    def hypothesis(self) -> torch.Tensor:
        """h', the acting hypothesis (h₀ after :meth:`forget`)."""
        if self._h is None:
            self._h = self.h0.detach().clone()
        return self._h

    def forget(self) -> None:
        """h' ← h₀ (lazily, at the next use)."""
        self._h = None

    @torch.no_grad()
    def watch(self, state: np.ndarray, action: np.ndarray, reward: float) -> None:
        """h' ← normalize(u(s, a, r) + h')."""
        x = torch.as_tensor(np.concatenate([np.asarray(state, np.float32).reshape(-1),
                                            np.asarray(action, np.float32).reshape(-1),
                                            np.asarray([reward], np.float32).reshape(-1)]), device=self.device)
        if x.shape[0] != self.mem.in_dim:
            raise ValueError(f"ALHAgent: a transition [s, a, r] must have {self.mem.in_dim} entries, got "
                             f"{x.shape[0]}")
        self._h = self.mem.encode(x[None], prev=self.hypothesis())

    # ------------------------------------------------------------------ learning
    def batch_hypothesis(self, s: torch.Tensor, a: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            m = min(self.subset_size, s.shape[0])
            return self.mem.subset_encode(self.mem.transitions(s, a, r), m, generator=self.gen)

    def _extra_update(self, s: torch.Tensor, a: torch.Tensor, r: torch.Tensor) -> dict[str, float]:
        if self.total_it % self.mem_every != 0:
            return {}
        return self.memory_step(self.mem.transitions(s, a, r))

    def memory_step(self, x: torch.Tensor) -> dict[str, float]:
        """One update of E, D (L_mem with the diversity term) and then of h₀ (DAE(x, h₀)) on the batch ``x``."""
        B = x.shape[0]
        if B < 3:
            raise ValueError(f"ALHAgent: the memory update needs a batch of >= 3 transitions, got {B}")
        k = int(torch.randint(1, B - 1, (1,), generator=self.gen, device=x.device))  # |O₁| ~ U{1, …, B−2}
        o1, o2 = x[:k], x[k:]
        h1 = self.mem.encode(o1)
        loss_h1 = self.mem.dae_loss(o1, h1, generator=self.gen)
        h = self.mem.encode(o2, prev=h1)  # NOTE: prev is detached inside encode, as in the official code
        loss_h = self.mem.dae_loss(x, h, generator=self.gen)
        h0 = self.h0.detach()
        diversity = -F.mse_loss(h1, h0) - F.mse_loss(h, h0)
        loss = loss_h1 + loss_h + diversity
        self.mem_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.mem_opt.step()
        loss0 = self.mem.dae_loss(x, self.h0, generator=self.gen)
        (g,) = torch.autograd.grad(loss0, [self.h0])
        self.h0.grad = g
        self.h0_opt.step()
        self.h0.grad = None
        return {"mem_loss": float(loss.detach()), "diversity": float(diversity.detach()),
                "h0_loss": float(loss0.detach())}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        st = super().state_dict()
        st.update({"mem": self.mem.state_dict(), "h0": self.h0.detach().clone(), "mem_opt": self.mem_opt.state_dict(),
                   "h0_opt": self.h0_opt.state_dict(), "h_act": None if self._h is None else self._h.clone()})
        return st

    def load_state_dict(self, st: dict[str, Any]) -> None:
        super().load_state_dict(st)
        self.mem.load_state_dict(st["mem"])
        with torch.no_grad():
            self.h0.copy_(st["h0"])
        self.mem_opt.load_state_dict(st["mem_opt"])
        self.h0_opt.load_state_dict(st["h0_opt"])
        self._h = None if st["h_act"] is None else st["h_act"].to(self.device)

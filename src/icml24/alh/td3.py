"""TD3 (Fujimoto et al., 2018), the base learner of ALH, with an optional hypothesis input h.

Critic target with target policy smoothing (clipped double-Q):

    ã = clip(π_φ'(s', h) + clip(ε, −c, c), −a_max, a_max),  ε ~ 𝒩(0, σ̃²)
    y = r + γ (1 − d) min_{j=1,2} Q_θ'_j(s', ã, h)

critic loss Σ_j MSE(Q_θj(s, a, h), y) every step; every ``policy_freq`` steps the actor loss −Q_θ1(s, π_φ(s, h), h)
and Polyak averaging θ' ← τθ + (1 − τ)θ', φ' ← τφ + (1 − τ)φ'. With ``hypo_dim=0`` this is plain TD3 (official
``code/online/TD3.py``); ALH (:mod:`icml24.alh.alh`) feeds a detached hypothesis h ∈ R^hypo_dim.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v

__all__ = ["Actor", "Critic", "ReplayBuffer", "TD3Agent", "td3_target", "polyak_"]


def _with_h(x: torch.Tensor, h: torch.Tensor | None, hypo_dim: int) -> torch.Tensor:
    """``[x, h]`` with one hypothesis ``h`` (shape ``(hypo_dim,)``) broadcast over the batch, or per-row h."""
    if hypo_dim == 0:
        return x
    if h is None:
        raise ValueError(f"a hypothesis of size {hypo_dim} is needed (the network was built with hypo_dim > 0)")
    if h.dim() == 1:
        h = h.expand(x.shape[0], -1)
    return torch.cat([x, h], dim=-1)


class Actor(nn.Module):
    """π_φ(s, h) = a_max · tanh(MLP([s, h])) with two ReLU hidden layers."""

    def __init__(self, *, state_dim: int, action_dim: int, max_action: float, hidden: int = 256,
                 hypo_dim: int = 0) -> None:
        super().__init__()
        self.hypo_dim, self.max_action = hypo_dim, float(max_action)
        self.net = nn.Sequential(nn.Linear(state_dim + hypo_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, action_dim))

    def forward(self, s: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        return self.max_action * torch.tanh(self.net(_with_h(s, h, self.hypo_dim)))


class Critic(nn.Module):
    """Twin critics Q_θ1, Q_θ2 on ``[s, a, h]``, two ReLU hidden layers each."""

    def __init__(self, *, state_dim: int, action_dim: int, hidden: int = 256, hypo_dim: int = 0) -> None:
        super().__init__()
        self.hypo_dim = hypo_dim
        d = state_dim + action_dim + hypo_dim
        self.q1 = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                nn.Linear(hidden, 1))
        self.q2 = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                nn.Linear(hidden, 1))

    def forward(self, s: torch.Tensor, a: torch.Tensor, h: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = _with_h(torch.cat([s, a], -1), h, self.hypo_dim)
        return self.q1(x), self.q2(x)

    def Q1(self, s: torch.Tensor, a: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:  # noqa: N802
        return self.q1(_with_h(torch.cat([s, a], -1), h, self.hypo_dim))


class ReplayBuffer:
    """FIFO buffer of (s, a, s', r, d) with uniform sampling from its own NumPy generator."""

    def __init__(self, *, state_dim: int, action_dim: int, capacity: int = 1_000_000, seed: int = 0) -> None:
        v.integer("ReplayBuffer", "capacity", capacity, minimum=1)
        self.capacity = capacity
        self.s = np.zeros((capacity, state_dim), np.float32)
        self.a = np.zeros((capacity, action_dim), np.float32)
        self.s2 = np.zeros((capacity, state_dim), np.float32)
        self.r = np.zeros((capacity, 1), np.float32)
        self.d = np.zeros((capacity, 1), np.float32)
        self.ptr = self.size = 0
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, s: np.ndarray, a: np.ndarray, s2: np.ndarray, r: float, done: float) -> None:
        i = self.ptr
        self.s[i], self.a[i], self.s2[i], self.r[i], self.d[i] = s, a, s2, r, done
        self.ptr = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
        """``(s, a, s', r, not_done)`` tensors of ``batch_size`` rows drawn uniformly with replacement."""
        if batch_size > self.size:
            raise ValueError(f"ReplayBuffer: batch_size ({batch_size}) is larger than the buffer ({self.size} "
                             "transitions)")
        idx = self.rng.integers(0, self.size, size=batch_size)
        t = (torch.from_numpy(x[idx]).to(device) for x in (self.s, self.a, self.s2, self.r))
        s, a, s2, r = t
        return s, a, s2, r, torch.from_numpy(1.0 - self.d[idx]).to(device)

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        return {"s": self.s[:n].copy(), "a": self.a[:n].copy(), "s2": self.s2[:n].copy(), "r": self.r[:n].copy(),
                "d": self.d[:n].copy(), "ptr": self.ptr, "size": n, "rng": copy.deepcopy(self.rng.bit_generator.state)}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        n = st["size"]
        for k in ("s", "a", "s2", "r", "d"):
            getattr(self, k)[:n] = st[k]
        self.ptr, self.size = st["ptr"], n
        self.rng.bit_generator.state = st["rng"]


def td3_target(*, actor_target: nn.Module, critic_target: Critic, s2: torch.Tensor, r: torch.Tensor,
               not_done: torch.Tensor, eps: torch.Tensor, h: torch.Tensor | None, gamma: float, noise_clip: float,
               max_action: float) -> torch.Tensor:
    """y = r + γ(1 − d) min_j Q'_j(s', clip(π'(s', h) + clip(ε, −c, c), ±a_max), h) for a given noise draw ε."""
    with torch.no_grad():
        a2 = (actor_target(s2, h) + eps.clamp(-noise_clip, noise_clip)).clamp(-max_action, max_action)
        q1, q2 = critic_target(s2, a2, h)
        return r + not_done * gamma * torch.min(q1, q2)


@torch.no_grad()
def polyak_(target: nn.Module, source: nn.Module, tau: float) -> None:
    """θ' ← τθ + (1 − τ)θ' in place."""
    tp, sp = list(target.parameters()), list(source.parameters())
    torch._foreach_mul_(tp, 1.0 - tau)
    torch._foreach_add_(tp, sp, alpha=tau)


class TD3Agent:
    """TD3 with optional hypothesis inputs. Hyper-parameters default to Fujimoto's (official ``TD3.py``).

    Args:
        state_dim, action_dim, max_action: the task (a_max: the action space is [−a_max, a_max]^action_dim).
        hidden: width of the two hidden layers of actor and critics (256 in the paper's MuJoCo runs).
        gamma: γ, discount. tau: τ, Polyak rate. policy_noise: σ̃ / a_max, target smoothing noise.
        noise_clip: c / a_max. policy_freq: actor and target update period d.
        lr: Adam learning rate of actor and critics.
        seed: seeds the network initialisation and the agent's own noise generator.
        device: torch device of every network.
    """

    hypo_dim: int = 0

    def __init__(self, *, state_dim: int, action_dim: int, max_action: float, hidden: int = 256,
                 gamma: float = 0.99, tau: float = 0.005, policy_noise: float = 0.2, noise_clip: float = 0.5,
                 policy_freq: int = 2, lr: float = 3e-4, seed: int = 0, device: str | torch.device = "cpu",
                 _hypo_dim: int = 0) -> None:
        w = type(self).__name__
        v.integer(w, "state_dim", state_dim, minimum=1)
        v.integer(w, "action_dim", action_dim, minimum=1)
        v.positive(w, "max_action", max_action)
        v.integer(w, "hidden", hidden, minimum=1)
        v.in_range(w, "gamma", gamma, 0.0, 1.0)
        v.in_range(w, "tau", tau, 0.0, 1.0, low_open=True)
        v.non_negative(w, "policy_noise", policy_noise)
        v.non_negative(w, "noise_clip", noise_clip)
        v.integer(w, "policy_freq", policy_freq, minimum=1)
        v.positive(w, "lr", lr)
        v.integer(w, "seed", seed, minimum=0)
        self.state_dim, self.action_dim, self.max_action = state_dim, action_dim, float(max_action)
        self.gamma, self.tau, self.policy_freq = gamma, tau, policy_freq
        self.policy_noise, self.noise_clip = policy_noise * max_action, noise_clip * max_action
        self.device = torch.device(device)
        self.hypo_dim = _hypo_dim
        torch.manual_seed(seed)
        self.actor = Actor(state_dim=state_dim, action_dim=action_dim, max_action=max_action, hidden=hidden,
                           hypo_dim=_hypo_dim).to(self.device)
        self.critic = Critic(state_dim=state_dim, action_dim=action_dim, hidden=hidden,
                             hypo_dim=_hypo_dim).to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=lr, fused=True)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr, fused=True)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed + 1)
        self.total_it = 0

    # ------------------------------------------------------------------ acting
    def hypothesis(self) -> torch.Tensor | None:
        """The hypothesis used when acting (None for plain TD3)."""
        return None

    @torch.no_grad()
    def act(self, state: np.ndarray) -> np.ndarray:
        """Deterministic action π(s, h') for one state."""
        s = torch.as_tensor(np.asarray(state, np.float32), device=self.device).reshape(1, -1)
        if s.shape[1] != self.state_dim:
            raise ValueError(f"{type(self).__name__}: state has {s.shape[1]} features, the networks expect "
                             f"{self.state_dim}")
        return self.actor(s, self.hypothesis()).cpu().numpy()[0]

    def watch(self, state: np.ndarray, action: np.ndarray, reward: float) -> None:
        """Update the acting hypothesis with one transition (no-op for TD3)."""

    def forget(self) -> None:
        """Reset the acting hypothesis to the prior (no-op for TD3)."""

    # ------------------------------------------------------------------ learning
    def batch_hypothesis(self, s: torch.Tensor, a: torch.Tensor, r: torch.Tensor) -> torch.Tensor | None:
        """Per-row hypotheses for an update batch (None for TD3)."""
        return None

    def update(self, batch: tuple[torch.Tensor, ...]) -> dict[str, float]:
        """One TD3 iteration on ``batch = (s, a, s', r, not_done)``; returns the losses as floats."""
        self.total_it += 1
        s, a, s2, r, not_done = batch
        out = self._extra_update(s, a, r)
        h = self.batch_hypothesis(s, a, r)
        if h is not None:
            h = h.detach()  # the hypothesis never receives RL gradients
        eps = torch.randn(a.shape, generator=self.gen, device=a.device) * self.policy_noise
        y = td3_target(actor_target=self.actor_target, critic_target=self.critic_target, s2=s2, r=r,
                       not_done=not_done, eps=eps, h=h, gamma=self.gamma, noise_clip=self.noise_clip,
                       max_action=self.max_action)
        q1, q2 = self.critic(s, a, h)
        critic_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        out["critic_loss"] = float(critic_loss.detach())
        if self.total_it % self.policy_freq == 0:
            actor_loss = -self.critic.Q1(s, self.actor(s, h), h).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_opt.step()
            polyak_(self.critic_target, self.critic, self.tau)
            polyak_(self.actor_target, self.actor, self.tau)
            out["actor_loss"] = float(actor_loss.detach())
        return out

    def _extra_update(self, s: torch.Tensor, a: torch.Tensor, r: torch.Tensor) -> dict[str, float]:
        return {}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                "actor_target": self.actor_target.state_dict(), "critic_target": self.critic_target.state_dict(),
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "gen": self.gen.get_state(), "total_it": self.total_it}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        for k in ("actor", "critic", "actor_target", "critic_target", "actor_opt", "critic_opt"):
            getattr(self, k).load_state_dict(st[k])
        self.gen.set_state(st["gen"])
        self.total_it = int(st["total_it"])

"""TD3 (Fujimoto et al., 2018), the base learner of ALH, with an optional hypothesis input h.

Critic target with target policy smoothing (clipped double-Q):

    ã = clip(π_φ'(s', h) + clip(ε, −c, c), −a_max, a_max),  ε ~ 𝒩(0, σ̃²)
    y = r + γ (1 − d) min_{j=1,2} Q_θ'_j(s', ã, h)

critic loss Σ_j MSE(Q_θj(s, a, h), y) every step; every ``policy_freq`` steps the actor loss −Q_θ1(s, π_φ(s, h), h)
and Polyak averaging θ' ← τθ + (1 − τ)θ', φ' ← τφ + (1 − τ)φ'. With ``hypo_dim=0`` this is plain TD3 (official
``code/online/TD3.py``); ALH (:mod:`icml24.alh.alh`) feeds a detached hypothesis h ∈ R^hypo_dim.

Action bounds [low, high] (per dimension, not necessarily symmetric) enter as cleanrl's ``td3_continuous_action``
does: π = bias + scale · tanh(·) with scale = (high − low)/2, bias = (high + low)/2; the smoothing noise and its
clip are relative to the scale, and ã is clipped to [low, high]. For [−a_max, a_max] this is Fujimoto's a_max · tanh.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v

__all__ = ["Actor", "Critic", "ReplayBuffer", "TD3Agent", "td3_target", "polyak_", "init_linear_"]


def init_linear_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Re-draw every ``nn.Linear`` of ``module`` (in module order) from ``generator``, with PyTorch's default
    initialisation (weight: Kaiming-uniform with a = √5, bias: U(±1/√fan_in)).

    With a generator seeded like the global one, the numbers equal those of building the module after
    ``torch.manual_seed`` (tested), without touching the global random state.
    """
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
            if m.bias is not None:
                fan_in = m.weight.shape[1]
                bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                nn.init.uniform_(m.bias, -bound, bound, generator=generator)
    return module


def _build(factory: Any, generator: torch.Generator, device: torch.device) -> nn.Module:
    """``factory()`` built on the meta device (no draw from the global generator), then materialised on the CPU,
    initialised from ``generator`` and moved to ``device``."""
    with torch.device("meta"):
        m = factory()
    m = m.to_empty(device="cpu")
    for sub in m.modules():  # buffers hold values, not draws: fill them again off the meta device
        if hasattr(sub, "reset_buffers"):
            sub.reset_buffers()
    return init_linear_(m, generator).to(device)


def _bounds(owner: str, action_dim: int, max_action: float | None, action_low: Any, action_high: Any
            ) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension ``(low, high)`` from either ``max_action`` (symmetric) or ``action_low``/``action_high``."""
    if max_action is not None:
        if action_low is not None or action_high is not None:
            raise ValueError(f"{owner}: give either max_action or action_low/action_high, not both")
        v.positive(owner, "max_action", max_action)
        hi = np.full(action_dim, float(max_action))
        return -hi, hi
    if action_low is None or action_high is None:
        raise ValueError(f"{owner}: the action bounds are missing: give max_action (for [-max_action, "
                         "max_action]) or both action_low and action_high")
    lo, hi = (np.asarray(b, dtype=np.float64).reshape(-1) for b in (action_low, action_high))
    lo, hi = (np.full(action_dim, b[0]) if b.size == 1 else b for b in (lo, hi))  # a scalar: every dimension
    if lo.shape != (action_dim,) or hi.shape != (action_dim,):
        raise ValueError(f"{owner}: action_low and action_high must have action_dim={action_dim} entries, got "
                         f"{lo.size} and {hi.size}")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo < hi)):
        raise ValueError(f"{owner}: the action bounds must be finite with low < high in every dimension, got "
                         f"low={lo}, high={hi}")
    return lo, hi


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
    """π_φ(s, h) = bias + scale · tanh(MLP([s, h])) with two ReLU hidden layers; scale = (high − low)/2,
    bias = (high + low)/2 (a_max · tanh for ``max_action``, as Fujimoto's TD3; cleanrl's scaling otherwise).

    Bounds: ``max_action`` (the box [−a_max, a_max]^d) or ``action_low`` and ``action_high`` (per dimension).
    """

    def __init__(self, *, state_dim: int, action_dim: int, max_action: float | None = None, hidden: int = 256,
                 hypo_dim: int = 0, action_low: float | Sequence[float] | None = None,
                 action_high: float | Sequence[float] | None = None) -> None:
        super().__init__()
        lo, hi = _bounds("Actor", action_dim, max_action, action_low, action_high)
        self.hypo_dim = hypo_dim
        self.max_action = float(max_action) if max_action is not None else None
        self.action_low, self.action_high = lo, hi
        self.reset_buffers()
        self.net = nn.Sequential(nn.Linear(state_dim + hypo_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, action_dim))

    def reset_buffers(self) -> None:
        """(Re)create the ``action_scale``/``action_bias`` buffers from the bounds (on the default device)."""
        # not persistent: the state dict (and old checkpoints) hold the weights only
        lo, hi = self.action_low, self.action_high
        self.register_buffer("action_scale", torch.tensor((hi - lo) / 2.0, dtype=torch.float32), persistent=False)
        self.register_buffer("action_bias", torch.tensor((hi + lo) / 2.0, dtype=torch.float32), persistent=False)

    def forward(self, s: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        return self.action_scale * torch.tanh(self.net(_with_h(s, h, self.hypo_dim))) + self.action_bias


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
               not_done: torch.Tensor, eps: torch.Tensor, h: torch.Tensor | None, gamma: float,
               noise_clip: float | torch.Tensor, max_action: float | None = None,
               action_low: torch.Tensor | None = None, action_high: torch.Tensor | None = None) -> torch.Tensor:
    """y = r + γ(1 − d) min_j Q'_j(s', clip(π'(s', h) + clip(ε, −c, c), low, high), h) for a given noise draw ε.

    The bounds are ``±max_action`` or the per-dimension tensors ``action_low``/``action_high``; ``noise_clip`` c
    is absolute (a float or one value per action dimension).
    """
    if max_action is not None:
        low, high = -max_action, max_action
    elif action_low is not None and action_high is not None:
        low, high = action_low, action_high
    else:
        raise ValueError("td3_target: give max_action or both action_low and action_high")
    if isinstance(noise_clip, torch.Tensor):
        nlo, nhi = -noise_clip, noise_clip
    else:
        nlo, nhi = -float(noise_clip), float(noise_clip)
    with torch.no_grad():
        a2 = torch.clamp(actor_target(s2, h) + torch.clamp(eps, nlo, nhi), low, high)
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
        state_dim, action_dim: the task's observation and action sizes.
        max_action: a_max, for the action space [−a_max, a_max]^action_dim; or, instead,
        action_low, action_high: per-dimension bounds [low, high] (any box: the actor outputs
            bias + scale · tanh(·), scale = (high − low)/2, bias = (high + low)/2, as cleanrl's TD3).
        hidden: width of the two hidden layers of actor and critics (256 in the paper's MuJoCo runs).
        gamma: γ, discount. tau: τ, Polyak rate. policy_noise: σ̃ / scale, target smoothing noise.
        noise_clip: c / scale. policy_freq: actor and target update period d.
        lr: Adam learning rate of actor and critics.
        seed: seeds a local generator for the network initialisation (the global torch generator is neither
            read nor changed; same numbers as ``torch.manual_seed(seed)`` before building the networks) and,
            with ``seed + 1``, the agent's own noise generator.
        device: torch device of every network.
    """

    hypo_dim: int = 0

    def __init__(self, *, state_dim: int, action_dim: int, max_action: float | None = None, hidden: int = 256,
                 gamma: float = 0.99, tau: float = 0.005, policy_noise: float = 0.2, noise_clip: float = 0.5,
                 policy_freq: int = 2, lr: float = 3e-4, seed: int = 0, device: str | torch.device = "cpu",
                 action_low: float | Sequence[float] | None = None,
                 action_high: float | Sequence[float] | None = None, _hypo_dim: int = 0) -> None:
        w = type(self).__name__
        v.integer(w, "state_dim", state_dim, minimum=1)
        v.integer(w, "action_dim", action_dim, minimum=1)
        low, high = _bounds(w, action_dim, max_action, action_low, action_high)
        v.integer(w, "hidden", hidden, minimum=1)
        v.in_range(w, "gamma", gamma, 0.0, 1.0)
        v.in_range(w, "tau", tau, 0.0, 1.0, low_open=True)
        v.non_negative(w, "policy_noise", policy_noise)
        v.non_negative(w, "noise_clip", noise_clip)
        v.integer(w, "policy_freq", policy_freq, minimum=1)
        v.positive(w, "lr", lr)
        v.integer(w, "seed", seed, minimum=0)
        self.state_dim, self.action_dim = state_dim, action_dim
        self.action_low, self.action_high = low, high
        self.max_action = float(max_action) if max_action is not None else None  # None for a general box
        self.gamma, self.tau, self.policy_freq = gamma, tau, policy_freq
        self.device = torch.device(device)
        scale = torch.tensor((high - low) / 2.0, dtype=torch.float32, device=self.device)
        # σ̃ and c relative to the action scale (a_max for a symmetric box; cleanrl: action_scale)
        self.policy_noise, self.noise_clip = policy_noise * scale, noise_clip * scale
        self._low = torch.tensor(low, dtype=torch.float32, device=self.device)
        self._high = torch.tensor(high, dtype=torch.float32, device=self.device)
        self.hypo_dim = _hypo_dim
        # a local generator: building an agent never reads or moves the global torch generator
        self._init_gen = torch.Generator().manual_seed(seed)
        self.actor = self._build(lambda: Actor(state_dim=state_dim, action_dim=action_dim, hidden=hidden,
                                               hypo_dim=_hypo_dim, action_low=low, action_high=high))
        self.critic = self._build(lambda: Critic(state_dim=state_dim, action_dim=action_dim, hidden=hidden,
                                                 hypo_dim=_hypo_dim))
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=lr, fused=True)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr, fused=True)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed + 1)
        self.total_it = 0

    def _build(self, factory: Any) -> nn.Module:
        """A module from ``factory`` initialised from the agent's local initialisation generator, in build order."""
        return _build(factory, self._init_gen, self.device)

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
                       action_low=self._low, action_high=self._high)
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

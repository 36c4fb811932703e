"""Random Scaling and Momentum for Non-smooth Non-convex Optimization (Zhang & Cutkosky, ICML 2024).

arXiv: 2405.09742 · official code: none released (the authors' research code, ZQZCalin/trainit and
ZQZCalin/jaxoptimizers, implements the same update). Exponentiated online-to-non-convex conversion,
instantiated with online gradient descent, is SGD with momentum whose *applied* update is multiplied by one
random scalar ``s_n ~ Exp(1)`` per step::

    m_n = β m_{n-1} + (1 - β) g_{n-1}             g_{n-1} = ∇f(x_{n-1}, z): gradient at the current iterate
    Δ_n = -η (m_n + λ x_{n-1})                    fixed before s_n is drawn; the learner never sees s_n
    x_n = x_{n-1} + s_n Δ_n,   s_n ~ Exp(1)       E_s[F(x + sΔ)] - F(x) = E_s[<∇F(x + sΔ), Δ>]
    x̄_n = Σ_{k<=n} β̃^{n-k} (1 - β̃) x_k / (1 - β̃^n)   (optional output: bias-corrected EMA of iterates)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import torch
from torch.optim import Optimizer

from icml24.common import validate as v

__all__ = ["ExpSGDM"]

ScalingKind = Literal["exponential"] | None
_STATE_KEY = "exp_sgdm"


def _check_hyper(lr: Any, momentum: Any, weight_decay: Any) -> None:
    v.positive("exp_sgdm", "lr", lr)
    v.in_range("exp_sgdm", "momentum", momentum, 0.0, 1.0, high_open=True)
    v.non_negative("exp_sgdm", "weight_decay", weight_decay)


def _default_generator() -> torch.Generator:
    # Derived from torch's initial seed (so `torch.manual_seed` fixes it) without consuming the global stream;
    # the affine mix keeps it distinct from the stream that initialised the model.
    g = torch.Generator()
    g.manual_seed((torch.initial_seed() * 6364136223846793005 + 1442695040888963407) % (2**63))
    return g


def _host_scale(s: torch.Tensor) -> float | None:
    """``s`` as a Python float when reading it costs no device sync (a CPU tensor), else None."""
    return float(s) if s.device.type == "cpu" else None


class ExpSGDM(Optimizer):
    r"""SGD with (EMA-form) momentum whose update is scaled by one ``Exp(1)`` scalar per step.

    Each :meth:`step` (1) updates every parameter's momentum ``m ← β m + (1-β) g`` and its update direction
    ``Δ = -η (m + λ x)``, (2) only then draws one scalar ``s ~ Exp(1)`` shared by *all* parameter groups, and
    (3) applies ``x ← x + s Δ``. The momentum buffer (``state['momentum_buffer']``, the only per-parameter
    state) and ``Δ`` never depend on ``s``. Every stage runs as ``torch._foreach_*`` kernels, one launch per
    parameter group; with a CPU generator ``s`` is read as a float and the step makes the same passes as
    ``torch.optim.SGD(foreach=True)`` (plus one for weight decay), with a generator on an accelerator ``s``
    stays there (no host sync). The next gradient is the ordinary one at the new iterate:
    no auxiliary point and no extra forward pass. With ``random_scaling=None`` (``s ≡ 1``) this is plain SGDM;
    with zero weight decay it equals ``torch.optim.SGD(lr=η(1-β), momentum=β)`` step for step.

    Args:
        params: parameters or parameter groups (groups may override ``lr``, ``momentum``, ``weight_decay``).
        lr: η, step size of the EMA-form momentum (> 0). Equals ``torch.optim.SGD`` lr ``η(1-β)``.
        momentum: β ∈ [0, 1), the momentum / discount factor of the online learner.
        weight_decay: λ >= 0, added inside Δ (``Δ = -η(m + λx)``), so it is randomly scaled too, as in the
            authors' PyTorch code.
        random_scaling: ``"exponential"`` (s ~ Exp(1), the paper) or ``None`` (s ≡ 1: the SGDM baseline).
        generator: ``torch.Generator`` the scalars are drawn from (its device decides where ``s`` lives).
            Default: a CPU generator seeded from ``torch.initial_seed()``. Every data-parallel rank must use an
            identically seeded generator so that all replicas apply the same ``s``.
        ema_beta: β̃ ∈ [0, 1) of the optional bias-corrected EMA of iterates ``x̄`` (the theory's output
            point; the paper uses β̃ = β), or ``None`` to keep no average. See :meth:`swap_ema`.

    Example::

        opt = ExpSGDM(model.parameters(), lr=0.5, momentum=0.9, ema_beta=0.9)
        for x, y in loader:
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        with opt.swap_ema():          # evaluate the averaged iterate x̄
            evaluate(model)
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]], *, lr: float,
                 momentum: float = 0.9, weight_decay: float = 0.0,
                 random_scaling: ScalingKind = "exponential", generator: torch.Generator | None = None,
                 ema_beta: float | None = None) -> None:
        _check_hyper(lr, momentum, weight_decay)
        v.one_of("exp_sgdm", "random_scaling", random_scaling, ("exponential", None))
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"exp_sgdm: generator must be a torch.Generator or None, got {type(generator).__name__}")
        if ema_beta is not None:
            v.in_range("exp_sgdm", "ema_beta", ema_beta, 0.0, 1.0, high_open=True)
        defaults = {"lr": float(lr), "momentum": float(momentum), "weight_decay": float(weight_decay)}
        super().__init__(params, defaults)
        self.random_scaling: ScalingKind = random_scaling
        self.ema_beta: float | None = None if ema_beta is None else float(ema_beta)
        if generator is None and random_scaling is not None:
            generator = _default_generator()
        self.generator: torch.Generator | None = generator
        self._num_steps = 0
        self._last_scale: torch.Tensor | None = None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate the group's ``lr``, ``momentum`` and ``weight_decay``, then add it."""
        if isinstance(param_group, dict):
            merged = {k: param_group.get(k, self.defaults.get(k)) for k in ("lr", "momentum", "weight_decay")}
            _check_hyper(**merged)
        super().add_param_group(param_group)

    # ------------------------------------------------------------------ the step
    @property
    def num_steps(self) -> int:
        """Number of :meth:`step` calls so far (n)."""
        return self._num_steps

    @property
    def last_scale(self) -> float | None:
        """The scalar s_n applied by the last step (1.0 without random scaling; None before the first step)."""
        if self._num_steps == 0:
            return None
        return 1.0 if self._last_scale is None else float(self._last_scale)

    def _draw_scale(self) -> torch.Tensor | None:
        if self.random_scaling is None:
            return None
        assert self.generator is not None
        return torch.empty((), dtype=torch.float64, device=self.generator.device).exponential_(
            1.0, generator=self.generator)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One Exp-SGDM step: learner update (Δ), then one shared draw s ~ Exp(1), then ``x ← x + sΔ``.

        Args:
            closure: optional callable that re-evaluates the model and returns the loss.

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        # (1) online learner: momentum for every parameter, before s_n exists (foreach kernels, one launch per
        # group, not per parameter). Δ_n = -η(m_n + λ x_{n-1}) is s-free and never stored.
        groups: list[tuple[list[torch.Tensor], list[torch.Tensor], float, float]] = []
        for group in self.param_groups:
            lr, beta, wd = group["lr"], group["momentum"], group["weight_decay"]
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if any(g.is_sparse for g in grads):
                raise RuntimeError("exp_sgdm: sparse gradients are not supported")
            bufs = []
            for p in params:  # only allocates, on a parameter's first step
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                bufs.append(state["momentum_buffer"])
            torch._foreach_mul_(bufs, beta)
            torch._foreach_add_(bufs, grads, alpha=1.0 - beta)
            groups.append((params, bufs, lr, wd))

        # (2) one scalar for the whole model, drawn after every Δ is fixed; (3) x ← x + s Δ.
        s = self._draw_scale()
        # a CPU scalar is read as a float (no device sync): x ← (1 - sηλ) x - sη m, the same passes as SGD's
        # step; a scalar on an accelerator stays a tensor there (no host sync): x ← x + s · Δ
        s_host = 1.0 if s is None else _host_scale(s)
        cache: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        for params, bufs, lr, wd in groups:
            # NOTE(deviation): EMA-form momentum and weight decay inside Δ (authors' PyTorch Sgdm), not
            # torch.optim.SGD's λx added to g before the momentum; identical when weight_decay == 0.
            if s_host is not None:
                if wd != 0.0:
                    torch._foreach_mul_(params, 1.0 - s_host * lr * wd)
                torch._foreach_add_(params, bufs, alpha=-s_host * lr)
                continue
            deltas = torch._foreach_mul(bufs, -lr)
            if wd != 0.0:
                torch._foreach_add_(deltas, params, alpha=-lr * wd)
            scales = []
            for p in params:
                key = (p.device, p.dtype)
                if key not in cache:
                    cache[key] = s.to(device=p.device, dtype=p.dtype)
                scales.append(cache[key])
            torch._foreach_addcmul_(params, deltas, scales)
        self._last_scale = s
        self._num_steps += 1

        if self.ema_beta is not None:
            self._update_ema()
        return loss

    # ------------------------------------------------------------------ EMA of iterates (output point)
    def _update_ema(self) -> None:
        b = self.ema_beta
        params, emas = [], []
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if "ema" not in state:
                    state["ema"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["ema_steps"] = 0
                params.append(p.detach())
                emas.append(state["ema"])
                state["ema_steps"] += 1
        if emas:  # ema ← b·ema + (1 - b)·x, as foreach kernels
            torch._foreach_mul_(emas, b)
            torch._foreach_add_(emas, params, alpha=1.0 - b)

    def _ema_of(self, p: torch.Tensor) -> torch.Tensor | None:
        state = self.state.get(p, {})
        if "ema" not in state or state["ema_steps"] == 0:
            return None
        return state["ema"] / (1.0 - self.ema_beta ** state["ema_steps"])

    @torch.no_grad()
    def ema_params(self) -> list[torch.Tensor]:
        """The bias-corrected averaged iterate x̄_n, one tensor per parameter (in param-group order).

        A parameter the average has not seen yet is returned as a copy of itself.

        Raises:
            RuntimeError: when the optimizer was built with ``ema_beta=None``.
        """
        if self.ema_beta is None:
            raise RuntimeError("exp_sgdm: ema_params needs ema_beta (the optimizer keeps no average)")
        out = []
        for group in self.param_groups:
            for p in group["params"]:
                e = self._ema_of(p)
                out.append(p.detach().clone() if e is None else e)
        return out

    @contextlib.contextmanager
    def swap_ema(self) -> Iterator[None]:
        """Context manager: parameters hold x̄_n inside the block and their own values again after it.

        Raises:
            RuntimeError: when the optimizer was built with ``ema_beta=None``.
        """
        if self.ema_beta is None:
            raise RuntimeError("exp_sgdm: swap_ema needs ema_beta (the optimizer keeps no average)")
        params = [p for group in self.param_groups for p in group["params"]]
        with torch.no_grad():
            averaged = self.ema_params()
            backup = [p.detach().clone() for p in params]
            for p, e in zip(params, averaged, strict=True):
                p.copy_(e)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(params, backup, strict=True):
                    p.copy_(b)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """``torch.optim`` state plus the random stream (generator state), the step count and s_n."""
        sd = super().state_dict()
        sd[_STATE_KEY] = {
            "num_steps": self._num_steps,
            "last_scale": None if self._last_scale is None else float(self._last_scale),
            "generator_state": None if self.generator is None else self.generator.get_state(),
            "random_scaling": self.random_scaling,
            "ema_beta": self.ema_beta,
        }
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved, including the generator, so the next s_n is reproduced."""
        state_dict = dict(state_dict)
        extra = state_dict.pop(_STATE_KEY, None)
        super().load_state_dict(state_dict)
        if extra is None:
            return
        self._num_steps = int(extra["num_steps"])
        ls = extra["last_scale"]
        self._last_scale = None if ls is None or self.random_scaling is None else torch.tensor(ls, dtype=torch.float64)
        gs = extra["generator_state"]
        if gs is not None and self.generator is not None:
            self.generator.set_state(gs.cpu() if isinstance(gs, torch.Tensor) else gs)

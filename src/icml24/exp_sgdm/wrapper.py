"""``RandomScaling``: the Exp(1) random update scaling of Zhang & Cutkosky (ICML 2024, arXiv 2405.09742) as a
wrapper around any ``torch.optim.Optimizer``.

The wrapped optimizer is the online learner; it proposes the update ``Δ_n = x_new - x_{n-1}`` from its own
state, which never sees the scalar. The wrapper applies ``x_n = x_{n-1} + s_n Δ_n`` with one ``s_n ~ Exp(1)``
per step shared by every parameter, so that ``E_s[F(x + sΔ)] - F(x) = E_s[<∇F(x + sΔ), Δ>]``. With
``torch.optim.SGD(lr=η(1-β), momentum=β)`` inside, this is the paper's Exp-SGDM (:class:`ExpSGDM` with η, β).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch.optim import Optimizer

from icml24.common import validate as v

__all__ = ["RandomScaling"]

Mode = Literal["auto", "lr", "snapshot"]
_STATE_KEY = "random_scaling"

# Built-in optimizers whose step is x ← x - lr·u with u and every state buffer independent of lr, so that
# scaling the groups' lr by s scales the whole update by s (decoupled weight decay is lr·λ·x: linear too).
_LR_LINEAR = tuple(getattr(torch.optim, name) for name in (
    "SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "SparseAdam")
    if hasattr(torch.optim, name))


def _seeded_generator() -> torch.Generator:
    # From torch's initial seed (so `torch.manual_seed` fixes it) without consuming the global stream.
    g = torch.Generator()
    g.manual_seed((torch.initial_seed() * 6364136223846793005 + 1442695040888963407 + 1) % (2**63))
    return g


class RandomScaling(Optimizer):
    r"""Scale every :meth:`step`'s whole update by one shared ``s ~ Exp(1)``: ``x ← x_old + s (x_new - x_old)``.

    Two ways to apply ``s``, both without a per-parameter Python loop of kernels:

    * ``"snapshot"`` (any optimizer, e.g. Rprop or a third-party one): copy the parameters with one
      ``torch._foreach_copy_``, let the wrapped optimizer step (its foreach/fused kernels), then
      ``torch._foreach_lerp_(x_new, x_old, 1 - s)``, which is ``x_old + s (x_new - x_old)``. Costs one extra
      copy of the parameters (memory) and two passes over them per step.
    * ``"lr"`` (optimizers whose update is linear in the learning rate with lr-free state: the built-in SGD,
      Adam, AdamW, Adamax, NAdam, RAdam, Adagrad, Adadelta, RMSprop, SparseAdam): multiply each group's ``lr``
      by ``s`` for the step and restore the exact original value after it. No extra memory or pass.

    ``"auto"`` (default) picks ``"lr"`` when ``type(optimizer)`` is one of those built-ins (not a subclass,
    which may override ``step``) and ``"snapshot"`` otherwise. The two agree to rounding (tested).

    The wrapper forwards ``param_groups``, ``state`` and ``defaults`` to the wrapped optimizer, so LR
    schedulers, ``zero_grad`` and ``transformers.Trainer`` work on it. ``state_dict()`` is the wrapped
    optimizer's plus the generator state (the random stream), the step count and the last ``s``.

    Distributed: under an initialised ``torch.distributed`` process group with more than one rank, the first
    :meth:`step` (and the first after :meth:`load_state_dict`) broadcasts rank 0's generator state to every
    rank (``broadcast_object_list``, once); from then on every rank draws the same ``s`` from an identical
    stream, with no per-step communication. All ranks must call :meth:`step` equally often (as under DDP).

    Args:
        optimizer: the ``torch.optim.Optimizer`` to wrap (the online learner).
        generator: CPU ``torch.Generator`` the scalars are drawn from. Default: one seeded from
            ``torch.initial_seed()`` (so ``torch.manual_seed`` fixes it) without consuming the global stream.
        mode: ``"auto"``, ``"lr"`` or ``"snapshot"`` (see above).
        process_group: the process group to synchronise the stream over (default: the world group).

    Example::

        opt = RandomScaling(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True))
        opt.zero_grad(); loss.backward(); opt.step(); print(opt.last_scale)
    """

    def __init__(self, optimizer: Optimizer, *, generator: torch.Generator | None = None, mode: Mode = "auto",
                 process_group: Any = None) -> None:
        if not isinstance(optimizer, Optimizer):
            raise v.ArgumentTypeError(
                f"RandomScaling: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, RandomScaling):
            raise ValueError("RandomScaling: optimizer is already wrapped in RandomScaling")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise v.ArgumentTypeError(
                f"RandomScaling: generator must be a torch.Generator or None, got {type(generator).__name__}")
        if generator is not None and generator.device.type != "cpu":
            raise ValueError(f"RandomScaling: generator must be a CPU torch.Generator, got device {generator.device}")
        v.one_of("RandomScaling", "mode", mode, ("auto", "lr", "snapshot"))
        if mode == "lr" and type(optimizer) not in _LR_LINEAR:
            raise ValueError(f"RandomScaling: mode 'lr' needs an optimizer whose update is linear in lr "
                             f"({', '.join(c.__name__ for c in _LR_LINEAR)}), got {type(optimizer).__name__}; "
                             f"use mode='snapshot'")
        self.optimizer = optimizer
        self.mode: str = ("lr" if type(optimizer) in _LR_LINEAR else "snapshot") if mode == "auto" else mode
        self.generator = generator if generator is not None else _seeded_generator()
        self.process_group = process_group
        self._num_steps = 0
        self._last_scale: float | None = None
        self._synced = False
        self._snap: list[torch.Tensor] = []
        self._snap_for: tuple[int, ...] = ()
        # what torch.optim.Optimizer.__init__ sets besides state/param_groups/defaults (hooks, step counter)
        for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                     "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                     "_optimizer_load_state_dict_post_hooks"):
            setattr(self, name, OrderedDict())
        self._patch_step_function()

    # ------------------------------------------------------------------ forwarding
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        return f"RandomScaling(mode={self.mode!r}, {self.optimizer!r})"

    def __getstate__(self) -> dict[str, Any]:  # Optimizer's keeps only defaults/state/param_groups
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # ------------------------------------------------------------------ the step
    @property
    def num_steps(self) -> int:
        """Number of :meth:`step` calls so far (n)."""
        return self._num_steps

    @property
    def last_scale(self) -> float | None:
        """The scalar s_n applied by the last step (None before the first step)."""
        return self._last_scale

    def _sync_stream(self) -> None:
        self._synced = True
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        if dist.get_world_size(self.process_group) <= 1:
            return
        payload = [self.generator.get_state()]
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        dist.broadcast_object_list(payload, src=src, group=self.process_group)
        self.generator.set_state(payload[0])

    def _draw(self) -> float:
        if not self._synced:
            self._sync_stream()
        return float(torch.empty((), dtype=torch.float64).exponential_(1.0, generator=self.generator))

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def _snapshot(self, params: list[torch.Tensor]) -> None:
        key = tuple(id(p) for p in params)
        if key != self._snap_for or any(a.shape != b.shape or a.dtype != b.dtype or a.device != b.device
                                         for a, b in zip(self._snap, params, strict=True)):
            self._snap = [torch.empty_like(p, memory_format=torch.preserve_format) for p in params]
            self._snap_for = key
        torch._foreach_copy_(self._snap, params)

    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        """Draw s ~ Exp(1) and step the wrapped optimizer with its update scaled by s.

        Args:
            closure: passed to the wrapped optimizer's ``step``.

        Returns:
            What the wrapped optimizer's ``step`` returns (the closure's loss, or None).
        """
        s = self._draw()
        if self.mode == "lr":
            saved = [group["lr"] for group in self.param_groups]
            try:
                for group, lr in zip(self.param_groups, saved, strict=True):
                    group["lr"] = lr * s  # a new float or tensor: the original object is never modified
                loss = self.optimizer.step(closure)
            finally:
                for group, lr in zip(self.param_groups, saved, strict=True):
                    group["lr"] = lr  # the exact original value, so schedulers and state_dict never see s
        else:
            params = self._params()
            self._snapshot(params)
            loss = self.optimizer.step(closure)
            with torch.no_grad():
                torch._foreach_lerp_(params, self._snap, 1.0 - s)  # x_new + (1-s)(x_old - x_new)
        self._last_scale = s
        self._num_steps += 1
        return loss

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict plus the random stream, the step count and the last s."""
        sd = self.optimizer.state_dict()
        sd[_STATE_KEY] = {"generator_state": self.generator.get_state(), "num_steps": self._num_steps,
                          "last_scale": self._last_scale, "mode": self.mode}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the wrapped optimizer and the random stream, so the next s is the one the run would draw."""
        state_dict = dict(state_dict)
        extra = state_dict.pop(_STATE_KEY, None)
        self.optimizer.load_state_dict(state_dict)
        if extra is not None:
            gs = extra["generator_state"]
            self.generator.set_state(gs.cpu() if isinstance(gs, torch.Tensor) else gs)
            self._num_steps = int(extra["num_steps"])
            self._last_scale = extra["last_scale"]
        self._synced = False

"""Mixture of Low-rank Adapters (MoLA): adapter layers, gates and the model wrapper.

Paper: "Exploring Training on Heterogeneous Data with Mixture of Low-rank Adapters" (Zhou et al., ICML 2024),
arXiv 2406.09679; official code: https://github.com/MediaBrain-SJTU/MoLA.

Every adapted layer keeps its (trainable) base weight ``W`` and owns ``E`` low-rank experts
``ΔW_e = (α / r) · B_e A_e``; sample ``i`` is processed with

    W_i = W + Σ_e g_{i,e} ΔW_e,

where the gate ``g_i`` is the one-hot task vector (MoLA-Grad: expert ``e`` only receives gradients from task
``e``) or ``softmax(router(x_i))`` from one router shared by all adapted layers (MoLA-Router). The backbone
is trained jointly with the adapters (nothing is frozen) unless ``freeze_backbone=True``.

How the gates reach the layers: :class:`MoLAModel` computes them once per forward and stores them in one
:class:`GateContext` object that every adapted layer of that model holds a reference to. They stay there
until the next forward, so the recomputation of ``torch.utils.checkpoint`` during the following backward sees
the same gates, and ``torch.compile`` traces one attribute write and reads. For several forwards before one
backward under checkpointing, pass ``context_fn=model.checkpoint_context_fn`` to (non-reentrant)
``torch.utils.checkpoint.checkpoint``: it restores each forward's own gates during its recomputation.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v

__all__ = ["MoLALinear", "MoLAConv2d", "TaskGate", "Router", "MoLAModel", "GateContext", "apply_mola"]


class GateContext:
    """The per-sample gates ``(B, E)`` of the current forward, shared by every MoLA layer of one model.

    A plain object (not a module, not a buffer): it is not saved in ``state_dict`` and is shared, not copied,
    by the layers. ``gates`` is ``None`` before the first forward.
    """

    def __init__(self) -> None:
        self.gates: torch.Tensor | None = None

    @contextlib.contextmanager
    def use(self, gates: torch.Tensor | None) -> Iterator[None]:
        """Temporarily set ``gates`` (restores the previous value on exit)."""
        prev, self.gates = self.gates, gates
        try:
            yield
        finally:
            self.gates = prev


class _MoLALayer(nn.Module):
    """Shared gate handling of :class:`MoLALinear` and :class:`MoLAConv2d`."""

    num_experts: int
    gates: torch.Tensor | None
    gate_context: GateContext | None = None

    def reset_lora_parameters(self) -> None:
        """``A_e`` ~ kaiming-uniform (a=√5, as loralib / the official code), ``B_e = 0`` (so ΔW_e = 0 at init)."""
        with torch.no_grad():
            for e in range(self.num_experts):
                nn.init.kaiming_uniform_(self.lora_A[e], a=math.sqrt(5))
            self.lora_B.zero_()

    def set_gates(self, gates: torch.Tensor | None) -> None:
        """Store the per-sample gates ``g`` (``(B, E)``) used by the next forward calls (``None`` clears)."""
        self.gates = gates

    def _resolve_gates(self, x: torch.Tensor, gates: torch.Tensor | None) -> torch.Tensor:
        g = gates if gates is not None else self.gates
        if g is None and self.gate_context is not None:
            g = self.gate_context.gates
        if g is None:
            raise RuntimeError("mola: no gates set; pass gates=(B, num_experts) or call the layer through "
                               "MoLAModel (apply_mola), which sets them from the task ids or the router")
        if not isinstance(g, torch.Tensor) or g.dim() != 2 or g.shape[1] != self.num_experts:
            shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise ValueError(f"mola: gates must have shape (batch, num_experts={self.num_experts}), got {shape}")
        if g.shape[0] != x.shape[0]:
            raise ValueError(f"mola: gates batch size ({g.shape[0]}) != input batch size ({x.shape[0]})")
        return g.to(device=x.device, dtype=x.dtype)


class MoLALinear(_MoLALayer):
    """``nn.Linear`` with ``E`` low-rank experts mixed per sample: ``y = W x + b + (α/r) Σ_e g_e B_e A_e x``.

    The experts are applied in factorised form (``A_e x`` then ``B_e ·``), so no per-sample dense weight is
    ever materialised. Inputs may carry extra middle dimensions (``(B, ..., in)``, e.g. tokens); the gate of
    sample ``b`` then applies to all of its positions.

    Args:
        base: the linear layer to adapt; it stays trainable and is stored as ``self.base``.
        num_experts: ``E`` (MoLA-Grad: the number of tasks).
        rank: ``r`` of every expert.
        alpha: ``α``; the expert output is scaled by ``α / r`` (official default ``α = 16``).
    """

    def __init__(self, base: nn.Linear, *, num_experts: int, rank: int, alpha: float = 16.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"mola: MoLALinear needs an nn.Linear, got {type(base).__name__}")
        self.num_experts = v.integer("mola", "num_experts", num_experts, minimum=1)
        self.rank = v.integer("mola", "rank", rank, minimum=1)
        self.alpha = v.positive("mola", "alpha", alpha)
        self.scaling = self.alpha / self.rank
        self.base = base
        w = base.weight
        self.lora_A = nn.Parameter(w.new_empty(num_experts, rank, base.in_features))
        self.lora_B = nn.Parameter(w.new_zeros(num_experts, base.out_features, rank))
        self.gates = None
        self.reset_lora_parameters()

    def delta_weight(self) -> torch.Tensor:
        """The dense expert updates ``ΔW_e = (α/r) B_e A_e``, shape ``(E, out, in)``."""
        return torch.einsum("eor,eri->eoi", self.lora_B, self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor, gates: torch.Tensor | None = None) -> torch.Tensor:
        """Args: x ``(B, ..., in)``; gates ``(B, E)`` (default: the gates set by :meth:`set_gates`)."""
        if x.dim() < 2:
            raise ValueError(f"mola: MoLALinear input must be (batch, ..., in_features), got shape {tuple(x.shape)}")
        g = self._resolve_gates(x, gates)
        h = torch.einsum("b...i,eri->b...er", x, self.lora_A)  # A_e x for every expert
        h = h * g.view(g.shape[0], *([1] * (x.dim() - 2)), self.num_experts, 1)
        return self.base(x) + torch.einsum("b...er,eor->b...o", h, self.lora_B) * self.scaling

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, rank={self.rank}, alpha={self.alpha}"

    @torch.no_grad()
    def merged(self, weights: torch.Tensor) -> nn.Linear:
        """A copy of the base layer with ``W + Σ_e w_e ΔW_e`` folded in (``weights``: ``(E,)``)."""
        out = copy.deepcopy(self.base)
        d = torch.einsum("e,eoi->oi", weights.to(self.lora_A), self.delta_weight())
        out.weight.add_(d.to(out.weight.dtype))
        return out


class MoLAConv2d(_MoLALayer):
    """``nn.Conv2d`` with ``E`` low-rank kernel-space experts mixed per sample.

    Expert ``e`` has ``A_e ∈ R^{(r·k_h) × (C_in/groups · k_w)}`` and ``B_e ∈ R^{(C_out·k_h) × (r·k_h)}``;
    ``ΔW_e = (α/r) · (B_e A_e).view(C_out, C_in/groups, k_h, k_w)`` (the loralib / official weight-space form,
    not peft's conv-then-1×1 form). By linearity in the kernel,
    ``conv(x_i, W + Σ_e g_{i,e} ΔW_e) = conv(x_i, W) + Σ_e g_{i,e} conv(x_i, ΔW_e)``, computed in one convolution
    with the ``E + 1`` kernels stacked along the output channels.

    Args:
        base: the convolution to adapt (``padding_mode="zeros"``); it stays trainable as ``self.base``.
        num_experts: ``E``.
        rank: ``r``.
        alpha: ``α``; experts are scaled by ``α / r``.
    """

    def __init__(self, base: nn.Conv2d, *, num_experts: int, rank: int, alpha: float = 16.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Conv2d):
            raise TypeError(f"mola: MoLAConv2d needs an nn.Conv2d, got {type(base).__name__}")
        if base.padding_mode != "zeros":
            raise ValueError(f"mola: MoLAConv2d supports padding_mode='zeros' only, got {base.padding_mode!r}")
        self.num_experts = v.integer("mola", "num_experts", num_experts, minimum=1)
        self.rank = v.integer("mola", "rank", rank, minimum=1)
        self.alpha = v.positive("mola", "alpha", alpha)
        self.scaling = self.alpha / self.rank
        self.base = base
        kh, kw = base.kernel_size
        cin_g = base.in_channels // base.groups
        w = base.weight
        self.lora_A = nn.Parameter(w.new_empty(num_experts, rank * kh, cin_g * kw))
        self.lora_B = nn.Parameter(w.new_zeros(num_experts, base.out_channels * kh, rank * kh))
        self.gates = None
        self.reset_lora_parameters()

    def delta_weight(self) -> torch.Tensor:
        """The expert kernels ``ΔW_e``, shape ``(E, C_out, C_in/groups, k_h, k_w)``."""
        d = torch.einsum("eor,eri->eoi", self.lora_B, self.lora_A) * self.scaling
        return d.reshape(self.num_experts, *self.base.weight.shape)

    def forward(self, x: torch.Tensor, gates: torch.Tensor | None = None) -> torch.Tensor:
        """Args: x ``(B, C_in, H, W)``; gates ``(B, E)`` (default: the gates set by :meth:`set_gates`)."""
        if x.dim() != 4:
            raise ValueError(f"mola: MoLAConv2d input must be (batch, C, H, W), got shape {tuple(x.shape)}")
        g = self._resolve_gates(x, gates)
        conv, E, G = self.base, self.num_experts, self.base.groups
        cout = conv.out_channels
        kernels = torch.cat([conv.weight.unsqueeze(0), self.delta_weight()], dim=0)  # (E+1, C_out, C_in/G, kh, kw)
        # order the stacked output channels group-major so that a grouped conv keeps each group's inputs
        kernels = kernels.reshape(E + 1, G, cout // G, *kernels.shape[2:]).transpose(0, 1)
        out = F.conv2d(x, kernels.reshape(-1, *kernels.shape[3:]), None, conv.stride, conv.padding, conv.dilation, G)
        b, _, h, w = out.shape
        out = out.view(b, G, E + 1, cout // G, h, w).transpose(1, 2).reshape(b, E + 1, cout, h, w)
        y = out[:, 0] + torch.einsum("be,bechw->bchw", g, out[:, 1:])
        if conv.bias is not None:
            y = y + conv.bias.view(1, -1, 1, 1)
        return y

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, rank={self.rank}, alpha={self.alpha}"

    @torch.no_grad()
    def merged(self, weights: torch.Tensor) -> nn.Conv2d:
        """A copy of the base convolution with ``W + Σ_e w_e ΔW_e`` folded in (``weights``: ``(E,)``)."""
        out = copy.deepcopy(self.base)
        d = torch.einsum("e,e...->...", weights.to(self.lora_A), self.delta_weight())
        out.weight.add_(d.to(out.weight.dtype))
        return out


class TaskGate(nn.Module):
    """MoLA-Grad gate: ``g_i = onehot(t_i)``, the adapter of sample ``i`` is chosen by its task id ``t_i``.

    Args:
        num_experts: ``E`` (= number of tasks).
    """

    def __init__(self, *, num_experts: int) -> None:
        super().__init__()
        self.num_experts = v.integer("mola", "num_experts", num_experts, minimum=1)

    def forward(self, task_ids: torch.Tensor) -> torch.Tensor:
        """Args: task_ids ``(B,)`` integer tensor in ``[0, E)``. Returns the float gates ``(B, E)``."""
        if not isinstance(task_ids, torch.Tensor) or task_ids.dim() != 1:
            raise ValueError("mola: task_ids must be a 1-D integer tensor of shape (batch,)")
        if task_ids.dtype.is_floating_point or task_ids.dtype.is_complex or task_ids.dtype == torch.bool:
            raise TypeError(f"mola: task_ids must be an integer tensor, got dtype {task_ids.dtype}")
        if task_ids.numel() and (int(task_ids.min()) < 0 or int(task_ids.max()) >= self.num_experts):
            raise ValueError(f"mola: task ids must be in [0, num_experts={self.num_experts}), got min "
                             f"{int(task_ids.min())}, max {int(task_ids.max())}")
        return F.one_hot(task_ids.long(), self.num_experts).float()

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}"


class Router(nn.Module):
    """MoLA-Router gate: logits ``z = router(x)`` from the raw input, gates ``g = softmax(z)``.

    One router is shared by every adapted layer (as in the official ``ResNetSoftMOE``). By default it is an
    MLP on the flattened input; pass ``net`` to use any module mapping the input to ``(B, E)`` logits (the
    official code uses a CIFAR ResNet-20 on the image). ``embed`` is the trainable projection
    ``u = Linear(E, embed_dim)(z)`` on which the Task-wise Decorrelation loss is computed (official
    ``map_to_high_dim``, 32 dims); it does not influence the forward pass.

    Args:
        num_experts: ``E``.
        in_features: flattened input size (needed unless ``net`` is given).
        hidden: hidden widths of the default MLP router.
        net: a custom router network (input -> ``(B, E)`` logits).
        embed_dim: width of the TwD projection (0: ``embed`` is the identity on the logits).
    """

    def __init__(self, *, num_experts: int, in_features: int | None = None, hidden: Sequence[int] = (32,),
                 net: nn.Module | None = None, embed_dim: int = 32) -> None:
        super().__init__()
        self.num_experts = v.integer("mola", "num_experts", num_experts, minimum=1)
        v.integer("mola", "embed_dim", embed_dim, minimum=0)
        if net is None:
            if in_features is None:
                raise ValueError("mola: Router needs in_features (or a custom net)")
            v.integer("mola", "in_features", in_features, minimum=1)
            widths = [in_features, *hidden]
            layers: list[nn.Module] = [nn.Flatten(1)]
            for a, b in zip(widths[:-1], widths[1:], strict=True):
                layers += [nn.Linear(a, v.integer("mola", "hidden width", b, minimum=1)), nn.ReLU()]
            layers.append(nn.Linear(widths[-1], num_experts))
            net = nn.Sequential(*layers)
        elif not isinstance(net, nn.Module):
            raise TypeError(f"mola: Router net must be an nn.Module, got {type(net).__name__}")
        self.net = net
        self.proj = nn.Linear(num_experts, embed_dim) if embed_dim > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Router logits ``z`` of shape ``(B, E)``."""
        z = self.net(x)
        if z.dim() != 2 or z.shape != (x.shape[0], self.num_experts):
            raise ValueError(f"mola: router output must have shape (batch={x.shape[0]}, "
                             f"num_experts={self.num_experts}), got {tuple(z.shape)}")
        return z

    @staticmethod
    def gates(logits: torch.Tensor) -> torch.Tensor:
        """``g = softmax(z)`` in float32 (dense, no top-k, as in the official ``SoftLoraConv``)."""
        return torch.softmax(logits.float(), dim=-1)

    def embed(self, logits: torch.Tensor) -> torch.Tensor:
        """The TwD embedding ``u = proj(z)``."""
        return self.proj(logits)


_INPUT_KEYS = ("x", "input", "inputs", "input_ids", "pixel_values", "inputs_embeds", "features")


class MoLAModel(nn.Module):
    """A model whose target layers were swapped for MoLA layers, plus the gate that drives them.

    ``forward(x, task_ids=...)`` or ``forward(**batch)`` computes the gates once per batch (one-hot task vectors
    for :class:`TaskGate`, ``softmax(router(x))`` for :class:`Router`), puts them in the model's
    :class:`GateContext` (read by every MoLA layer) and runs the wrapped model. The gates stay in the context
    until the next forward, so checkpoint recomputation in the backward uses them. The last router logits /
    gates are kept in ``last_logits`` / ``last_gates`` (e.g. for :func:`icml24.mola.twd_loss` on
    ``router.embed(last_logits)``).

    Args:
        model: the wrapped model (already containing the MoLA layers).
        gate: a :class:`TaskGate` or a :class:`Router`.
    """

    def __init__(self, model: nn.Module, *, gate: TaskGate | Router) -> None:
        super().__init__()
        if not isinstance(gate, (TaskGate, Router)):
            raise TypeError(f"mola: gate must be a TaskGate or a Router, got {type(gate).__name__}")
        self.model = model
        self.gate = gate
        self.gate_context = GateContext()
        for m in self.mola_layers:
            m.gate_context = self.gate_context
        self.last_logits: torch.Tensor | None = None
        self.last_gates: torch.Tensor | None = None

    @property
    def mola_layers(self) -> list[_MoLALayer]:
        return [m for m in self.model.modules() if isinstance(m, _MoLALayer)]

    @property
    def router(self) -> Router | None:
        return self.gate if isinstance(self.gate, Router) else None

    def compute_gates(self, x: torch.Tensor | None, task_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The gates ``(B, E)`` for a batch (sets ``last_logits`` for a router)."""
        if isinstance(self.gate, TaskGate):
            if task_ids is None:
                raise ValueError("mola: MoLA-Grad (TaskGate) needs task_ids=(batch,) in forward")
            g = self.gate(task_ids)
            self.last_logits = None
        else:
            if x is None:
                raise ValueError("mola: the router needs an input")
            self.last_logits = self.gate(x)
            g = Router.gates(self.last_logits)
        self.last_gates = g
        return g

    def forward(self, *args: Any, task_ids: torch.Tensor | None = None, router_input: torch.Tensor | None = None,
                **kwargs: Any) -> Any:
        """Run the wrapped model with per-sample gates: ``model(x, task_ids=t)`` or ``model(**batch)``.

        Args:
            *args, **kwargs: passed to the wrapped model unchanged. The batch input ``x`` (router input and
                batch size) is the first positional argument, else the first of ``x``, ``input``, ``inputs``,
                ``input_ids``, ``pixel_values``, ``inputs_embeds``, ``features`` found in ``kwargs``.
            task_ids: ``(B,)`` task ids, required for MoLA-Grad (ignored by the router); a batch dict may carry
                them under the key ``task_ids``.
            router_input: what the router reads, when not ``x``.
        """
        if args:
            x = args[0]
        else:
            x = next((kwargs[k] for k in _INPUT_KEYS if k in kwargs), None)
            if x is None:
                raise ValueError(f"mola: no model input: pass it positionally or as one of {_INPUT_KEYS}")
        g = self.compute_gates(router_input if router_input is not None else x, task_ids)
        if g.shape[0] != x.shape[0]:
            raise ValueError(f"mola: {g.shape[0]} gates for a batch of {x.shape[0]}")
        self.gate_context.gates = g.to(x.device)
        return self.model(*args, **kwargs)

    def checkpoint_context_fn(self) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        """``context_fn`` for non-reentrant ``torch.utils.checkpoint.checkpoint``: the recomputation of a
        checkpointed segment runs with the gates of the forward that created it (needed only when several
        forwards precede one backward)."""
        return contextlib.nullcontext(), self.gate_context.use(self.gate_context.gates)

    @torch.no_grad()
    def merge(self, task_id: int | None = None, *, weights: torch.Tensor | None = None) -> nn.Module:
        """A plain copy of the wrapped model with one task's adapters folded into the weights.

        Every MoLA layer becomes its base ``nn.Linear``/``nn.Conv2d`` with ``W + Σ_e w_e ΔW_e``, where ``w`` is
        ``onehot(task_id)`` (MoLA-Grad: task ``task_id``'s expert) or the given ``weights`` (``(E,)``, e.g. a
        router's mean gate). The copy needs no gates and no task ids: ``merged(x)`` equals
        ``model(x, task_ids=full(task_id))``. The MoLA model itself is not changed.

        Args:
            task_id: the task (expert) to fold in, in ``[0, E)``.
            weights: instead of ``task_id``, an ``(E,)`` expert mixture.
        """
        layers = self.mola_layers
        num_experts = layers[0].num_experts if layers else getattr(self.gate, "num_experts", 1)
        if (task_id is None) == (weights is None):
            raise ValueError("mola: merge needs exactly one of task_id and weights")
        if task_id is not None:
            task_id = v.integer("mola", "task_id", task_id, minimum=0, maximum=num_experts - 1)
            w = F.one_hot(torch.tensor(task_id), num_experts).double()
        else:
            v.tensor("mola", "weights", weights, ndim=1, floating=True)
            if weights.shape[0] != num_experts:
                raise ValueError(f"mola: weights must have shape ({num_experts},), got {tuple(weights.shape)}")
            w = weights.detach()
        merged = copy.deepcopy(self.model)
        for name, m in list(merged.named_modules()):
            if isinstance(m, _MoLALayer):  # apply_mola never adapts the root module itself, so name != ""
                parent_name, _, child = name.rpartition(".")
                parent = merged.get_submodule(parent_name) if parent_name else merged
                setattr(parent, child, m.merged(w))
        return merged


def _matches(name: str, target: str | Sequence[str]) -> bool:
    if isinstance(target, str):  # a regular expression over the full module name (peft convention)
        return re.fullmatch(target, name) is not None
    return any(name == t or name.endswith("." + t) for t in target)


def apply_mola(model: nn.Module, *, target_modules: str | Sequence[str], num_experts: int, rank: int,
               alpha: float = 16.0, router: Router | None = None, freeze_backbone: bool = False) -> MoLAModel:
    """Swap the target ``nn.Linear`` / ``nn.Conv2d`` layers of ``model`` (in place) for MoLA layers.

    By default nothing is frozen: the backbone, the adapters (and the router) are trained jointly, as in the
    paper. ``freeze_backbone=True`` sets ``requires_grad=False`` on every parameter of ``model`` except the
    experts ``lora_A``/``lora_B`` (the router stays trainable), as in adapter fine-tuning.

    Args:
        model: any ``nn.Module``.
        target_modules: a regular expression matched against full module names, or a list of names where
            each entry matches a module whose name equals it or ends with ``"." + entry`` (peft convention).
        num_experts: ``E`` (MoLA-Grad: the number of tasks; MoLA-Router: the number of experts).
        rank: ``r`` of each expert.
        alpha: ``α`` (scale ``α / r``; official default 16).
        router: ``None`` for MoLA-Grad (a :class:`TaskGate` picks the adapter from the task id), or a
            :class:`Router` for MoLA-Router (its ``num_experts`` must equal ``num_experts``).
        freeze_backbone: freeze every non-expert parameter of ``model``.

    Returns:
        A :class:`MoLAModel` wrapping ``model``; call it as ``wrapped(x, task_ids=t)``.

    Raises:
        ValueError: ``num_experts < 1``, ``rank < 1``, ``alpha <= 0``, target modules matching nothing, or a
            router with a different number of experts.
        TypeError: a matched module that is neither ``nn.Linear`` nor ``nn.Conv2d``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"mola: model must be an nn.Module, got {type(model).__name__}")
    v.integer("mola", "num_experts", num_experts, minimum=1)
    v.integer("mola", "rank", rank, minimum=1)
    v.positive("mola", "alpha", alpha)
    if not isinstance(target_modules, str) and (
            not isinstance(target_modules, Sequence) or not all(isinstance(t, str) for t in target_modules)):
        raise TypeError("mola: target_modules must be a regex string or a sequence of module names")
    if not isinstance(freeze_backbone, bool):
        raise v.ArgumentTypeError(f"mola: freeze_backbone must be a bool, got {type(freeze_backbone).__name__}")
    if router is not None:
        if not isinstance(router, Router):
            raise TypeError(f"mola: router must be an icml24.mola.Router or None, got {type(router).__name__}")
        if router.num_experts != num_experts:
            raise ValueError(f"mola: router.num_experts ({router.num_experts}) != num_experts ({num_experts})")
    inside_mola = {n for n, m in model.named_modules() if isinstance(m, _MoLALayer)}
    targets = [(n, m) for n, m in model.named_modules()
               if n and _matches(n, target_modules) and not any(n == p or n.startswith(p + ".") for p in inside_mola)]
    if not targets:
        candidates = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        raise ValueError(f"mola: target_modules {target_modules!r} match no module; Linear/Conv2d modules are: "
                         f"{candidates[:20]}")
    for n, m in targets:
        if not isinstance(m, (nn.Linear, nn.Conv2d)):
            raise TypeError(f"mola: target module {n!r} is a {type(m).__name__}; only nn.Linear and nn.Conv2d "
                            "can be adapted")
    for n, m in targets:
        cls = MoLALinear if isinstance(m, nn.Linear) else MoLAConv2d
        parent_name, _, child = n.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, cls(m, num_experts=num_experts, rank=rank, alpha=alpha))
    gate: TaskGate | Router = router if router is not None else TaskGate(num_experts=num_experts)
    if freeze_backbone:
        for m in model.modules():
            for pname, p in m.named_parameters(recurse=False):
                p.requires_grad_(isinstance(m, _MoLALayer) and pname in ("lora_A", "lora_B"))
    return MoLAModel(model, gate=gate)

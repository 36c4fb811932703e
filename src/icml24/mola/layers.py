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
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v

__all__ = ["MoLALinear", "MoLAConv2d", "TaskGate", "Router", "MoLAModel", "GateContext", "apply_mola"]


def _conv1d_class() -> type | None:
    """transformers' ``Conv1D`` if transformers is already imported (no instance can exist otherwise)."""
    mod = sys.modules.get("transformers.pytorch_utils")
    return getattr(mod, "Conv1D", None) if mod is not None else None


def _is_conv1d(m: nn.Module) -> bool:
    cls = _conv1d_class()
    return cls is not None and isinstance(m, cls)


def _is_linear_like(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or _is_conv1d(m)


class GateContext:
    """The per-sample gates ``(B, E)`` of the current forward, shared by every MoLA layer of one model.

    A plain object (not a module, not a buffer): it is not saved in ``state_dict`` and is shared, not copied,
    by the layers. ``gates`` is ``None`` before the first forward.
    """

    def __init__(self) -> None:
        self.gates: torch.Tensor | None = None
        # during MoLAModel.generate only: a layer input with k × the gates' batch (beams / returned sequences,
        # expanded by Hugging Face with repeat_interleave) gets each gate repeated k times
        self.expand: bool = False

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
        if g.requires_grad and not torch.is_grad_enabled():
            # the first pass of torch.utils.checkpoint(use_reentrant=True) runs without grad; its recomputation
            # would then backpropagate into the router graph a second time (torch's raw "backward through the
            # graph a second time" error), so refuse here with what to use instead
            raise RuntimeError(
                "mola: this MoLA layer runs with gradients disabled but its gates require grad (MoLA-Router). "
                "This happens under torch.utils.checkpoint(..., use_reentrant=True) (also Hugging Face "
                "gradient_checkpointing_enable() with use_reentrant=True), which cannot backpropagate into the "
                "router: use use_reentrant=False (HF: gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                "{'use_reentrant': False})), or detach the gates to train without router gradients. (It also happens when "
                "the wrapped model is called directly under torch.no_grad() after a training forward left its "
                "gates: call the MoLAModel, or MoLAModel.generate, which compute the gates for the new input.)")
        if (gates is None and self.gates is None and self.gate_context is not None and self.gate_context.expand
                and g.shape[0] != x.shape[0] and g.shape[0] > 0 and x.shape[0] % g.shape[0] == 0):
            g = g.repeat_interleave(x.shape[0] // g.shape[0], dim=0)
        if g.shape[0] != x.shape[0]:
            raise ValueError(f"mola: gates batch size ({g.shape[0]}) != input batch size ({x.shape[0]})")
        return g.to(device=x.device, dtype=x.dtype)


class MoLALinear(_MoLALayer):
    """``nn.Linear`` with ``E`` low-rank experts mixed per sample: ``y = W x + b + (α/r) Σ_e g_e B_e A_e x``.

    The experts are applied in factorised form (``A_e x`` then ``B_e ·``), so no per-sample dense weight is
    ever materialised. Inputs may carry extra middle dimensions (``(B, ..., in)``, e.g. tokens); the gate of
    sample ``b`` then applies to all of its positions. The base may also be transformers' ``Conv1D`` (GPT-2),
    which stores its weight transposed (``y = x W + b``, ``W`` of shape ``(in, out)``); the experts keep the
    ``Linear`` orientation (``ΔW_e`` is ``(out, in)``) and :meth:`merged` adds ``ΔW_eᵀ`` to a ``Conv1D``.

    Args:
        base: the ``nn.Linear`` (or ``Conv1D``) to adapt; it stays trainable and is stored as ``self.base``.
        num_experts: ``E`` (MoLA-Grad: the number of tasks).
        rank: ``r`` of every expert.
        alpha: ``α``; the expert output is scaled by ``α / r`` (official default ``α = 16``).
    """

    def __init__(self, base: nn.Module, *, num_experts: int, rank: int, alpha: float = 16.0) -> None:
        super().__init__()
        if not _is_linear_like(base):
            raise TypeError(f"mola: MoLALinear needs an nn.Linear or transformers' Conv1D, got {type(base).__name__}")
        self.num_experts = v.integer("mola", "num_experts", num_experts, minimum=1)
        self.rank = v.integer("mola", "rank", rank, minimum=1)
        self.alpha = v.positive("mola", "alpha", alpha)
        self.scaling = self.alpha / self.rank
        self.base = base
        w = base.weight
        self.fan_in_fan_out = not isinstance(base, nn.Linear)  # Conv1D: weight (in, out)
        self.in_features, self.out_features = (w.shape[0], w.shape[1]) if self.fan_in_fan_out else (w.shape[1],
                                                                                                      w.shape[0])
        self.lora_A = nn.Parameter(w.new_empty(num_experts, rank, self.in_features))
        self.lora_B = nn.Parameter(w.new_zeros(num_experts, self.out_features, rank))
        self.gates = None
        self.reset_lora_parameters()

    def delta_weight(self) -> torch.Tensor:
        """The dense expert updates ``ΔW_e = (α/r) B_e A_e``, shape ``(E, out, in)`` (also for a ``Conv1D``)."""
        return torch.einsum("eor,eri->eoi", self.lora_B, self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor, gates: torch.Tensor | None = None) -> torch.Tensor:
        """Args: x ``(B, ..., in)``; gates ``(B, E)`` (default: the gates set by :meth:`set_gates`)."""
        if x.dim() < 2:
            raise ValueError(f"mola: MoLALinear input must be (batch, ..., in_features), got shape {tuple(x.shape)}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"mola: MoLALinear input has {x.shape[-1]} features, the layer takes {self.in_features}")
        g = self._resolve_gates(x, gates)
        h = torch.einsum("b...i,eri->b...er", x, self.lora_A)  # A_e x for every expert
        h = h * g.view(g.shape[0], *([1] * (x.dim() - 2)), self.num_experts, 1)
        return self.base(x) + torch.einsum("b...er,eor->b...o", h, self.lora_B) * self.scaling

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, rank={self.rank}, alpha={self.alpha}"

    @torch.no_grad()
    def merged(self, weights: torch.Tensor) -> nn.Module:
        """A copy of the base layer with ``W + Σ_e w_e ΔW_e`` folded in (``weights``: ``(E,)``)."""
        out = copy.deepcopy(self.base)
        d = torch.einsum("e,eoi->oi", weights.to(self.lora_A), self.delta_weight())
        out.weight.add_((d.t() if self.fan_in_fan_out else d).to(out.weight.dtype))
        return out


class MoLAConv2d(_MoLALayer):
    """``nn.Conv2d`` with ``E`` low-rank kernel-space experts mixed per sample.

    Expert ``e`` has ``A_e ∈ R^{(r·k_h) × (C_in/groups · k_w)}`` and ``B_e ∈ R^{(C_out·k_h) × (r·k_h)}``;
    ``ΔW_e = (α/r) · (B_e A_e).view(C_out, C_in/groups, k_h, k_w)`` (the loralib / official weight-space form,
    not peft's conv-then-1×1 form). Two equal computations (``impl``):

    - ``"per_sample"`` (default, as the official ``MultiLoraConv2dV2``): each sample's kernel
      ``W_i = W + Σ_e g_{i,e} ΔW_e`` is built and the batch runs as one grouped convolution (batch folded into
      the groups): the FLOPs of the base convolution plus ``B·E·|W|`` for the kernels, and ``B`` kernels in memory;
    - ``"stacked"``: by linearity in the kernel, ``conv(x_i, W) + Σ_e g_{i,e} conv(x_i, ΔW_e)`` in one
      convolution with the ``E + 1`` kernels stacked along the output channels: ``E + 1`` times the FLOPs of the
      base convolution and ``E + 1`` output maps, no per-sample kernels (for huge kernels × batches).

    Args:
        base: the convolution to adapt (``padding_mode="zeros"``); it stays trainable as ``self.base``.
        num_experts: ``E``.
        rank: ``r``.
        alpha: ``α``; experts are scaled by ``α / r``.
        impl: ``"per_sample"`` or ``"stacked"`` (an attribute; may be changed later).
    """

    IMPLS = ("per_sample", "stacked")

    def __init__(self, base: nn.Conv2d, *, num_experts: int, rank: int, alpha: float = 16.0,
                 impl: str = "per_sample") -> None:
        super().__init__()
        self.impl = v.one_of("mola", "impl", impl, self.IMPLS)
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
        if x.shape[1] != self.base.in_channels:
            raise ValueError(f"mola: MoLAConv2d input has {x.shape[1]} channels, the layer takes "
                             f"{self.base.in_channels}")
        if self.impl not in self.IMPLS:
            raise ValueError(f"mola: MoLAConv2d impl must be one of {self.IMPLS}, got {self.impl!r}")
        g = self._resolve_gates(x, gates)
        if self.impl == "per_sample":
            return self._forward_per_sample(x, g)
        return self._forward_stacked(x, g)

    def _forward_per_sample(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        conv, b = self.base, x.shape[0]
        kernels = conv.weight + torch.einsum("be,e...->b...", g, self.delta_weight())  # W_i, (B, C_out, C_in/G, kh, kw)
        out = F.conv2d(x.reshape(1, -1, *x.shape[2:]), kernels.reshape(-1, *kernels.shape[2:]), None, conv.stride,
                       conv.padding, conv.dilation, b * conv.groups)  # sample i's channels only meet W_i
        out = out.view(b, conv.out_channels, *out.shape[2:])
        if conv.bias is not None:
            out = out + conv.bias.view(1, -1, 1, 1)
        return out

    def _forward_stacked(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
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
        return f"num_experts={self.num_experts}, rank={self.rank}, alpha={self.alpha}, impl={self.impl!r}"

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
_SAVE_FORMAT = 1
_SAVE_CONFIG = "mola_config.json"
_SAVE_ADAPTERS = "mola_adapters.pt"


class _InnerSaveRefused:
    """Replaces ``save_pretrained`` on a model wrapped by :class:`MoLAModel` (see there)."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("mola: this model contains MoLA layers; its own save_pretrained would store the adapted "
                           "layers' weights as '<name>.base.weight', which from_pretrained does not load (it "
                           "re-initialises them). Save the wrapper instead: mola_model.save_pretrained(dir), and "
                           "load it with MoLAModel.from_pretrained(dir, model_class=...); or save "
                           "mola_model.merge(task_id), a plain model")


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
        if callable(getattr(type(model), "save_pretrained", None)):
            # the wrapped model's own save_pretrained would store the adapted layers' weights as `<name>.base.*`,
            # which a plain from_pretrained does not load (it re-initialises them): refuse it, point to ours
            model.__dict__["save_pretrained"] = _InnerSaveRefused()

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

    def generate(self, *args: Any, task_ids: torch.Tensor | None = None, router_input: torch.Tensor | None = None,
                 **kwargs: Any) -> Any:
        """The wrapped model's ``generate`` (Hugging Face) with the gates of the prompt held for every step.

        The gates are computed once, as :meth:`forward` does, from the prompt (``input_ids`` / ``inputs`` /
        ``inputs_embeds``, the first positional argument, or ``router_input``) and ``task_ids`` (MoLA-Grad), and
        stay fixed while the sequence grows (with or without the KV cache). Where ``generate`` expands the batch
        (``num_beams``, ``num_return_sequences``: each prompt repeated ``k`` times in place), each gate is repeated
        with its prompt.

        Args:
            *args, **kwargs: passed to the wrapped model's ``generate`` unchanged.
            task_ids: ``(B,)`` task ids of the prompts (MoLA-Grad).
            router_input: what the router reads, when not the prompt.

        Raises:
            TypeError: the wrapped model has no ``generate``.
            ValueError: no prompt found, or gates that do not match its batch.
        """
        gen = getattr(self.model, "generate", None)
        if not callable(gen):
            raise TypeError(f"mola: the wrapped model ({type(self.model).__name__}) has no generate(); generation "
                            "needs a Hugging Face generative model (GenerationMixin)")
        if args:
            x = args[0]
        else:
            x = next((kwargs[k] for k in ("input_ids", "inputs", "inputs_embeds") if kwargs.get(k) is not None), None)
        if not isinstance(x, torch.Tensor):
            raise ValueError("mola: generate needs the prompt as a tensor: positionally or as input_ids=, inputs= "
                             "or inputs_embeds=")
        with torch.no_grad():  # generate runs without grad; gates requiring grad would be refused by the layers
            g = self.compute_gates(router_input if router_input is not None else x, task_ids)
        if g.shape[0] != x.shape[0]:
            raise ValueError(f"mola: {g.shape[0]} gates for a prompt batch of {x.shape[0]}")
        ctx = self.gate_context
        prev_expand, ctx.expand = ctx.expand, True
        try:
            with ctx.use(g.to(x.device)):
                return gen(*args, **kwargs)
        finally:
            ctx.expand = prev_expand

    def _layer_config(self) -> dict[str, Any]:
        named = [(n, m) for n, m in self.model.named_modules() if isinstance(m, _MoLALayer)]
        if not named:
            raise ValueError("mola: the model has no MoLA layer to save")
        first = named[0][1]
        for n, m in named:
            if (m.num_experts, m.rank, m.alpha) != (first.num_experts, first.rank, first.alpha):
                raise ValueError(f"mola: save_pretrained needs one (num_experts, rank, alpha) for every layer (as "
                                 f"apply_mola builds); {n!r} has ({m.num_experts}, {m.rank}, {m.alpha}), "
                                 f"{named[0][0]!r} ({first.num_experts}, {first.rank}, {first.alpha})")
        return {"format": _SAVE_FORMAT, "layers": [n for n, _ in named], "num_experts": first.num_experts,
                "rank": first.rank, "alpha": first.alpha,
                "conv_impl": {n: m.impl for n, m in named if isinstance(m, MoLAConv2d)},
                "gate": "router" if isinstance(self.gate, Router) else "task"}

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """Save a wrapped Hugging Face model so that :meth:`from_pretrained` gives the same outputs.

        Writes the backbone with the wrapped model's ``save_pretrained`` in its **original layout** (each adapted
        layer's (trained) base weights under the plain layer's names, so ``ModelClass.from_pretrained(dir)``
        loads the backbone without re-initialising anything), and beside it ``mola_config.json`` (adapted
        layer names, ``E``, ``r``, ``α``, gate kind) and ``mola_adapters.pt`` (every ``lora_A``/``lora_B`` and
        the gate's state, e.g. the router's weights). ``requires_grad`` flags (``freeze_backbone``) are not saved.

        Args:
            save_directory: the folder (created if needed).
            **kwargs: passed to the wrapped model's ``save_pretrained`` (not ``state_dict``).

        Raises:
            TypeError: the wrapped model is not a Hugging Face model (use ``state_dict()`` for a plain module).
            ValueError: ``state_dict`` given, or layers with different ``(E, r, α)``.
        """
        save = getattr(type(self.model), "save_pretrained", None)
        if not callable(save):
            raise TypeError(f"mola: save_pretrained needs a Hugging Face model inside, got "
                            f"{type(self.model).__name__}; save a plain module with state_dict() and load it into "
                            "a model built by the same apply_mola call")
        if "state_dict" in kwargs:
            raise ValueError("mola: save_pretrained builds the state_dict itself; do not pass state_dict")
        cfg = self._layer_config()
        prefixes = [n + "." for n in cfg["layers"]]
        backbone: dict[str, torch.Tensor] = {}
        adapters: dict[str, torch.Tensor] = {}
        for key, t in self.model.state_dict().items():
            pre = next((p for p in prefixes if key.startswith(p)), None)
            if pre is None:
                backbone[key] = t
            elif key[len(pre):].startswith("base."):
                backbone[pre + key[len(pre) + 5:]] = t  # "<layer>.base.weight" -> "<layer>.weight"
            else:
                adapters["model." + key] = t.detach().cpu()
        adapters.update({"gate." + k: t.detach().cpu() for k, t in self.gate.state_dict().items()})
        save(self.model, save_directory, state_dict=backbone, **kwargs)
        with open(os.path.join(save_directory, _SAVE_CONFIG), "w") as f:
            json.dump(cfg, f, indent=2)
        torch.save(adapters, os.path.join(save_directory, _SAVE_ADAPTERS))

    @classmethod
    def from_pretrained(cls, save_directory: str | os.PathLike, *, model_class: Any, router: Router | None = None,
                        **kwargs: Any) -> MoLAModel:
        """Load what :meth:`save_pretrained` wrote: the backbone, the MoLA layers, their experts and the gate.

        Args:
            save_directory: the folder written by :meth:`save_pretrained`.
            model_class: the Hugging Face class to load the backbone with (e.g. ``GPT2LMHeadModel`` or
                ``AutoModelForCausalLM``); ``model_class.from_pretrained(save_directory, **kwargs)`` is called.
            router: for a saved MoLA-Router, a :class:`Router` of the same architecture (its weights are loaded
                from the folder; a router's ``net`` cannot be rebuilt from a file).
            **kwargs: passed to ``model_class.from_pretrained`` (e.g. ``torch_dtype``).

        Raises:
            FileNotFoundError: no ``mola_config.json`` in the folder.
            ValueError: a router missing for a saved router (or given for a saved task gate), an unknown format,
                or saved tensors that do not fit the rebuilt model.
        """
        cfg_path = os.path.join(save_directory, _SAVE_CONFIG)
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"mola: {cfg_path} not found; the folder was not written by "
                                    "MoLAModel.save_pretrained")
        with open(cfg_path) as f:
            cfg = json.load(f)
        if cfg.get("format") != _SAVE_FORMAT:
            raise ValueError(f"mola: unknown save format {cfg.get('format')!r} in {cfg_path}")
        if cfg["gate"] == "router" and router is None:
            raise ValueError("mola: the saved model is a MoLA-Router: pass router=Router(...) of the same "
                             "architecture (its weights are loaded from the folder)")
        if cfg["gate"] == "task" and router is not None:
            raise ValueError("mola: the saved model is MoLA-Grad (task gate); do not pass a router")
        if not callable(getattr(model_class, "from_pretrained", None)):
            raise TypeError(f"mola: model_class must have from_pretrained (a Hugging Face class), got {model_class!r}")
        base = model_class.from_pretrained(save_directory, **kwargs)
        wrapped = apply_mola(base, target_modules="|".join(re.escape(n) for n in cfg["layers"]),
                             num_experts=cfg["num_experts"], rank=cfg["rank"], alpha=cfg["alpha"], router=router)
        got = [n for n, m in wrapped.model.named_modules() if isinstance(m, _MoLALayer)]
        if got != cfg["layers"]:
            raise ValueError(f"mola: the loaded model's adapted layers {got} differ from the saved {cfg['layers']}")
        for n, impl in cfg.get("conv_impl", {}).items():
            wrapped.model.get_submodule(n).impl = impl
        state = torch.load(os.path.join(save_directory, _SAVE_ADAPTERS), map_location="cpu", weights_only=True)
        own = wrapped.state_dict()
        missing = [k for k in own if (".lora_" in k or k.startswith("gate.")) and k not in state]
        unexpected = [k for k in state if k not in own]
        if missing or unexpected:
            raise ValueError(f"mola: saved adapters do not fit the rebuilt model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        wrapped.load_state_dict(state, strict=False)
        return wrapped

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
        merged.__dict__.pop("save_pretrained", None)  # a plain model again: its own save_pretrained works
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
    """Swap the target ``nn.Linear`` / ``nn.Conv2d`` (and GPT-2 ``Conv1D``) layers of ``model`` for MoLA layers.

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
        TypeError: a matched module that is not an ``nn.Linear``, ``nn.Conv2d`` or transformers ``Conv1D``.
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
        candidates = [n for n, m in model.named_modules() if _is_linear_like(m) or isinstance(m, nn.Conv2d)]
        raise ValueError(f"mola: target_modules {target_modules!r} match no module; Linear/Conv1D/Conv2d modules "
                         f"are: {candidates[:20]}")
    for n, m in targets:
        if not (_is_linear_like(m) or isinstance(m, nn.Conv2d)):
            raise TypeError(f"mola: target module {n!r} is a {type(m).__name__}; only nn.Linear and nn.Conv2d "
                            "(and transformers' Conv1D) can be adapted")
    for n, m in targets:
        cls = MoLAConv2d if isinstance(m, nn.Conv2d) else MoLALinear
        parent_name, _, child = n.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, cls(m, num_experts=num_experts, rank=rank, alpha=alpha))
    gate: TaskGate | Router = router if router is not None else TaskGate(num_experts=num_experts)
    if freeze_backbone:
        for m in model.modules():
            for pname, p in m.named_parameters(recurse=False):
                p.requires_grad_(isinstance(m, _MoLALayer) and pname in ("lora_A", "lora_B"))
    return MoLAModel(model, gate=gate)

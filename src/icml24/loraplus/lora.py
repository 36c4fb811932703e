"""Light-weight LoRA for plain ``nn.Module``s: ``LoRALinear`` and ``apply_lora``.

LoRA (Hu et al. 2021) adapts a frozen ``W* ∈ R^{n_out×n_in}`` as

    h = W* x + (α / r) · B (A x),    A ∈ R^{r×n_in} ("down", reads the input),  B ∈ R^{n_out×r} ("up", writes the output)

Init[A] (PEFT's default, the LoRA+ paper's analysis): ``A ~ kaiming_uniform(a=√5)``, ``B = 0``.
Init[B] (the default of the peft fork pinned by the official LoRA+ code): ``B ~ kaiming_uniform(a=√5)``, ``A = 0``.
Both start with ``BA = 0``. Parameter names follow peft (``lora_A``, ``lora_B``) so the LoRA+ grouping rules apply to
both our layers and peft models unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from icml24.common import validate as v

__all__ = ["LoRALinear", "apply_lora", "lora_parameter_names"]


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update ``(α/r)·B A``.

    Args:
        base: the pretrained linear layer (its parameters are frozen).
        r: rank of the update (``r >= 1``).
        alpha: LoRA α; the update is scaled by ``α / r``.
        init: ``"A"`` (A random, B = 0; default) or ``"B"`` (B random, A = 0).
        dropout: dropout probability applied to the input of the adapter branch only.
    """

    def __init__(self, base: nn.Linear, *, r: int, alpha: float | None = None, init: Literal["A", "B"] = "A",
                 dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear: base must be an nn.Linear, got {type(base).__name__}")
        v.integer("LoRALinear", "r", r, minimum=1)
        alpha = v.positive("LoRALinear", "alpha", r if alpha is None else alpha)
        v.one_of("LoRALinear", "init", init, ("A", "B"))
        v.in_range("LoRALinear", "dropout", dropout, 0.0, 1.0, high_open=True)
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.r, self.alpha, self.init = r, alpha, init
        self.scaling = alpha / r
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.empty(base.out_features, r, device=w.device, dtype=w.dtype))
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_lora_parameters()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def reset_lora_parameters(self) -> None:
        """Init[A]: A ~ kaiming_uniform(a=√5), B = 0. Init[B]: B ~ kaiming_uniform(a=√5), A = 0."""
        random, zero = (self.lora_A, self.lora_B) if self.init == "A" else (self.lora_B, self.lora_A)
        nn.init.kaiming_uniform_(random, a=math.sqrt(5))
        nn.init.zeros_(zero)

    def lora_delta(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter branch ``(α/r) · B A dropout(x)``."""
        return (self.lora_dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """``(α/r) · B A``, the update to ``W*``."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_delta(x)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` with ``W* + (α/r) B A`` (for inference)."""
        out = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None,
                        device=self.base.weight.device, dtype=self.base.weight.dtype)
        out.weight.copy_(self.base.weight + self.delta_weight())
        if self.base.bias is not None:
            out.bias.copy_(self.base.bias)
        return out

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}, init={self.init}"


def _matches(name: str, targets: str | Sequence[str]) -> bool:
    if isinstance(targets, str):  # a regex on the full module name, as in peft
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def apply_lora(model: nn.Module, *, target_modules: str | Sequence[str], r: int, alpha: float | None = None,
               init: Literal["A", "B"] = "A", dropout: float = 0.0,
               modules_to_save: Sequence[str] = ()) -> nn.Module:
    """Replace the targeted ``nn.Linear`` layers of ``model`` by :class:`LoRALinear`, in place, and freeze the rest.

    Args:
        model: any ``nn.Module``.
        target_modules: module names or name suffixes (``["q_proj", "v_proj"]``), or one regex matched against the
            full module name (peft's convention).
        r: LoRA rank.
        alpha: LoRA α (default ``r``).
        init: ``"A"`` (default) or ``"B"``, see :class:`LoRALinear`.
        dropout: adapter-branch dropout.
        modules_to_save: names/suffixes of modules left trainable (e.g. a new classifier head).

    Returns:
        ``model`` (modified in place).

    Raises:
        ValueError: ``target_modules`` match no ``nn.Linear``; invalid ``r``/``alpha``/``init``.
    """
    v.integer("apply_lora", "r", r, minimum=1)
    if not target_modules:
        raise ValueError("apply_lora: target_modules is empty")
    targets = [(n, m) for n, m in model.named_modules() if n and _matches(n, target_modules)]
    linear = [(n, m) for n, m in targets if isinstance(m, nn.Linear)]
    if not linear:
        found = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        raise ValueError(f"apply_lora: target_modules {target_modules!r} match no nn.Linear; "
                         f"linear modules: {found[:20]}")
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in linear:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(module, r=r, alpha=alpha, init=init, dropout=dropout))
    for name, module in model.named_modules():
        if name and modules_to_save and _matches(name, modules_to_save):
            for p in module.parameters():
                p.requires_grad_(True)
    return model


def lora_parameter_names(model: nn.Module) -> list[str]:
    """Names of the trainable LoRA parameters (peft's and ours: names containing ``lora_``)."""
    return [n for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]

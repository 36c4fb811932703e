"""LoRA+ optimizer construction: the official parameter-grouping rules with η_B = λ · η_A.

Paper: "LoRA+: Efficient Low Rank Adaptation of Large Models" (Hayou, Ghosh, Yu), arXiv 2402.12354.
Official code: nikhil-ghosh-berkeley/loraplus (``lora_plus.py``); peft: ``peft.optimizers.create_loraplus_optimizer``.

For the LoRA update ``(α/r)·B A`` of a width-n layer, stable and efficient feature learning needs
``η_A = Θ(1/n)`` and ``η_B = Θ(1)`` (paper §4), so LoRA+ sets

    η_B = λ · η_A,   λ ≥ 1 fixed (default λ = 2^4 = 16)

Groups (official code and peft, in this order): ``A`` (lr η_A, weight decay), ``embedding`` (LoRA on embeddings,
lr ``loraplus_lr_embedding``), ``B`` (every ``lora_B`` and **every trainable 1-D tensor**, lr λ·η_A, weight
decay), ``B_no_decay`` (the members of B that are biases or norm parameters, lr λ·η_A, no decay). A norm parameter
is one held by an ``nn.LayerNorm``/``nn.RMSNorm`` (or a class named ``*LayerNorm``/``*RMSNorm``, e.g.
``LlamaRMSNorm``) or whose name matches ``transformers.Trainer``'s no-decay patterns (``bias``, ``layernorm``,
``rmsnorm``, ``(^|.)norm(.|$)``, ``_norm(.|$)``, on the lower-cased name).

Adapter names (one dotted component of the parameter name gives its role): ``lora_A`` / ``lora_B`` (peft, ours,
DyLoRA), ``lora_embedding_A`` / ``lora_embedding_B`` (peft embeddings), and kohya sd-scripts / LyCORIS
``lora_down`` (= A, reads the input) / ``lora_up`` (= B, writes the output), e.g.
``lora_unet_mid_block_attentions_0_proj_in.lora_up.weight``. peft's DoRA magnitude (``lora_magnitude_vector``) and
AdaLoRA's ``lora_E`` follow peft's rule (1-D → B, else A). Any other trainable parameter whose name contains the
word ``lora`` (``lora_mid``, diffusers' old ``to_q_lora.up``) is refused with a ``ValueError`` naming it, rather
than silently put in a group.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from icml24.common import validate as v

__all__ = ["loraplus_param_groups", "create_loraplus_optimizer", "GROUP_ORDER"]

GROUP_ORDER = ("A", "embedding", "B", "B_no_decay")
# NOTE(deviation): peft/official exclude only nn.LayerNorm parameters (and biases) from decay; we also exclude
# RMSNorm layers and, like transformers.Trainer.get_decay_parameter_names, parameters named like norms.
# Identical groups for models without such layers or names. nn.RMSNorm exists from torch 2.4 (the floor is 2.3).
_NO_DECAY_LAYERS: tuple[type[nn.Module], ...] = (nn.LayerNorm,) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())
_NO_DECAY_NAME = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")


def _no_decay(model: nn.Module, name: str) -> bool:
    if _NO_DECAY_NAME.search(name.lower()):
        return True
    owner = _owner(model, name, 1)
    if owner is None:
        return False
    cls = type(owner).__name__.lower()
    return isinstance(owner, _NO_DECAY_LAYERS) or cls.endswith(("layernorm", "rmsnorm"))


def _owner(model: nn.Module, name: str, strip: int) -> nn.Module | None:
    owner_name = ".".join(name.split(".")[:-strip])
    if not owner_name:
        return model if strip == 1 else None
    try:
        return model.get_submodule(owner_name)
    except AttributeError:
        return None


# Roles by dotted name component. kohya's ``lora_up``/``lora_down`` are B/A (sd-scripts ``networks/lora.py``).
_ROLE_OF_COMPONENT = {"lora_A": "A", "lora_down": "A", "lora_B": "B", "lora_up": "B",
                      "lora_embedding_A": "embedding", "lora_embedding_B": "embedding"}
# peft's other trainable LoRA tensors, grouped by peft's own rule (1-D → B, else A): DoRA, AdaLoRA.
_PEFT_EXTRAS = frozenset({"lora_magnitude_vector", "lora_E"})
_RECOGNISED = ", ".join(list(_ROLE_OF_COMPONENT) + sorted(_PEFT_EXTRAS))
_LORA_WORD = re.compile(r"(?<![a-z])lora(?![a-z])")  # "lora" as a word: lora_mid, to_q_lora; not "flora"


def _lora_role(name: str) -> str | None:
    """``"A"``, ``"B"``, ``"embedding"``, ``"peft"`` (a peft extra) or ``None`` (not an adapter parameter).

    Raises ``ValueError`` for a name that looks like an adapter (the word ``lora``, not inside another word) but has
    no recognised role component, or one with two different roles (e.g. ``...lora_up.lora_A``).
    """
    parts = name.split(".")
    roles = {_ROLE_OF_COMPONENT[c] for c in parts if c in _ROLE_OF_COMPONENT}
    if len(roles) > 1:
        raise ValueError(f"loraplus: parameter {name!r} names two adapter roles ({', '.join(sorted(roles))}); "
                         f"rename it so that one component is one of {_RECOGNISED}")
    if roles:
        return roles.pop()
    if any(c in _PEFT_EXTRAS for c in parts):
        return "peft"
    if _LORA_WORD.search(name.lower()):
        raise ValueError(f"loraplus: trainable parameter {name!r} looks like a LoRA adapter but has no recognised "
                         f"role component ({_RECOGNISED}), so its learning rate (η_A or λ·η_A) is unknown; "
                         "rename it, freeze it (requires_grad=False), or build the param groups yourself")
    return None


def _is_lora_embedding(model: nn.Module, name: str) -> bool:
    if "lora_embedding_" in name:
        return True
    try:  # peft's LoRA Embedding layer owns its adapters in ParameterDicts: strip two name parts
        from peft.tuners.lora.layer import Embedding as PeftLoraEmbedding
    except ImportError:
        return False
    return isinstance(_owner(model, name, 2), PeftLoraEmbedding)


def loraplus_param_groups(model: nn.Module, *, lr: float, loraplus_lr_ratio: float = 16.0,
                          weight_decay: float = 0.0, loraplus_lr_embedding: float = 1e-6) -> list[dict[str, Any]]:
    """The LoRA+ parameter groups of ``model`` (any optimizer accepts them).

    Args:
        model: a model whose trainable parameters include LoRA matrices named ``lora_A``/``lora_B`` (our
            :class:`~icml24.loraplus.LoRALinear` or a peft LoRA model) or kohya's ``lora_down``/``lora_up``.
        lr: η_A, the learning rate of the A matrices (and of trainable 2-D non-LoRA weights such as a new head).
        loraplus_lr_ratio: λ = η_B / η_A (≥ 1).
        weight_decay: decay of the A, embedding and B groups (0 for biases and norm parameters).
        loraplus_lr_embedding: lr of LoRA matrices on embedding layers.

    Returns:
        Four dicts in the order :data:`GROUP_ORDER`, each with ``params``, ``lr``, ``weight_decay``, ``group``
        (its name) and ``param_names``.

    Raises:
        ValueError: λ < 1 or not finite; lr ≤ 0; negative weight decay; no trainable LoRA parameter; a trainable
            parameter named like an adapter (the word ``lora`` in its name) without a recognised role, or with two.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"loraplus: model must be an nn.Module, got {type(model).__name__}")
    lr = v.positive("loraplus", "lr", lr)
    ratio = v.at_least("loraplus", "loraplus_lr_ratio", loraplus_lr_ratio, 1.0)
    weight_decay = v.non_negative("loraplus", "weight_decay", weight_decay)
    lr_emb = v.positive("loraplus", "loraplus_lr_embedding", loraplus_lr_embedding)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    roles = [_lora_role(n) for n, _ in named]  # raises on an unrecognised adapter name, before any grouping
    if not any(r is not None for r in roles):
        raise ValueError("loraplus: the model has no trainable LoRA parameters (no name component among "
                         f"{_RECOGNISED}); apply LoRA first, e.g. icml24.loraplus.apply_lora(model, "
                         "target_modules=..., r=...) or peft.get_peft_model")
    members: dict[str, list[tuple[str, nn.Parameter]]] = {g: [] for g in GROUP_ORDER}
    for (name, p), role in zip(named, roles, strict=True):
        if role == "embedding" or _is_lora_embedding(model, name):
            members["embedding"].append((name, p))
        elif role == "B" or p.ndim == 1:  # B is the zero-initialised output side; all 1-D tensors join it
            members["B_no_decay" if _no_decay(model, name) else "B"].append((name, p))
        else:
            members["A"].append((name, p))
    settings = {"A": (lr, weight_decay), "embedding": (lr_emb, weight_decay), "B": (lr * ratio, weight_decay),
                "B_no_decay": (lr * ratio, 0.0)}
    return [{"params": [p for _, p in members[g]], "param_names": [n for n, _ in members[g]], "group": g,
             "lr": settings[g][0], "weight_decay": settings[g][1]} for g in GROUP_ORDER]


def create_loraplus_optimizer(model: nn.Module, optimizer_cls: type[torch.optim.Optimizer], *, lr: float,
                              loraplus_lr_ratio: float = 16.0, loraplus_weight_decay: float | None = None,
                              loraplus_lr_embedding: float = 1e-6, **optimizer_kwargs: Any) -> torch.optim.Optimizer:
    """Build ``optimizer_cls`` over the LoRA+ groups of ``model`` (η_B = λ·η_A).

    The call signature is peft's (``create_loraplus_optimizer(model, optimizer_cls, lr=..., loraplus_lr_ratio=...)``,
    ``optimizer_cls`` positional or keyword), so code written for ``peft.optimizers`` runs unchanged.

    Args:
        model: a model with trainable LoRA parameters (ours or peft's).
        optimizer_cls: e.g. ``torch.optim.AdamW``.
        lr: η_A (a Python, numpy or 0-d tensor scalar; passed on as a ``float``).
        loraplus_lr_ratio: λ = η_B/η_A, ≥ 1 (paper default 16; official GLUE scripts: 80 for roberta-base, 10 for gpt2).
        loraplus_weight_decay: weight decay of the groups; ``None`` uses ``optimizer_kwargs["weight_decay"]``
            (or 0). NOTE(deviation): peft ignores a plain ``weight_decay`` kwarg (every group overrides it with
            ``loraplus_weight_decay=0``); we honour it.
        loraplus_lr_embedding: lr of LoRA matrices on embedding layers (default 1e-6, as official code and peft).
        **optimizer_kwargs: passed to ``optimizer_cls`` (betas, eps, ...).

    Returns:
        The optimizer; its ``param_groups`` follow :data:`GROUP_ORDER` and carry ``group``/``param_names`` keys.
        LR schedulers scale every group by the same factor, so λ is preserved.
    """
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
        raise TypeError(f"loraplus: optimizer_cls must be a torch.optim.Optimizer subclass, got {optimizer_cls!r}")
    wd_kwarg = optimizer_kwargs.pop("weight_decay", 0.0)
    weight_decay = wd_kwarg if loraplus_weight_decay is None else loraplus_weight_decay
    lr = v.positive("loraplus", "lr", lr)
    groups = loraplus_param_groups(model, lr=lr, loraplus_lr_ratio=loraplus_lr_ratio, weight_decay=weight_decay,
                                   loraplus_lr_embedding=loraplus_lr_embedding)
    return optimizer_cls(groups, lr=lr, **optimizer_kwargs)

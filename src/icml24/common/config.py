"""The experiment configuration contract: a frozen dataclass with documented, validated fields.

Every paper's ``experiment.Config`` subclasses :class:`ExperimentConfig`, gives every field a default and a
``metadata={"help": ...}`` naming the paper's symbol and where the default comes from, validates in
``__post_init__`` (call ``super().__post_init__()``) and provides ``quick()``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from icml24.common import validate

C = TypeVar("C", bound="ExperimentConfig")


def help_text(text: str) -> dict[str, str]:
    """Field metadata documenting a config field: ``field(default=..., metadata=help_text("η, lr (paper §4)"))``."""
    return {"help": text}


@dataclass(frozen=True)
class ExperimentConfig:
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata=help_text("random seeds; every arm runs on each"))
    device: str = field(default="cpu", metadata=help_text("torch device for all arms (cpu, cuda, cuda:1, ...)"))
    threads: int = field(default=1, metadata=help_text(
        "torch intra-op threads; 1 because the reproductions' tensors are small (0 keeps torch's default)"))

    def __post_init__(self) -> None:
        validate.each("Config", "seeds", self.seeds, validate.integer, minimum=0)
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"Config: seeds must be distinct, got {self.seeds!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda") or self.device == "mps"):
            raise ValueError(f"device must be cpu, cuda[:N] or mps, got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but CUDA is not available here; use --device cpu")
        validate.integer("Config", "threads", self.threads, minimum=0)

    @classmethod
    def quick(cls: type[C]) -> C:
        """The small variant used by tests and CI (each quick run <= ~30-60 s on 2 cores)."""
        raise NotImplementedError(f"{cls.__name__}.quick() is not defined")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)

    def with_overrides(self: C, overrides: dict[str, str]) -> C:
        """Apply ``key=value`` strings, each converted by the field's declared type.

        Raises:
            KeyError: unknown key (the message lists the valid ones).
            ValueError: a value that does not convert to the field's type or fails validation.
        """
        fields = {f.name: f for f in dataclasses.fields(self)}
        hints = typing.get_type_hints(type(self))
        changes: dict[str, Any] = {}
        for key, raw in overrides.items():
            if key not in fields:
                raise KeyError(f"unknown config key {key!r}; valid keys: {', '.join(sorted(fields))}")
            changes[key] = convert_value(raw, hints[key], key)
        return dataclasses.replace(self, **changes)


def _split(raw: str) -> list[str]:
    raw = raw.strip()
    if raw.startswith(("(", "[")) and raw.endswith((")", "]")):
        raw = raw[1:-1]
    return [p.strip() for p in raw.split(",") if p.strip()]


def convert_value(raw: str, tp: Any, key: str = "value") -> Any:
    """Convert the string ``raw`` to the type annotation ``tp`` (bool, int, float, str, Optional, tuple, Literal)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    try:
        if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            if raw.strip().lower() in ("none", "null") and type(None) in args:
                return None
            errors = []
            for a in args:
                if a is type(None):
                    continue
                try:
                    return convert_value(raw, a, key)
                except ValueError as e:
                    errors.append(str(e))
            raise ValueError("; ".join(errors))
        if origin is typing.Literal:
            for a in args:
                if str(a) == raw:
                    return a
            raise ValueError(f"must be one of {list(args)}")
        if origin in (tuple, list):
            parts = _split(raw)
            if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
                return tuple(convert_value(p, args[0], key) for p in parts)
            if origin is tuple and args:
                if len(parts) != len(args):
                    raise ValueError(f"expects {len(args)} comma-separated values")
                return tuple(convert_value(p, a, key) for p, a in zip(parts, args, strict=True))
            item = args[0] if args else str
            out = [convert_value(p, item, key) for p in parts]
            return tuple(out) if origin is tuple else out
        if tp is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError("must be true or false")
        if tp is int:
            return int(raw)
        if tp is float:
            return float(raw)
        if tp is str:
            return raw
    except ValueError as e:
        raise ValueError(f"cannot set {key}={raw!r}: {e}") from None
    raise ValueError(f"cannot set {key}={raw!r}: unsupported field type {tp!r}")

"""NExT-GPT: Any-to-Any Multimodal LLM (Wu, Fei, Qu, Ji, Chua; ICML 2024; arXiv 2309.05519).

Official code: https://github.com/NExT-GPT/NExT-GPT (legacy ``NExT-GPT-Lagacy/code/model``).

Frozen encoder → input projection → frozen LLM (+ LoRA in stage 3) → signal tokens → output projector →
frozen diffusion decoder. For a signal block ``[IMG0..IMGn-1]`` emitted by the LLM with last-layer hidden states
``h`` at the positions whose *input* is a signal token and signal-token input embeddings ``e``::

    c = W_out · Transformer(src = W_in (h + e), tgt = q)          (TextFcLayer, "transformer" mode)

and the decoding-side alignment loss against the decoder's own text-encoder embedding ``c*`` of the caption is
the per-token Euclidean distance ``L2 = mean_i ||c_i − c*_i||_2`` (not squared), added to the NLL:
``L = NLL + λ · L2``.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from icml24.common.progress import progress
from icml24.loraplus.lora import LoRALinear  # one paper's layer reused as another's tool (LoRA on q/k/v/o)
from icml24.next_gpt import world as W
from icml24.next_gpt.components import Frozen, WordTokenizer

OWNER = "NExTGPT"
STAGES = (1, 2, 3)


# ------------------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class NExTGPTConfig:
    """Architecture of the trainable parts.

    Attributes:
        modalities: modalities with an encoder/decoder (each needs a frozen encoder and decoder).
        n_signal: signal tokens per modality, aligned with ``modalities`` (paper: image 4, video 24, audio 8).
        projector_hidden: width of the output projector's transformer (paper: 512).
        projector_layers: encoder and decoder layers of the output projector (paper: 4 + 4).
        projector_heads: attention heads of the output projector (paper: 4).
        lora_rank: r of the stage-3 LoRA on q/k/v/o (paper: 32).
        lora_alpha: LoRA α (paper: 32, i.e. scale α/r = 1).
        output_mode: ``"signal"`` (NExT-GPT) or ``"caption"`` (the pipeline baseline: the LLM writes a caption
            between ``<tag>`` and ``</tag>`` that the decoder's own text encoder reads).
        layer_idx: LLM hidden layer read at signal positions (paper: −1, the last).
    """

    modalities: tuple[str, ...] = ("image", "video", "audio")
    n_signal: tuple[int, ...] = (4, 8, 4)
    projector_hidden: int = 64
    projector_layers: int = 2
    projector_heads: int = 4
    lora_rank: int = 8
    lora_alpha: float = 8.0
    output_mode: str = "signal"
    layer_idx: int = -1

    def __post_init__(self) -> None:
        if not self.modalities:
            raise ValueError(f"{OWNER}: modalities must be non-empty")
        for m in self.modalities:
            W.spec(m)
        if len(self.n_signal) != len(self.modalities) or any(int(n) < 1 for n in self.n_signal):
            raise ValueError(f"{OWNER}: n_signal must give one count >= 1 per modality {self.modalities}, "
                             f"got {self.n_signal}")
        if self.output_mode not in ("signal", "caption"):
            raise ValueError(f"{OWNER}: output_mode must be 'signal' or 'caption', got {self.output_mode!r}")
        for name in ("projector_hidden", "projector_layers", "projector_heads", "lora_rank"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{OWNER}: {name} must be >= 1, got {getattr(self, name)}")

    def signal_count(self, modality: str) -> int:
        return dict(zip(self.modalities, self.n_signal, strict=True))[modality]


# ------------------------------------------------------------------------------------------------ frozen parts
_CAUSAL_LM = ("the LLM must be a Hugging Face causal LM (a transformers PreTrainedModel with get_input_embeddings(), "
              "get_output_embeddings() and output_hidden_states=True, e.g. LlamaForCausalLM or GPT2LMHeadModel)")


def _is_conv1d(m: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's fused projections: ``y = x W + b`` with ``W`` (n_in, n_out))."""
    return type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None and m.weight.ndim == 2


def check_causal_lm(llm: Any) -> tuple[int, int]:
    """Refuse an LLM NExT-GPT cannot drive, naming what is missing; returns (vocabulary, width).

    Only the model's own API is used: ``get_input_embeddings()`` (the token rows the new rows extend),
    ``get_output_embeddings()`` (the LM head whose width the new head rows share) and the forward's
    ``inputs_embeds`` / ``output_hidden_states`` (read in :meth:`NExTGPT.hidden`).
    """
    for name in ("get_input_embeddings", "get_output_embeddings", "config"):
        if not hasattr(llm, name):
            raise TypeError(f"{OWNER}: {_CAUSAL_LM}; {type(llm).__name__} has no {name}")
    emb, head = llm.get_input_embeddings(), llm.get_output_embeddings()
    if getattr(emb, "weight", None) is None or emb.weight.ndim != 2:
        raise TypeError(f"{OWNER}: {_CAUSAL_LM}; {type(llm).__name__}.get_input_embeddings() has no 2-D weight")
    if head is None or getattr(head, "weight", None) is None:
        raise TypeError(f"{OWNER}: {_CAUSAL_LM}; {type(llm).__name__}.get_output_embeddings() returns no LM head "
                        "(a bare decoder such as LlamaModel? give the *ForCausalLM model)")
    vocab, d = emb.weight.shape
    if head.weight.shape[-1] != d:
        raise ValueError(f"{OWNER}: the LM head reads width {head.weight.shape[-1]} but the input embeddings have "
                         f"width {d}; the output projector adds signal-token embeddings to the last hidden states, "
                         "so the two must match")
    return int(vocab), int(d)


def attention_projections(llm: nn.Module) -> list[str]:
    """Names of the q/k/v/o projections of every decoder layer (the paper's LoRA targets), found through the
    model's own structure: the decoder (``get_decoder()``, else ``base_model``), its ``nn.ModuleList`` of
    ``config.num_hidden_layers`` blocks, in each block the self-attention module (a child named ``*attn*`` or
    ``*attention*``, not cross-attention) and the ``nn.Linear`` / ``Conv1D`` layers inside it. Llama: ``q_proj,
    k_proj, v_proj, o_proj``; GPT-2: the fused ``c_attn`` and ``attn.c_proj``. Raises ``ValueError`` naming the
    step that found nothing."""
    get_dec = getattr(llm, "get_decoder", None)
    dec = get_dec() if callable(get_dec) else getattr(llm, "base_model", llm)
    dec = llm if dec is None else dec
    n = getattr(getattr(llm, "config", None), "num_hidden_layers", None)
    lists = [(name, ml) for name, ml in dec.named_modules() if isinstance(ml, nn.ModuleList) and len(ml) == n]
    if not lists:
        raise ValueError(f"{OWNER}: found no decoder layers in {type(llm).__name__}: no nn.ModuleList of "
                         f"config.num_hidden_layers = {n} blocks under its decoder {type(dec).__name__}; pass "
                         "lora_targets=[...] (module names or suffixes) to NExTGPT")
    prefix = next(name for name, m in llm.named_modules() if m is dec)
    lname, layers = lists[0]
    out = []
    for i, layer in enumerate(layers):
        for cname, child in layer.named_children():
            low = cname.lower()
            if ("attn" in low or "attention" in low) and "cross" not in low:
                out += [".".join(x for x in (prefix, lname, str(i), cname, sub) if x)
                        for sub, m in child.named_modules() if isinstance(m, nn.Linear) or _is_conv1d(m)]
    if not out:
        raise ValueError(f"{OWNER}: found no attention projections (nn.Linear or Conv1D inside a child named "
                         f"'*attn*' / '*attention*' of each of the {n} decoder layers {prefix + '.' + lname}) in "
                         f"{type(llm).__name__} for the stage-3 LoRA; pass lora_targets=[...] to NExTGPT")
    return out


class LoRAConv1D(nn.Module):
    """LoRA on a frozen transformers ``Conv1D`` (``y = x W* + b``, W* (n_in, n_out)): ``y + (α/r) x Aᵀ Bᵀ`` with
    peft's init (A ~ kaiming_uniform(a=√5), B = 0) and names (``lora_A`` (r, n_in), ``lora_B`` (n_out, r))."""

    def __init__(self, base: nn.Module, *, r: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        n_in, n_out = base.weight.shape
        w = base.weight
        self.scaling = alpha / r
        self.lora_A = nn.Parameter(torch.empty(r, n_in, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(n_out, r, device=w.device, dtype=w.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=5 ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling


def encoder_width(encoder: Any, modality: str) -> int:
    """Width D of the frozen encoder's output for ``modality``: ``encoder.output_dim(modality)`` if it says, else
    measured on a zero input of ``encoder.input_shape(modality)`` (any output (n, D) or (n, ..., D))."""
    if callable(getattr(encoder, "output_dim", None)):
        return int(encoder.output_dim(modality))
    shape = encoder_input_shape(encoder, modality)
    if shape is None:
        raise ValueError(f"{OWNER}: cannot tell the width of the {type(encoder).__name__} output for {modality!r}: "
                         "give the encoder output_dim(modality) or input_shape(modality)")
    with torch.no_grad():
        z = encoder.encode(modality, torch.zeros(1, *shape))
    return int(z.shape[-1])


def encoder_input_shape(encoder: Any, modality: str) -> tuple[int, ...] | None:
    """The per-item input shape the encoder declares (``input_shape(modality)``), or None (any: it judges)."""
    f = getattr(encoder, "input_shape", None)
    return tuple(int(n) for n in f(modality)) if callable(f) else None


# ------------------------------------------------------------------------------------------------ parts
class OutputProjector(nn.Module):
    """TextFcLayer (transformer mode): signal states (B, n_sig, d_llm) -> decoder conditioning (B, N_c, D_c)."""

    def __init__(self, *, in_dim: int, out_dim: int, n_query: int, hidden: int, layers: int, heads: int) -> None:
        super().__init__()
        self.fc_in = nn.Linear(in_dim, hidden)
        self.tf = nn.Transformer(d_model=hidden, nhead=heads, num_encoder_layers=layers, num_decoder_layers=layers,
                                 dim_feedforward=4 * hidden, dropout=0.0, norm_first=True, batch_first=True)
        self.query = nn.Parameter(torch.randn(1, n_query, hidden))
        self.fc_out = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.tf(self.fc_in(x), self.query.expand(x.shape[0], -1, -1)))


def l2_loss(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The stage-2/3 alignment loss: per-token Euclidean distance ``||u − v||_2`` over the last axis, averaged."""
    return ((u - v) ** 2).sum(-1).sqrt().mean()


def module_hash(m: nn.Module, *, skip: Sequence[str] = ()) -> str:
    """SHA-256 of a module's parameters and buffers (names and bytes), skipping names containing ``skip``."""
    h = hashlib.sha256()
    for name, t in sorted(list(m.named_parameters()) + list(m.named_buffers())):
        if any(s in name for s in skip):
            continue
        h.update(name.replace(".base.", ".").encode())  # a LoRA-wrapped Linear hashes like the bare one
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass
class Media:
    """One media input: ``data`` is (C, H, W) for image/video (video: frames x RGB stacked) or a mono waveform
    (n,) at ``sample_rate`` Hz for audio (converted to log-mel inside)."""

    modality: str
    data: torch.Tensor
    sample_rate: int | None = None


@dataclass
class Generation:
    """Result of :meth:`NExTGPT.generate`: the answer text, the generated media per modality (C, H, W), the raw
    output tokens and the conditioning each decoder received."""

    text: str
    media: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)
    conditions: dict[str, torch.Tensor] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ model
class NExTGPT(nn.Module):
    """The any-to-any model around frozen parts: encoder → input projection → LLM → signal tokens → output
    projectors → decoders.

    Only ``input_proj``, the new token rows (``new_embed``, ``new_head``), the output projectors and (stage 3)
    the LoRA factors are trainable; the LLM, encoder and decoders stay bit-identical.
    """

    def __init__(self, *, frozen: Frozen, config: NExTGPTConfig, seed: int = 0,
                 lora_targets: Sequence[str] | None = None) -> None:
        super().__init__()
        enc = frozen.encoder
        if not callable(getattr(enc, "encode", None)):
            raise TypeError(f"{OWNER}: the frozen encoder must have encode(modality, x) -> (n, D) or (n, ..., D); "
                            f"{type(enc).__name__} has none")
        covered = getattr(enc, "encoders", None) or getattr(enc, "modalities", None)
        for m in config.modalities:
            if m not in frozen.decoders or (covered is not None and m not in covered):
                raise ValueError(f"{OWNER}: modality {m!r} has no frozen encoder/decoder; frozen parts cover "
                                 f"decoders {sorted(frozen.decoders)}, encoder {sorted(covered or [])}")
        base_vocab, d = check_causal_lm(frozen.llm)
        widths = {m: encoder_width(enc, m) for m in config.modalities}
        if len(set(widths.values())) > 1:
            raise ValueError(f"{OWNER}: the input projection is shared by every modality (paper: one llama_proj on "
                             f"ImageBind's joint space), but the encoder's output widths differ: {widths}")
        targets = self._lora_targets(frozen.llm, lora_targets)  # refused here, before any stage runs
        self.config = config
        self.frozen = frozen
        self.frozen_config = frozen.cfg
        torch.manual_seed(seed)
        self.llm = copy.deepcopy(frozen.llm)  # LoRA is injected into this copy; its base weights stay frozen
        for p in self.llm.parameters():
            p.requires_grad_(False)
        self.tok: WordTokenizer = copy.deepcopy(frozen.tok)
        self.base_vocab = base_vocab
        self.lora_targets = targets
        if len(self.tok) != self.base_vocab:
            raise ValueError(f"{OWNER}: tokenizer has {len(self.tok)} tokens but the LLM's embedding has "
                             f"{self.base_vocab} rows")
        new: list[str] = ["<media>"]
        for m in config.modalities:
            t = W.spec(m).tag
            new += [f"<{t}>", f"</{t}>"] + [f"[{t.upper()}{i}]" for i in range(config.signal_count(m))]
        self.tok.add_tokens(new)
        self.d_llm = d
        base = self.llm.get_input_embeddings().weight
        std = float(base.std())
        self.new_embed = nn.Parameter(torch.randn(len(new), d) * std)
        self.new_head = nn.Parameter(torch.randn(len(new), d) * 0.02)
        self.input_proj = nn.Linear(next(iter(widths.values())), d)
        self.output_projectors = nn.ModuleDict()
        for m in config.modalities:
            n_c, d_c = frozen.decoders[m].cond_shape
            self.output_projectors[m] = OutputProjector(in_dim=d, out_dim=d_c, n_query=n_c,
                                                        hidden=config.projector_hidden,
                                                        layers=config.projector_layers, heads=config.projector_heads)
        self.sep_id = self.tok.stoi[W.SEP]
        self.media_id = self.tok.stoi["<media>"]
        self.signal_ids = {m: self.tok.convert_tokens_to_ids(
            [f"[{W.spec(m).tag.upper()}{i}]" for i in range(config.signal_count(m))]) for m in config.modalities}
        self.tag_ids = {m: tuple(self.tok.convert_tokens_to_ids([f"<{W.spec(m).tag}>", f"</{W.spec(m).tag}>"]))
                        for m in config.modalities}
        self.lora_enabled = False
        self.stage = 0

    # ---------------------------------------------------------------- parameters
    @staticmethod
    def _lora_targets(llm: nn.Module, names: Sequence[str] | None) -> list[str]:
        if names is None:
            return attention_projections(llm)
        found = [n for n, m in llm.named_modules() if (isinstance(m, nn.Linear) or _is_conv1d(m))
                 and any(n == t or n.endswith("." + t) for t in names)]
        if not found:
            raise ValueError(f"{OWNER}: lora_targets {list(names)} match no nn.Linear / Conv1D of "
                             f"{type(llm).__name__}")
        return found

    def enable_lora(self) -> None:
        """Wrap the q/k/v/o projections of every LLM decoder layer (:attr:`lora_targets`) with LoRA (stage 3)."""
        if self.lora_enabled:
            return
        for name in self.lora_targets:  # in module order: the same draws as apply_lora on the same targets
            parent, _, child = name.rpartition(".")
            owner = self.llm.get_submodule(parent) if parent else self.llm
            base = getattr(owner, child)
            wrapped = (LoRALinear(base, r=self.config.lora_rank, alpha=self.config.lora_alpha)
                       if isinstance(base, nn.Linear) else
                       LoRAConv1D(base, r=self.config.lora_rank, alpha=self.config.lora_alpha))
            setattr(owner, child, wrapped)
        self.lora_enabled = True

    def trainable_names(self, stage: int) -> list[str]:
        """Names of the parameters stage ``stage`` trains (notes §2.3)."""
        if stage not in STAGES:
            raise ValueError(f"{OWNER}: stage must be one of {STAGES}, got {stage!r}")
        names = []
        for n, _ in self.named_parameters():
            if n in ("new_embed", "new_head"):
                names.append(n)
            elif n.startswith("input_proj.") and stage in (1, 3):
                names.append(n)
            elif n.startswith("output_projectors.") and stage in (2, 3) and self.config.output_mode == "signal":
                names.append(n)
            elif ".lora_" in n and stage == 3:
                names.append(n)
        return names

    def trainable_rows(self, stage: int) -> torch.Tensor:
        """Boolean mask over the new token rows that ``stage`` trains: stage 1 the ``<media>`` and tag rows (the
        signal tokens never occur there, so their rows stay put — the paper's resize bug, pitfall 1, is avoided),
        stage 2 the tag and signal rows, stage 3 all."""
        mask = torch.zeros(self.new_embed.shape[0], dtype=torch.bool)
        sig = {i - self.base_vocab for ids in self.signal_ids.values() for i in ids}
        for r in range(len(mask)):
            mask[r] = stage == 3 or (r in sig) == (stage == 2) or (stage == 2 and r not in sig and r != 0)
        return mask

    def set_stage(self, stage: int) -> list[nn.Parameter]:
        if stage == 3:
            self.enable_lora()
        keep = set(self.trainable_names(stage))
        params = []
        for n, p in self.named_parameters():
            p.requires_grad_(n in keep)
            if n in keep:
                params.append(p)
        self.stage = stage
        return params

    def trainable_fraction(self, stage: int) -> dict[str, float]:
        """Trainable parameters of ``stage`` (new token rows counted only where the stage trains them) over all
        parameters (frozen LLM, encoder and decoders included)."""
        if stage == 3:
            self.enable_lora()
        keep = set(self.trainable_names(stage))
        n_rows = int(self.trainable_rows(stage).sum())
        n_train = sum(p.numel() for n, p in self.named_parameters() if n in keep and n not in ("new_embed", "new_head"))
        n_train += 2 * n_rows * self.d_llm
        n_self = sum(p.numel() for p in self.parameters())
        n_frozen = sum(p.numel() for p in self.frozen.encoder.parameters()) + sum(
            p.numel() for d in self.frozen.decoders.values() for p in d.parameters()
            if d.modality in self.config.modalities)
        return {"trainable": n_train, "total": n_self + n_frozen, "fraction": n_train / (n_self + n_frozen)}

    def frozen_hashes(self) -> dict[str, str]:
        """Hashes of every frozen module (LLM base weights without LoRA, encoder, each decoder)."""
        out = {"llm": module_hash(self.llm, skip=("lora_",)), "encoder": module_hash(self.frozen.encoder)}
        for m in self.config.modalities:
            out[f"decoder_{m}"] = module_hash(self.frozen.decoders[m])
        return out

    # ---------------------------------------------------------------- checkpoints
    def checkpoint(self) -> dict[str, Any]:
        """Only the trainable deltas (input projection, new rows, output projectors, LoRA) and the configs."""
        state = {n: p.detach().clone() for n, p in self.named_parameters()
                 if n in ("new_embed", "new_head") or n.startswith(("input_proj.", "output_projectors."))
                 or ".lora_" in n}
        return {"config": asdict(self.config), "frozen_config": asdict(self.frozen_config),
                "frozen_key": self.frozen_config.key(), "stage": self.stage, "lora": self.lora_enabled,
                "state": state}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.checkpoint(), path)
        return path

    def load(self, ckpt: dict[str, Any] | str | Path) -> NExTGPT:
        """Load a checkpoint written by :meth:`save`; raises before touching weights if it was made for another
        model or world configuration."""
        if not isinstance(ckpt, dict):
            ckpt = torch.load(Path(ckpt), weights_only=False)
        if ckpt.get("config") != asdict(self.config):
            raise ValueError(f"{OWNER}.load: checkpoint was made for config {ckpt.get('config')}, this model has "
                             f"{asdict(self.config)}")
        if ckpt.get("frozen_key") != self.frozen_config.key():
            raise ValueError(f"{OWNER}.load: checkpoint was made on frozen parts {ckpt.get('frozen_key')} "
                             f"({ckpt.get('frozen_config')}), this model uses {self.frozen_config.key()}")
        if ckpt["lora"]:
            self.enable_lora()
        own = dict(self.named_parameters())
        missing = set(ckpt["state"]) ^ {n for n in own if n in ckpt["state"] or n in ("new_embed", "new_head")
                                        or n.startswith(("input_proj.", "output_projectors.")) or ".lora_" in n}
        if missing:
            raise ValueError(f"{OWNER}.load: checkpoint parameters do not match the model: {sorted(missing)[:5]}")
        with torch.no_grad():
            for n, t in ckpt["state"].items():
                own[n].copy_(t)
        if ckpt["stage"] in (1, 2, 3):  # the trainable set and mode train_stage leaves (they select torch's fast
            self.set_stage(ckpt["stage"])  # paths, e.g. nn.Transformer's in eval mode without grads: ulp-level)
        self.stage = ckpt["stage"]
        return self.eval()

    # ---------------------------------------------------------------- embedding / forward
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        base = self.llm.get_input_embeddings()
        is_new = ids >= self.base_vocab
        e = base(ids.clamp(max=self.base_vocab - 1))
        return torch.where(is_new[..., None], self.new_embed[(ids - self.base_vocab).clamp(min=0)], e)

    def encode_media(self, items: list[Media]) -> torch.Tensor:
        """Frozen encoder + input projection: one LLM token per item, (n, d_llm). An encoder output (n, ..., D)
        with token axes is averaged over them first (the paper's ImageBind gives one pooled embedding per item)."""
        out = torch.zeros(len(items), self.d_llm)
        for m in sorted({it.modality for it in items}):
            idx = [i for i, it in enumerate(items) if it.modality == m]
            x = torch.stack([self._media_tensor(items[i]) for i in idx])
            with torch.no_grad():
                z = self.frozen.encoder.encode(m, x)
            if z.ndim > 2:  # NOTE(deviation): token outputs (ViT patches, ...) mean-pooled to one item embedding
                z = z.flatten(1, -2).mean(1)
            if z.ndim != 2 or z.shape != (len(idx), self.input_proj.in_features):
                raise ValueError(f"{OWNER}: the {m} encoder returned {tuple(z.shape)}, want ({len(idx)}, "
                                 f"{self.input_proj.in_features}) or ({len(idx)}, ..., {self.input_proj.in_features})")
            out[idx] = self.input_proj(z)
        return out

    def _media_tensor(self, it: Media) -> torch.Tensor:
        if it.modality not in self.config.modalities:
            raise ValueError(f"{OWNER}: unsupported modality {it.modality!r}; this model handles "
                             f"{list(self.config.modalities)}")
        shape = encoder_input_shape(self.frozen.encoder, it.modality)  # None: the encoder takes any shape
        x = it.data
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{OWNER}: {it.modality} data must be a torch.Tensor, got {type(x).__name__}")
        mel = it.modality == "audio" and shape == W.spec("audio").shape  # the world's log-mel encoder
        if mel and x.ndim == 1:
            if it.sample_rate != W.SAMPLE_RATE:
                raise ValueError(f"{OWNER}: audio sample_rate must be {W.SAMPLE_RATE} Hz (mono waveform), "
                                 f"got {it.sample_rate}")
            x = W.log_mel(x.float())
        if shape is not None and tuple(x.shape) != shape:
            want = f"{shape} (log-mel) or a mono waveform (n,) at {W.SAMPLE_RATE} Hz" if mel else f"{shape}"
            raise ValueError(f"{OWNER}: {it.modality} input must have shape {want} (the encoder's input_shape), "
                             f"got {tuple(x.shape)}")
        return x.float()

    def hidden(self, embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LLM hidden states at ``layer_idx`` (B, L, d) and logits over base + new tokens (B, L, V'), from the
        causal LM's own forward: its logits for the base vocabulary, ``hidden_states[-1]`` (the states its LM head
        reads) times the new head rows for the new tokens."""
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        out = self.llm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, output_hidden_states=True)
        hs, base_logits = getattr(out, "hidden_states", None), getattr(out, "logits", None)
        if hs is None or base_logits is None:
            raise TypeError(f"{OWNER}: {_CAUSAL_LM}; {type(self.llm).__name__}'s forward returned no "
                            f"{'hidden_states' if hs is None else 'logits'}")
        last = hs[-1]
        logits = torch.cat([base_logits, last @ self.new_head.T], -1)
        return (last if self.config.layer_idx == -1 else hs[self.config.layer_idx]), logits

    def project(self, modality: str, h_sig: torch.Tensor, sig_ids: torch.Tensor) -> torch.Tensor:
        """Output projection of one modality: ``(h_sig + e_sig)`` (B, n_sig, d) -> (B, N_c, D_c)."""
        n = self.config.signal_count(modality)
        if h_sig.ndim != 3 or h_sig.shape[1:] != (n, self.d_llm):
            raise ValueError(f"{OWNER}.project[{modality}]: signal states must have shape (B, {n}, {self.d_llm}), "
                             f"got {tuple(h_sig.shape)}")
        return self.output_projectors[modality](h_sig + self.embed(sig_ids))

    # ---------------------------------------------------------------- sequences
    def _human(self, turn: W.Turn) -> list[int]:
        ids = self.tok.encode(f"{W.SEP} {W.HUMAN}")
        if turn.in_modality is not None:
            o, c = self.tag_ids[turn.in_modality]
            ids += [o, self.media_id, c]
        return ids + self.tok.encode(f"{turn.human} {W.SEP} {W.ASSISTANT}")

    def _answer(self, turn: W.Turn) -> list[int]:
        ids = self.tok.encode(turn.answer)
        if turn.out_modality is not None:
            if self.config.output_mode == "signal":
                ids += self.signal_ids[turn.out_modality]
            else:
                o, c = self.tag_ids[turn.out_modality]
                ids += [o] + self.tok.encode(turn.out_caption or "") + [c]
        return ids + [self.sep_id]

    def build(self, dialogues: list[list[W.Turn]], *, train: bool, rng: np.random.Generator,
              prefixes: list[list[list[W.Turn]]] | None = None) -> dict[str, Any]:
        """Tokenise dialogues (each ends with the assistant turn to predict when ``train`` is False) into a
        right-padded batch: ids, labels (−100 on human turns and media slots), media items, signal spans with
        their gold captions. ``prefixes`` are in-context example dialogues placed before each dialogue."""
        seqs, labs, media, spans = [], [], [], []
        for b, dia in enumerate(dialogues):
            ids, lab = [self.tok.bos_token_id], [-100]
            turns = [t for p in (prefixes[b] if prefixes else []) for t in p] + list(dia)
            for j, t in enumerate(turns):
                h = self._human(t)
                if t.in_modality is not None:
                    x = t.in_data if t.in_data is not None else \
                        W.render_many(W.spec(t.in_modality), [t.in_attrs], rng)[0]
                    media.append((b, len(ids) + h.index(self.media_id), Media(t.in_modality, x)))
                ids += h
                lab += [-100] * len(h)
                if train or j < len(turns) - 1:
                    a = self._answer(t)
                    if t.out_modality is not None and self.config.output_mode == "signal":
                        start = len(ids) + a.index(self.signal_ids[t.out_modality][0])
                        spans.append((b, start, t.out_modality, t.out_caption))
                    ids += a
                    lab += a if train else [-100] * len(a)
            seqs.append(ids)
            labs.append(lab)
        L = max(len(s) for s in seqs)
        ids_t = torch.zeros(len(seqs), L, dtype=torch.long)
        lab_t = torch.full((len(seqs), L), -100, dtype=torch.long)
        mask = torch.zeros(len(seqs), L, dtype=torch.long)
        for i, (s, lb) in enumerate(zip(seqs, labs, strict=True)):
            ids_t[i, :len(s)], lab_t[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), torch.tensor(lb), 1
        return {"ids": ids_t, "labels": lab_t, "mask": mask, "media": media, "spans": spans}

    def inputs_embeds(self, batch: dict[str, Any]) -> torch.Tensor:
        e = self.embed(batch["ids"])
        if batch["media"]:
            z = self.encode_media([m for _, _, m in batch["media"]])
            rows = torch.tensor([b for b, _, _ in batch["media"]])
            cols = torch.tensor([p for _, p, _ in batch["media"]])
            e = e.index_put((rows, cols), z)
        return e

    def losses(self, batch: dict[str, Any], *, lam: dict[str, float] | None = None) -> dict[str, torch.Tensor]:
        """Teacher-forced NLL of the labelled tokens and the alignment loss λ·L2 over every signal span."""
        h, logits = self.hidden(self.inputs_embeds(batch), batch["mask"])
        nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1),
                              ignore_index=-100)
        align = torch.zeros(())
        if batch["spans"] and self.config.output_mode == "signal":
            for m in sorted({s[2] for s in batch["spans"]}):  # fixed order: the sum must not vary by hash seed
                sp = [s for s in batch["spans"] if s[2] == m]
                n = self.config.signal_count(m)
                idx = torch.tensor([[st + i for i in range(n)] for _, st, _, _ in sp])
                rows = torch.tensor([b for b, _, _, _ in sp])
                h_sig = h[rows[:, None], idx]
                sig = torch.tensor(self.signal_ids[m]).expand(len(sp), -1)
                with torch.no_grad():
                    target = self.frozen.decoders[m].encode_condition([c for _, _, _, c in sp])
                w = (lam or {}).get(m, 1.0) * len(sp) / len(batch["spans"])
                align = align + w * l2_loss(self.project(m, h_sig, sig), target)
        return {"nll": nll, "l2": align}

    # ---------------------------------------------------------------- generation
    def parse_signal_blocks(self, ids: Sequence[int]) -> dict[str, dict[str, Any]]:
        """Per modality: ``{"status": "complete" | "partial" | "absent", "start": int | None}``. A block is
        complete when the modality's signal tokens appear consecutively in order (the first such block counts);
        partial when some of its signal tokens appear but never as a complete ordered block."""
        ids = list(ids)
        out = {}
        for m, sig in self.signal_ids.items():
            n = len(sig)
            start = next((i for i in range(len(ids) - n + 1) if ids[i:i + n] == sig), None)
            if start is not None:
                out[m] = {"status": "complete", "start": start}
            elif any(t in sig for t in ids):
                out[m] = {"status": "partial", "start": None}
            else:
                out[m] = {"status": "absent", "start": None}
        return out

    def parse_caption_blocks(self, ids: Sequence[int]) -> dict[str, str | None]:
        """Pipeline baseline: the caption between ``<tag>`` and ``</tag>`` per modality (None if absent)."""
        ids = list(ids)
        out: dict[str, str | None] = {}
        for m, (o, c) in self.tag_ids.items():
            if o in ids and c in ids[ids.index(o) + 1:]:
                i = ids.index(o)
                out[m] = self.tok.decode(ids[i + 1:i + 1 + ids[i + 1:].index(c)])
            else:
                out[m] = None
        return out

    @torch.no_grad()
    def _greedy(self, batch: dict[str, Any], *, max_new_tokens: int, force_block: bool) -> list[list[int]]:
        """Greedy decoding of a batch of contexts (right-padded by :meth:`build`); stops at ``###``. With
        ``force_block`` the rest of a signal block is appended once its first token is emitted (pitfall 3),
        at most one block per modality."""
        B = batch["ids"].shape[0]
        lens = batch["mask"].sum(1).tolist()
        e0 = self.inputs_embeds(batch)
        # left-align into a left-padded batch so every row's next token is at the end
        L = max(lens)
        e = torch.zeros(B, L, self.d_llm)
        mask = torch.zeros(B, L, dtype=torch.long)
        for i, n in enumerate(lens):
            e[i, L - n:] = e0[i, :n]
            mask[i, L - n:] = 1
        outs: list[list[int]] = [[] for _ in range(B)]
        pending: list[list[int]] = [[] for _ in range(B)]
        done = [False] * B
        first = {sig[0]: sig for sig in self.signal_ids.values()}
        for _ in range(max_new_tokens):
            _, logits = self.hidden(e, mask)
            nxt = logits[:, -1].argmax(-1).tolist()
            new_ids = []
            was_done = list(done)
            for i in range(B):
                if done[i]:
                    new_ids.append(self.tok.pad_token_id)
                    continue
                t = pending[i].pop(0) if pending[i] else nxt[i]
                if force_block and t in first and t not in outs[i]:
                    pending[i] = list(first[t][1:])
                outs[i].append(t)
                new_ids.append(t)
                if t == self.sep_id and not pending[i]:
                    done[i] = True
            ids_new = torch.tensor(new_ids)[:, None]
            e = torch.cat([e, self.embed(ids_new)], 1)
            mask = torch.cat([mask, torch.tensor([[0 if d else 1] for d in was_done])], 1)
            if all(done):
                break
        return [o[:o.index(self.sep_id)] if self.sep_id in o else o for o in outs]

    @torch.no_grad()
    def respond(self, dialogues: list[list[W.Turn]], *, rng: np.random.Generator, max_new_tokens: int = 20,
                force_block: bool = True, prefixes: list[list[list[W.Turn]]] | None = None,
                decode: bool = True, guidance_scale: float = 3.0, ddim_steps: int = 20,
                seed: int = 0) -> list[Generation]:
        """Answer the last human turn of each dialogue (earlier turns are the gold history): greedy text, then
        for each complete signal block (or, in caption mode, each tagged caption) the decoder's media."""
        self.eval()
        batch = self.build(dialogues, train=False, rng=rng, prefixes=prefixes)
        outs = self._greedy(batch, max_new_tokens=max_new_tokens, force_block=force_block)
        gens = [Generation(text=self.tok.decode([t for t in o if t < self.base_vocab]),
                           tokens=[self.tok.itos[t] for t in o]) for o in outs]
        if not decode:
            return gens
        conds: dict[str, list[tuple[int, torch.Tensor]]] = {}
        if self.config.output_mode == "signal":
            todo = []
            for i, o in enumerate(outs):
                for m, blk in self.parse_signal_blocks(o).items():
                    if blk["status"] == "complete":
                        todo.append((i, m, blk["start"]))
            if todo:
                lens = batch["mask"].sum(1)
                full = [batch["ids"][i, :int(lens[i])].tolist() + outs[i] for i in range(len(outs))]
                ctx = {"ids": None, "media": batch["media"]}
                Lf = max(len(f) for f in full)
                ids = torch.zeros(len(full), Lf, dtype=torch.long)
                mask = torch.zeros(len(full), Lf, dtype=torch.long)
                for i, f in enumerate(full):
                    ids[i, :len(f)], mask[i, :len(f)] = torch.tensor(f), 1
                ctx.update(ids=ids, mask=mask)
                h, _ = self.hidden(self.inputs_embeds(ctx), mask)
                for i, m, st in todo:
                    pos = int(lens[i]) + st
                    n = self.config.signal_count(m)
                    c = self.project(m, h[i:i + 1, pos:pos + n], torch.tensor([self.signal_ids[m]]))
                    conds.setdefault(m, []).append((i, c[0]))
        else:
            for i, o in enumerate(outs):
                for m, cap in self.parse_caption_blocks(o).items():
                    if cap is not None:
                        conds.setdefault(m, []).append((i, self.frozen.decoders[m].encode_condition([cap])[0]))
        for m, items in conds.items():
            c = torch.stack([x for _, x in items])
            x = self.frozen.decoders[m].generate(c, guidance_scale=guidance_scale, steps=ddim_steps, seed=seed)
            for (i, ci), xi in zip(items, x, strict=True):
                gens[i].media[m] = xi
                gens[i].conditions[m] = ci
        return gens

    def generate(self, *, inputs: Sequence[str | Media], history: list[W.Turn] | None = None,
                 max_new_tokens: int = 20, guidance_scale: float = 3.0, ddim_steps: int = 20,
                 seed: int = 0) -> Generation:
        """Any-to-any: ``inputs`` are one human turn's text and media items (at most one media item, as in the
        paper's one-projected-token-per-item prompt; several items of one modality are averaged); returns the
        answer text and any generated media (the decoders' shapes; the world's: image (3,16,16), video (12,16,16),
        audio log-mel (1,16,16)). Media inputs must have the shape the encoder declares (``input_shape``)."""
        if isinstance(inputs, (str, Media)):
            inputs = [inputs]
        texts = [x for x in inputs if isinstance(x, str)]
        media = [x for x in inputs if isinstance(x, Media)]
        bad = [x for x in inputs if not isinstance(x, (str, Media))]
        if bad:
            raise TypeError(f"{OWNER}.generate: inputs must be str or Media, got {type(bad[0]).__name__}")
        text = " ".join(t.strip() for t in texts).strip()
        if not text:
            raise ValueError(f"{OWNER}.generate: empty prompt; give a text instruction in inputs")
        mods = {m.modality for m in media}
        if len(mods) > 1:
            raise ValueError(f"{OWNER}.generate: one input modality per turn, got {sorted(mods)}")
        for it in media:
            self._media_tensor(it)  # validates modality, shape and sample rate before any compute
        turn = W.Turn(human=text)
        if media:
            turn.in_modality = media[0].modality
            turn.in_data = torch.stack([self._media_tensor(it) for it in media]).mean(0)
        dia = list(history or []) + [turn]
        return self.respond([dia], rng=np.random.default_rng(seed), max_new_tokens=max_new_tokens,
                            guidance_scale=guidance_scale, ddim_steps=ddim_steps, seed=seed)[0]


# ------------------------------------------------------------------------------------------------ training
@dataclass(frozen=True)
class StageConfig:
    """One training stage: steps, batch, Adam(β=(0.9, 0.95), wd 1e-3), warm-up 10% then linear decay, clip 1."""

    steps: int
    lr: float
    batch: int = 16
    row_lr_scale: float = 10.0  # NOTE(deviation): new token rows learn 10x faster (paper: one lr; 40x fewer steps)
    lam: tuple[tuple[str, float], ...] = (("image", 1.0), ("audio", 1.0), ("video", 2.0))


def train_stage(model: NExTGPT, stage: int, sampler: Any, cfg: StageConfig, *, seed: int,
                desc: str = "") -> dict[str, Any]:
    """Train stage ``stage`` (1, 2 or 3) on dialogues from ``sampler(rng, n) -> list[list[Turn]]``; only the
    parameters :meth:`NExTGPT.trainable_names` declares receive gradients. Returns loss curves."""
    params = model.set_stage(stage)
    rows_p = [p for p in params if p is model.new_embed or p is model.new_head]
    rest = [p for p in params if not any(p is q for q in rows_p)]
    opt = torch.optim.AdamW([{"params": rest}, {"params": rows_p, "lr": cfg.lr * cfg.row_lr_scale}], lr=cfg.lr,
                            betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-3)
    warm = max(1, cfg.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (cfg.steps - s) / max(1, cfg.steps - warm))))
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    model.train()
    curve = {"nll": [], "l2": []}
    lam = dict(cfg.lam)
    rows = model.trainable_rows(stage)
    keep_embed, keep_head = model.new_embed.detach().clone(), model.new_head.detach().clone()
    for _ in progress(range(cfg.steps), desc=desc or f"next_gpt: stage {stage}"):
        batch = model.build(sampler(rng, cfg.batch), train=True, rng=rng)
        out = model.losses(batch, lam=lam)
        loss = out["nll"] + out["l2"]
        opt.zero_grad()
        loss.backward()
        for p in (model.new_embed, model.new_head):
            if p.grad is not None:
                p.grad[~rows] = 0
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():  # rows this stage does not train stay bit-identical (no weight-decay drift)
            model.new_embed[~rows] = keep_embed[~rows]
            model.new_head[~rows] = keep_head[~rows]
        curve["nll"].append(float(out["nll"].detach()))
        curve["l2"].append(float(out["l2"].detach()))
    model.eval()
    return curve

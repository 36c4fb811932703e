"""The quantized ANN (QANN) of SpikeZIP-TF: LSQ-style quantizers inserted into a ReLU transformer.

Paper: "SpikeZIP-TF: Conversion is All You Need for Transformer-based SNN", You, Xu et al., ICML 2024,
arXiv:2406.03470; official code: github.com/Intelligent-Computing-Research-Group/SpikeZIP_transformer
(``spike_quan_layer.MyQuan``, ``spike_quan_wrapper.myquan_replace``).

Quantizer with L levels and step (threshold) s, round-half-up (QCFS-style shift 1/2):

    Q(x) = s * clamp(floor(x / s + 1/2), n_min, p_max),
    sym:  [n_min, p_max] = [-(L // 2), L // 2 - 1];   unsigned: [0, L - 1]

trained with a straight-through floor and LSQ's gradient scale g = 1 / sqrt(p_max * numel(x)).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as val

__all__ = ["Quantizer", "QAttention", "QSelfAttention", "is_hf_encoder", "quantize", "calibrate", "quantizers", "additive_mask", "check_mask",
           "check_activations", "NONLINEAR_ACTIVATIONS"]

#: activation modules that a spiking network cannot reproduce (only ReLU, merged into an unsigned quantizer, can)
NONLINEAR_ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.SELU, nn.CELU, nn.LeakyReLU, nn.PReLU, nn.RReLU,
    nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Mish, nn.Softplus, nn.Softsign, nn.Tanhshrink, nn.GLU,
    nn.LogSigmoid, nn.Threshold, nn.Softshrink, nn.Hardshrink, nn.ReLU6,
)


def check_activations(model: nn.Module, *, who: str = "spikezip_tf") -> None:
    """Raise ``TypeError`` naming the first activation module that is not ``nn.ReLU``.

    ``nn.ReLU6`` counts as non-ReLU (its upper clip is not part of the unsigned quantizer). Activations called
    functionally inside a ``forward`` cannot be seen here.
    """
    for name, m in model.named_modules():
        if isinstance(m, NONLINEAR_ACTIVATIONS):
            raise TypeError(
                f"{who}: module '{name}' is {type(m).__name__}; only nn.ReLU activations can be converted to "
                f"spikes (build the model with act_layer=nn.ReLU)")


def _check_level(level: int, name: str = "level", *, sym: bool = True) -> None:
    val.integer("spikezip_tf", f"{name} (quantization levels L)", level, minimum=2)
    if sym and level < 4:
        # L = 2 or 3 gives the signed range [-1, 0]: every positive activation would be quantised to 0
        raise ValueError(f"spikezip_tf: a signed quantizer needs {name} >= 4 (got {level})")


def _floor_pass(x: torch.Tensor) -> torch.Tensor:
    # floor forward (bit-exact: floor(x) + 0), identity backward (straight-through estimator)
    return x.floor().detach() + (x - x.detach())


def _grad_scale(s: torch.Tensor, g: float) -> torch.Tensor:
    # value exactly s (s + (y - y) with y = s*g adds an exact 0), gradient g * dL/ds (LSQ)
    sg = s * g
    return s.detach() + (sg - sg.detach())


class Quantizer(nn.Module):
    """LSQ-style uniform quantizer ``Q(x) = s * clamp(floor(x/s + 1/2), n_min, p_max)`` (one scalar ``s``).

    Args:
        level: number of levels ``L`` (>= 2 unsigned, >= 4 signed).
        sym: signed range ``[-(L//2), L//2 - 1]`` if True, else unsigned ``[0, L - 1]`` (absorbs a ReLU).
        s_init: initial step ``s``; replaced by ``2 * mean|x| / sqrt(p_max)`` on the first training (or
            :func:`calibrate`) batch unless ``initialized`` is already set.

    The step ``s`` is also the spiking threshold ``V_thr`` of the ST-BIF neuron that replaces this module.
    """

    def __init__(self, *, level: int, sym: bool, s_init: float = 1.0) -> None:
        super().__init__()
        _check_level(level, sym=sym)
        val.positive("spikezip_tf", "s_init", s_init)
        self.level = int(level)
        self.sym = bool(sym)
        self.pos_max = level // 2 - 1 if sym else level - 1
        self.neg_min = -(level // 2) if sym else 0
        self.s = nn.Parameter(torch.tensor(float(s_init)))
        # not in the state dict: a checkpoint of the official layout holds only ``s`` per quantizer (``MyQuan``)
        # and loads with strict=True; loading ``s`` marks the quantizer initialised (no re-init by a batch)
        self.register_buffer("initialized", torch.tensor(False), persistent=False)
        self._calibrating = False

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if prefix + "s" in state_dict:
            self.initialized.fill_(True)

    def extra_repr(self) -> str:
        return f"level={self.level}, sym={self.sym}, range=[{self.neg_min}, {self.pos_max}], s={self.s.item():.6g}"

    def set_scale(self, s: float) -> None:
        """Set the step ``s`` (> 0) and mark the quantizer initialised."""
        val.positive("spikezip_tf", "scale s", s)
        with torch.no_grad():
            self.s.fill_(float(s))
            self.initialized.fill_(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = max(self.pos_max, 1)
        if (self.training or self._calibrating) and not bool(self.initialized):
            with torch.no_grad():
                s0 = 2.0 * x.detach().abs().mean() / math.sqrt(p)
                self.s.copy_(s0.clamp_min(1e-8))
                self.initialized.fill_(True)
        # the effective step equals self.s bit for bit (the ST-BIF threshold of the converted SNN)
        s = _grad_scale(self.s, 1.0 / math.sqrt(p * max(x.numel(), 1))) if torch.is_grad_enabled() else self.s
        return torch.clamp(_floor_pass(x / s + 0.5), self.neg_min, self.pos_max) * s


def check_mask(mask: torch.Tensor | None, b: int, n: int) -> None:
    """Raise ``ValueError`` unless ``mask`` is None or a key mask of shape ``(B, N) = (b, n)``."""
    if mask is None:
        return
    val.tensor("spikezip_tf", "mask", mask)
    if tuple(mask.shape) != (b, n):
        raise ValueError(f"spikezip_tf: mask must have shape ({b}, {n}), got {tuple(mask.shape)}")


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Key keep-mask ``(B, N)`` -> additive ``(B, 1, 1, N)`` (0 where kept, the dtype's min elsewhere).

    Any dtype is a keep-mask: bool as is, other dtypes (int or float 0/1) as ``mask != 0`` (True/nonzero =
    attend). Only 2-D masks are accepted.
    """
    if mask is None:
        return None
    if mask.dim() != 2:
        raise ValueError(f"spikezip_tf: mask must be a 2-D key mask (B, N), got shape {tuple(mask.shape)}")
    keep = mask if mask.dtype == torch.bool else mask != 0
    add = torch.zeros(keep.shape, dtype=dtype, device=mask.device)
    add = add.masked_fill(~keep, torch.finfo(dtype).min)
    return add[:, None, None, :]


class QAttention(nn.Module):
    """Quantized multi-head self-attention (official ``QAttention``):

    ``q,k,v = Q_q(.), Q_k(.), Q_v(.)`` (signed) of ``qkv(x)``; ``A = Q_attn(softmax(scale * q k^T + M))``
    (unsigned); ``o = Q_after(A v)`` (signed); ``y = Q_proj(proj(o))`` (signed). ``M`` is an optional additive
    key mask. Submodule names follow the official checkpoints (``quan_q, quan_k, quan_v, attn_quan,
    after_attn_quan, quan_proj``).
    """

    def __init__(self, *, attn: nn.Module, level: int) -> None:
        super().__init__()
        _check_level(level)
        self.num_heads = int(attn.num_heads)
        self.head_dim = int(getattr(attn, "head_dim", attn.qkv.out_features // 3 // self.num_heads))
        self.scale = float(getattr(attn, "scale", self.head_dim ** -0.5))
        self.qkv = attn.qkv
        self.proj = attn.proj
        self.quan_q = Quantizer(level=level, sym=True)
        self.quan_k = Quantizer(level=level, sym=True)
        self.quan_v = Quantizer(level=level, sym=True)
        self.attn_quan = Quantizer(level=level, sym=False)
        self.after_attn_quan = Quantizer(level=level, sym=True)
        self.quan_proj = Quantizer(level=level, sym=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attn_mask is not None:
            raise NotImplementedError("spikezip_tf: QAttention takes a key mask (B, N) as `mask`, not timm's attn_mask")
        b, n, c = x.shape
        check_mask(mask, b, n)
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = self.quan_q(q), self.quan_k(k), self.quan_v(v)
        scores = (q * self.scale) @ k.transpose(-2, -1)  # scale applied to the quantized q, as in the official code
        m = additive_mask(mask, scores.dtype)
        if m is not None:
            scores = scores + m
        a = self.attn_quan(F.softmax(scores, dim=-1))
        o = self.after_attn_quan(a @ v).transpose(1, 2).reshape(b, n, c)
        return self.quan_proj(self.proj(o))


class QSelfAttention(nn.Module):
    """Quantized Hugging Face BERT/RoBERTa self-attention (official ``QRobertaSelfAttention`` layout):

    ``q, k, v = Q_q(query(h)), Q_k(key(h)), Q_v(value(h))`` (signed); ``A = Q_attn(softmax(q k^T / sqrt(d) + M))``
    (unsigned); ``context = Q_after(A v)`` (signed). Drop-in for ``BertSelfAttention`` / ``RobertaSelfAttention``
    inside the model's own forward (returns ``(context, A)``); ``M`` is the additive or boolean mask the model
    builds from ``attention_mask``. Submodule names follow the official checkpoints (``query_quan, key_quan,
    value_quan, attn_quan, after_attn_quan``).

    NOTE(deviation): ``after_attn_quan`` is signed here; the official RoBERTa code makes it unsigned, which
    zeroes every negative context value (the ViT path's ``after_attn_quan`` is signed).
    """

    def __init__(self, *, attn: nn.Module, level: int) -> None:
        super().__init__()
        _check_level(level)
        if getattr(attn, "is_decoder", False) or getattr(attn, "is_causal", False):
            raise TypeError("spikezip_tf: only encoder (bidirectional) self-attention can be quantized")
        if getattr(attn, "position_embedding_type", "absolute") not in (None, "absolute"):
            raise TypeError("spikezip_tf: only absolute position embeddings are supported in HF self-attention")
        self.num_attention_heads = int(attn.num_attention_heads)
        self.attention_head_size = int(attn.attention_head_size)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.scaling = float(getattr(attn, "scaling", self.attention_head_size ** -0.5))
        self.query, self.key, self.value = attn.query, attn.key, attn.value
        self.dropout = getattr(attn, "dropout", nn.Identity())
        self.query_quan = Quantizer(level=level, sym=True)
        self.key_quan = Quantizer(level=level, sym=True)
        self.value_quan = Quantizer(level=level, sym=True)
        self.attn_quan = Quantizer(level=level, sym=False)
        self.after_attn_quan = Quantizer(level=level, sym=True)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape[:-1], self.num_attention_heads, self.attention_head_size).transpose(-3, -2)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        for k in ("encoder_hidden_states", "past_key_values", "past_key_value", "head_mask"):
            if kwargs.get(k) is not None:
                raise ValueError(f"spikezip_tf: QSelfAttention does not support {k} (encoder self-attention only)")
        q = self._heads(self.query_quan(self.query(hidden_states)))
        k = self._heads(self.key_quan(self.key(hidden_states)))
        v = self._heads(self.value_quan(self.value(hidden_states)))
        scores = (q @ k.transpose(-1, -2)) * self.scaling
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:  # keep-mask (sdpa-style)
                scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
            else:  # additive (eager-style)
                scores = scores + attention_mask.to(scores.dtype)
        a = self.attn_quan(self.dropout(F.softmax(scores, dim=-1)))
        ctx = self.after_attn_quan(a @ v).transpose(-3, -2)
        return ctx.reshape(*ctx.shape[:-2], self.all_head_size), a


# ----------------------------------------------------------------- structural recognition of model families
def _is_qkv_attention(m: nn.Module) -> bool:
    """timm-layout attention: a fused ``qkv`` Linear, a ``proj`` Linear and ``num_heads``."""
    return (isinstance(getattr(m, "qkv", None), nn.Linear) and isinstance(getattr(m, "proj", None), nn.Linear)
            and hasattr(m, "num_heads") and not isinstance(m, QAttention))


def _is_ffn(m: nn.Module) -> bool:
    """timm-layout FFN: ``fc1`` (Linear), ``act``, ``fc2`` (Linear)."""
    return (isinstance(getattr(m, "fc1", None), nn.Linear) and isinstance(getattr(m, "fc2", None), nn.Linear)
            and isinstance(getattr(m, "act", None), nn.Module))


def _is_patch_embed(name: str, m: nn.Module) -> bool:
    return name.split(".")[-1] == "patch_embed" and isinstance(getattr(m, "proj", None), nn.Conv2d)


def _is_hf_self_attention(m: nn.Module) -> bool:
    """Hugging Face BERT/RoBERTa self-attention: ``query``, ``key``, ``value`` Linears and head counts."""
    return (all(isinstance(getattr(m, n, None), nn.Linear) for n in ("query", "key", "value"))
            and hasattr(m, "num_attention_heads") and hasattr(m, "attention_head_size")
            and not isinstance(m, QSelfAttention))


def _is_hf_intermediate(m: nn.Module) -> bool:
    return isinstance(getattr(m, "dense", None), nn.Linear) and hasattr(m, "intermediate_act_fn")


def _is_hf_output(m: nn.Module) -> bool:
    """``BertSelfOutput`` / ``BertOutput``: ``dense`` then ``LayerNorm(dense(x) + residual)``."""
    return isinstance(getattr(m, "dense", None), nn.Linear) and isinstance(getattr(m, "LayerNorm", None), nn.LayerNorm)


def is_hf_encoder(model: nn.Module) -> bool:
    """A Hugging Face BERT/RoBERTa-style encoder (``embeddings.word_embeddings``, ``encoder.layer``)."""
    emb, enc = getattr(model, "embeddings", None), getattr(model, "encoder", None)
    return (isinstance(getattr(emb, "word_embeddings", None), nn.Embedding)
            and isinstance(getattr(enc, "layer", None), nn.ModuleList))


def quantizers(model: nn.Module) -> list[tuple[str, Quantizer]]:
    """All ``(path, Quantizer)`` pairs of ``model`` in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Quantizer)]


def quantize(model: nn.Module, *, level: int, attn_level: int | None = None) -> nn.Module:
    """Return a QANN: a deep copy of a ReLU transformer with quantizers inserted (official ``myquan_replace``).

    Model families are recognised by structure, not by class:

    - timm-layout ViTs (``common.nets.TinyViT``, timm's ``VisionTransformer`` or any model built the same way):
      every attention with a fused ``qkv`` and ``proj`` -> :class:`QAttention`; every ``nn.LayerNorm`` ->
      ``Sequential(LN, Q(sym))``; every FFN ``fc1/act/fc2``: ``act`` (must be ``nn.ReLU``) ->
      ``Sequential(Q(unsigned), ReLU)`` (the ReLU becomes a no-op), ``fc2`` -> ``Sequential(fc2, Q(sym))``;
      ``patch_embed.proj`` -> ``Sequential(conv, Q(sym))``.
    - Hugging Face BERT/RoBERTa encoders (official RoBERTa layout): each self-attention ->
      :class:`QSelfAttention`; ``intermediate.intermediate_act_fn`` (must be ``nn.ReLU``: ``hidden_act="relu"``)
      -> ``Sequential(Q(unsigned), ReLU)``; the ``dense`` of ``attention.output`` and ``output`` ->
      ``Sequential(dense, Q(sym))``; LayerNorms stay unquantized (their spiking versions emit real-valued
      differences, as in the official code).

    Residual adds, positions, class token, token embeddings and the classifier head stay real-valued.

    Args:
        model: a ReLU transformer of one of the families above (``nn.ReLU`` modules, no GELU).
        level: quantization levels ``L`` (>= 4: signed quantizers need it) of every quantizer (paper: 16 for ViT-S, 32 for ViT-B/L).
        attn_level: levels of the quantizers inside attention (default ``level``).

    Raises:
        TypeError: a non-ReLU activation module (its path is named), an unsupported attention variant, or a
            non-module ``model``.
        ValueError: ``level < 4`` / ``attn_level < 4`` or a model that already holds quantizers.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"spikezip_tf: model must be an nn.Module, got {type(model).__name__}")
    _check_level(level)
    attn_level = level if attn_level is None else attn_level
    _check_level(attn_level, "attn_level")
    check_activations(model)
    if quantizers(model):
        raise ValueError("spikezip_tf: model already contains Quantizer modules (quantize it only once)")
    qann = copy.deepcopy(model)
    hf = is_hf_encoder(qann)
    plan: list[tuple[nn.Module, str, nn.Module]] = []

    def relu_of(owner: str, act: object) -> nn.Module:
        if type(act) is not nn.ReLU:
            raise TypeError(f"spikezip_tf: module '{owner}' is {type(act).__name__}; only nn.ReLU activations can "
                            f"be converted to spikes")
        return act

    for name, m in qann.named_modules():
        if _is_qkv_attention(m):
            for extra in ("q_norm", "k_norm"):
                if not isinstance(getattr(m, extra, nn.Identity()), nn.Identity):
                    raise TypeError(f"spikezip_tf: '{name}.{extra}' (QK-norm) is not supported")
            parent, attr = _parent(qann, name)
            plan.append((parent, attr, QAttention(attn=m, level=attn_level)))
        elif _is_hf_self_attention(m):
            parent, attr = _parent(qann, name)
            plan.append((parent, attr, QSelfAttention(attn=m, level=attn_level)))
        elif hf and _is_hf_intermediate(m):
            act = relu_of(f"{name}.intermediate_act_fn", m.intermediate_act_fn)
            plan.append((m, "intermediate_act_fn", nn.Sequential(Quantizer(level=level, sym=False), act)))
        elif hf and _is_hf_output(m):
            plan.append((m, "dense", nn.Sequential(m.dense, Quantizer(level=level, sym=True))))
        elif isinstance(m, nn.LayerNorm) and not hf:
            parent, attr = _parent(qann, name)
            plan.append((parent, attr, nn.Sequential(m, Quantizer(level=level, sym=True))))
        elif _is_ffn(m):
            act = relu_of(f"{name}.act", m.act)
            plan.append((m, "act", nn.Sequential(Quantizer(level=level, sym=False), act)))
            plan.append((m, "fc2", nn.Sequential(m.fc2, Quantizer(level=level, sym=True))))
        elif _is_patch_embed(name, m):
            plan.append((m, "proj", nn.Sequential(m.proj, Quantizer(level=level, sym=True))))
    for parent, attr, new in plan:
        setattr(parent, attr, new)
    return qann


def _parent(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    if not name:
        raise ValueError("spikezip_tf: the root module itself cannot be replaced")
    *path, attr = name.split(".")
    parent = root
    for p in path:
        parent = getattr(parent, p)
    return parent, attr


@torch.no_grad()
def calibrate(qann: nn.Module, *args: torch.Tensor, **kwargs: torch.Tensor) -> nn.Module:
    """Initialise every not-yet-initialised quantizer from one batch (``s = 2 mean|x| / sqrt(p_max)``).

    Runs ``qann(*args, **kwargs)`` once in eval mode (no dropout); use it instead of the first-training-batch
    init when all ranks of a distributed job must start from the same scales. Returns ``qann``.
    """
    qs = quantizers(qann)
    if not qs:
        raise ValueError("spikezip_tf: calibrate() needs a model with quantizers (call quantize() first)")
    was_training = qann.training
    qann.eval()
    for _, q in qs:
        q._calibrating = True
    try:
        qann(*args, **kwargs)
    finally:
        for _, q in qs:
            q._calibrating = False
        qann.train(was_training)
    return qann

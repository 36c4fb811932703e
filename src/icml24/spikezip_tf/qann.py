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

__all__ = ["Quantizer", "QAttention", "QSelfAttention", "is_hf_encoder", "is_hf_vit", "hf_base_model", "ann_head_paths",
           "quantize", "insert_quantizers", "calibrate", "quantizers", "additive_mask", "check_mask", "check_activations", "check_supported",
           "NONLINEAR_ACTIVATIONS"]

#: activation modules that a spiking network cannot reproduce (only ReLU, merged into an unsigned quantizer, can)
NONLINEAR_ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.SELU, nn.CELU, nn.LeakyReLU, nn.PReLU, nn.RReLU,
    nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Mish, nn.Softplus, nn.Softsign, nn.Tanhshrink, nn.GLU,
    nn.LogSigmoid, nn.Threshold, nn.Softshrink, nn.Hardshrink, nn.ReLU6,
)


def _under(name: str, paths: tuple[str, ...] | frozenset[str]) -> bool:
    """``name`` is one of ``paths`` or inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in paths)


def check_activations(model: nn.Module, *, who: str = "spikezip_tf", exclude: tuple[str, ...] = ()) -> None:
    """Raise ``TypeError`` naming the first activation module that is not ``nn.ReLU``.

    ``nn.ReLU6`` counts as non-ReLU (its upper clip is not part of the unsigned quantizer). Activations called
    functionally inside a ``forward`` cannot be seen here. Modules under the paths in ``exclude`` (the ANN heads
    of :func:`ann_head_paths`, e.g. a BERT pooler's Tanh) are not checked.
    """
    for name, m in model.named_modules():
        if exclude and _under(name, exclude):
            continue
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
    """Quantized Hugging Face BERT/RoBERTa/ViT self-attention (official ``QRobertaSelfAttention`` layout):

    ``q, k, v = Q_q(query(h)), Q_k(key(h)), Q_v(value(h))`` (signed); ``A = Q_attn(softmax(q k^T / sqrt(d) + M))``
    (unsigned); ``context = Q_after(A v)`` (signed). Drop-in for ``BertSelfAttention`` / ``RobertaSelfAttention``
    / ``ViTSelfAttention`` inside the model's own forward (returns ``(context, A)``); ``M`` is the additive or
    boolean mask the model builds from ``attention_mask`` (none for ViT). Submodule names follow the official checkpoints (``query_quan, key_quan,
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
        dropout = getattr(attn, "dropout", None)  # BERT: an nn.Dropout; HF ViT: only the probability
        self.dropout = dropout if isinstance(dropout, nn.Module) else nn.Dropout(float(getattr(attn, "dropout_prob", 0.0)))
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


def is_hf_vit(model: nn.Module) -> bool:
    """A Hugging Face ViT encoder (``ViTModel`` layout): ``embeddings.patch_embeddings.projection``,
    ``embeddings.cls_token`` and ``embeddings.position_embeddings``, ``encoder.layer`` and a final ``layernorm``."""
    emb, enc = getattr(model, "embeddings", None), getattr(model, "encoder", None)
    return (isinstance(getattr(getattr(emb, "patch_embeddings", None), "projection", None), nn.Module)
            and isinstance(getattr(emb, "cls_token", None), torch.Tensor)
            and isinstance(getattr(emb, "position_embeddings", None), torch.Tensor)
            and isinstance(getattr(enc, "layer", None), nn.ModuleList)
            and isinstance(getattr(model, "layernorm", None), nn.Module))


#: Hugging Face task wrappers whose head runs on the encoder output as an ANN head (class-name suffixes)
HF_WRAPPERS = ("ForSequenceClassification", "ForImageClassification")


def hf_base_model(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The Hugging Face encoder of ``model``: ``("", model)`` for a bare ``BertModel`` / ``RobertaModel`` /
    ``ViTModel`` (by structure), ``(prefix, encoder)`` for a task wrapper that holds one at
    ``model.base_model_prefix`` (e.g. ``("bert", model.bert)``), else ``None``."""
    if is_hf_encoder(model) or is_hf_vit(model):
        return "", model
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if isinstance(prefix, str) and prefix else None
    if isinstance(base, nn.Module) and (is_hf_encoder(base) or is_hf_vit(base)):
        return prefix, base
    return None


def hf_head(model: nn.Module) -> tuple[str | None, tuple[str, ...]]:
    """How the non-spiking head of a Hugging Face model runs: ``(kind, paths)``.

    ``kind`` is ``None`` (no head: a non-HF model or an encoder without pooler), ``"pooler"`` (a bare encoder's
    ``pooler``: its output is computed from the accumulated CLS state), ``"pooled_linear"`` (BERT-style
    ``*ForSequenceClassification``: ``classifier(dropout(pooler(h)))``), ``"sequence_head"`` (RoBERTa-style:
    ``classifier(h)``, a ``RobertaClassificationHead``) or ``"cls_linear"`` (``ViTForImageClassification``:
    ``classifier(h[:, 0])``). ``paths`` are the head's module paths, which stay real-valued (ANN) modules.

    Raises:
        TypeError: a Hugging Face task wrapper other than ``*ForSequenceClassification`` (BERT/RoBERTa layout)
            or ``ViTForImageClassification``.
    """
    found = hf_base_model(model)
    if found is None:
        return None, ()
    prefix, base = found
    pooler = getattr(base, "pooler", None)
    pooler_path = (f"{prefix}.pooler" if prefix else "pooler") if isinstance(pooler, nn.Module) else None
    if not prefix:
        return ("pooler", (pooler_path,)) if pooler_path else (None, ())
    name = type(model).__name__
    cls = getattr(model, "classifier", None)
    supported = ("spikezip_tf: supported Hugging Face models are the bare encoders (BertModel, RobertaModel, "
                 "ViTModel; with or without pooler), BERT/RoBERTa *ForSequenceClassification and "
                 "ViTForImageClassification")
    if not name.endswith(HF_WRAPPERS):
        raise TypeError(f"spikezip_tf: cannot convert the Hugging Face wrapper {name} (its task head is not "
                        f"supported); {supported}")
    extra = tuple(p for p in (pooler_path,) if p)
    if is_hf_encoder(base) and name.endswith("ForSequenceClassification"):
        if isinstance(cls, nn.Linear) and pooler_path:
            drop = ("dropout",) if isinstance(getattr(model, "dropout", None), nn.Module) else ()
            return "pooled_linear", (pooler_path, *drop, "classifier")
        if isinstance(cls, nn.Module) and all(isinstance(getattr(cls, n, None), nn.Linear)
                                              for n in ("dense", "out_proj")):
            return "sequence_head", ("classifier", *extra)
    elif is_hf_vit(base) and name.endswith("ForImageClassification") and isinstance(cls, nn.Linear):
        return "cls_linear", ("classifier", *extra)
    raise TypeError(f"spikezip_tf: cannot convert {name}: its classifier "
                    f"({type(cls).__name__}) is not a recognised head; {supported}")


def ann_head_paths(model: nn.Module) -> tuple[str, ...]:
    """Module paths of ``model`` that run as a real-valued ANN head after the spiking encoder (see
    :func:`hf_head`); empty for every non-Hugging-Face family."""
    return hf_head(model)[1]


def _check_hf_layers(model: nn.Module) -> None:
    """Raise ``TypeError`` naming the first Hugging Face encoder layer whose layout the runner cannot follow."""
    found = hf_base_model(model)
    if found is None:
        return
    prefix, base = found
    pre = f"{prefix}." if prefix else ""
    if is_hf_encoder(base):
        if not isinstance(getattr(base.embeddings, "LayerNorm", None), nn.LayerNorm):
            raise TypeError(f"spikezip_tf: '{pre}embeddings' has no LayerNorm (BERT/RoBERTa embeddings layout)")
        need = {"attention.self": _is_hf_self_attention, "attention.output": _is_hf_output,
                "intermediate": _is_hf_intermediate, "output": _is_hf_output}
        layout = "BERT/RoBERTa layer (attention.self, attention.output, intermediate, output)"
    else:
        def is_ln(m: object) -> bool:
            return isinstance(m, nn.LayerNorm)

        def has_dense(m: object) -> bool:
            return isinstance(getattr(m, "dense", None), nn.Linear)

        if not isinstance(base.embeddings.patch_embeddings.projection, nn.Conv2d):
            raise TypeError(f"spikezip_tf: '{pre}embeddings.patch_embeddings.projection' must be an nn.Conv2d")
        if getattr(base.embeddings, "mask_token", None) is not None:
            raise TypeError(f"spikezip_tf: '{pre}embeddings.mask_token' (use_mask_token=True) is not supported")
        if not is_ln(base.layernorm):
            raise TypeError(f"spikezip_tf: '{pre}layernorm' must be an nn.LayerNorm")
        need = {"layernorm_before": is_ln, "attention.attention": _is_hf_self_attention,
                "attention.output": has_dense, "intermediate": _is_hf_intermediate, "output": has_dense,
                "layernorm_after": is_ln}
        layout = ("ViT layer (layernorm_before, attention.attention, attention.output, intermediate, output, "
                  "layernorm_after)")
    for i, layer in enumerate(base.encoder.layer):
        for path, ok in need.items():
            m: object = layer
            for part in path.split("."):
                m = getattr(m, part, None)
            if not ok(m):
                raise TypeError(f"spikezip_tf: '{pre}encoder.layer.{i}.{path}' is {type(m).__name__}, not part of "
                                f"a {layout}")


#: leaf modules that :func:`convert` turns into spiking ones (plus ``nn.ReLU`` at an FFN activation and DropPath)
CONVERTIBLE_LEAVES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d, nn.LayerNorm, nn.Embedding, nn.Dropout,
                                                  nn.Identity)


def check_supported(model: nn.Module) -> None:
    """Raise if :func:`quantize` + :func:`convert` cannot turn ``model`` into an exact SNN; changes nothing.

    Checks, on the float model: a spiking runner exists for its type (the families of :func:`quantize` or one
    added with ``register_runner``); a Hugging Face task head is supported (:func:`hf_head`) and every encoder
    layer has the layout its runner follows; every leaf module outside the ANN head is convertible
    (``Linear``, ``Conv2d``, ``LayerNorm``, ``Embedding``, ``Dropout`` / ``DropPath``, ``Identity``) or an FFN
    activation that is ``nn.ReLU``.

    Raises:
        TypeError: naming the first unsupported module's path and type (or the model type without a runner).
    """
    from icml24.spikezip_tf.snn import _runner_for  # lazy: snn imports this module

    heads = ann_head_paths(model)  # TypeError for an unsupported Hugging Face wrapper
    _runner_for(model)  # TypeError: no runner for this model type
    _check_hf_layers(model)
    acts = set()
    for name, m in model.named_modules():
        pre = f"{name}." if name else ""
        if _is_ffn(m):
            acts.add(pre + "act")
        elif _is_hf_intermediate(m):
            acts.add(pre + "intermediate_act_fn")
    for name, m in model.named_modules():
        if _is_hf_self_attention(m) and not _under(name, heads):
            if getattr(m, "is_decoder", False) or getattr(m, "is_causal", False):
                raise TypeError(f"spikezip_tf: '{name}' ({type(m).__name__}) is decoder (causal) or cross-attention; "
                                f"only encoder (bidirectional) self-attention can be converted")
            if getattr(m, "position_embedding_type", "absolute") not in (None, "absolute"):
                raise TypeError(f"spikezip_tf: '{name}' uses position_embedding_type="
                                f"{m.position_embedding_type!r}; only absolute position embeddings are supported")
        if _under(name, heads) or next(iter(m.children()), None) is not None:
            continue
        if name in acts or isinstance(m, NONLINEAR_ACTIVATIONS):
            if type(m) is not nn.ReLU:
                raise TypeError(f"spikezip_tf: module '{name}' is {type(m).__name__}; only nn.ReLU activations can "
                                f"be converted to spikes (build the model with act_layer=nn.ReLU / "
                                f"hidden_act=\"relu\")")
        elif type(m) is nn.ReLU:
            raise TypeError(f"spikezip_tf: module '{name}' is a ReLU outside an FFN (fc1/act/fc2 or "
                            f"intermediate.intermediate_act_fn); only an FFN's ReLU merges into an unsigned quantizer")
        elif not (isinstance(m, CONVERTIBLE_LEAVES) or type(m).__name__ == "DropPath"
                  or type(m) in (nn.Sequential, nn.ModuleList)):
            raise TypeError(f"spikezip_tf: cannot convert module '{name}' of type {type(m).__name__} (convertible "
                            f"layers: Linear, Conv2d, LayerNorm, Embedding, Dropout/DropPath, Identity, and nn.ReLU "
                            f"as an FFN activation)")


class _QuantizedOutput(nn.Sequential):
    """``Sequential(module, Quantizer)`` that still exposes the wrapped module's ``weight`` and ``bias``
    (Hugging Face's ``ViTModel.forward`` reads ``patch_embeddings.projection.weight.dtype``)."""

    @property
    def weight(self) -> torch.Tensor:
        return self[0].weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self[0].bias


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
    - Hugging Face ViT encoders (``ViTModel`` layout, the timm rules under HF's names): ``attention.attention``
      -> :class:`QSelfAttention`; ``layernorm_before`` / ``layernorm_after`` / the final ``layernorm`` ->
      ``Sequential(LN, Q(sym))``; ``intermediate.intermediate_act_fn`` -> ``Sequential(Q(unsigned), ReLU)``;
      the ``dense`` of ``attention.output`` and ``output`` and ``embeddings.patch_embeddings.projection`` ->
      ``Sequential(module, Q(sym))``.
    - Hugging Face heads (:func:`hf_head`): a bare encoder's ``pooler`` (Tanh), and the heads of BERT/RoBERTa
      ``*ForSequenceClassification`` and ``ViTForImageClassification`` stay real-valued: the SNN runs them as an
      ANN head on its accumulated encoder output.

    Residual adds, positions, class token, token embeddings and the classifier head stay real-valued. The whole
    model is checked first (:func:`check_supported`): an unsupported model raises before anything is built, and
    ``model`` itself is never modified.

    Args:
        model: a ReLU transformer of one of the families above (``nn.ReLU`` modules, no GELU).
        level: quantization levels ``L`` (>= 4: signed quantizers need it) of every quantizer (paper: 16 for ViT-S, 32 for ViT-B/L).
        attn_level: levels of the quantizers inside attention (default ``level``).

    Raises:
        TypeError: a non-ReLU activation module or any other unsupported module (its path and type are named),
            a model type without a spiking runner, an unsupported Hugging Face head or attention variant, or a
            non-module ``model``.
        ValueError: ``level < 4`` / ``attn_level < 4`` or a model that already holds quantizers.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"spikezip_tf: model must be an nn.Module, got {type(model).__name__}")
    _check_level(level)
    attn_level = level if attn_level is None else attn_level
    _check_level(attn_level, "attn_level")
    heads = ann_head_paths(model)
    check_activations(model, exclude=heads)
    if quantizers(model):
        raise ValueError("spikezip_tf: model already contains Quantizer modules (quantize it only once)")
    check_supported(model)
    qann = copy.deepcopy(model)
    insert_quantizers(qann, level=level, attn_level=attn_level)
    return qann


def insert_quantizers(qann: nn.Module, *, level: int, attn_level: int) -> None:
    """Insert the quantizers of :func:`quantize` into ``qann`` in place (no support check, no copy)."""
    found = hf_base_model(qann)
    base = found[1] if found else qann
    hf = found is not None and is_hf_encoder(base)
    vit = found is not None and not hf and is_hf_vit(base)
    heads = ann_head_paths(qann)
    plan: list[tuple[nn.Module, str, nn.Module]] = []

    def relu_of(owner: str, act: object) -> nn.Module:
        if type(act) is not nn.ReLU:
            raise TypeError(f"spikezip_tf: module '{owner}' is {type(act).__name__}; only nn.ReLU activations can "
                            f"be converted to spikes")
        return act

    def signed_after(owner: nn.Module, attr: str) -> None:
        plan.append((owner, attr, nn.Sequential(getattr(owner, attr), Quantizer(level=level, sym=True))))

    for name, m in qann.named_modules():
        if heads and _under(name, heads):
            continue  # the ANN head stays real-valued
        if _is_qkv_attention(m):
            for extra in ("q_norm", "k_norm"):
                if not isinstance(getattr(m, extra, nn.Identity()), nn.Identity):
                    raise TypeError(f"spikezip_tf: '{name}.{extra}' (QK-norm) is not supported")
            parent, attr = _parent(qann, name)
            plan.append((parent, attr, QAttention(attn=m, level=attn_level)))
        elif _is_hf_self_attention(m):
            parent, attr = _parent(qann, name)
            plan.append((parent, attr, QSelfAttention(attn=m, level=attn_level)))
        elif (hf or vit) and _is_hf_intermediate(m):
            act = relu_of(f"{name}.intermediate_act_fn", m.intermediate_act_fn)
            plan.append((m, "intermediate_act_fn", nn.Sequential(Quantizer(level=level, sym=False), act)))
        elif hf and _is_hf_output(m):
            signed_after(m, "dense")
        elif isinstance(m, nn.LayerNorm) and not hf:
            parent, attr = _parent(qann, name)
            plan.append((parent, attr, nn.Sequential(m, Quantizer(level=level, sym=True))))
        elif _is_ffn(m):
            act = relu_of(f"{name}.act", m.act)
            plan.append((m, "act", nn.Sequential(Quantizer(level=level, sym=False), act)))
            signed_after(m, "fc2")
        elif _is_patch_embed(name, m):
            signed_after(m, "proj")
    if vit:
        for layer in base.encoder.layer:
            signed_after(layer.attention.output, "dense")  # timm's quan_proj
            signed_after(layer.output, "dense")  # timm's fc2 quantizer
        pe = base.embeddings.patch_embeddings
        plan.append((pe, "projection", _QuantizedOutput(pe.projection, Quantizer(level=level, sym=True))))
    for parent, attr, new in plan:
        setattr(parent, attr, new)


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

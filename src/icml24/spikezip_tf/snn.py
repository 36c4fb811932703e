"""SpikeZIP-TF conversion: QANN -> spiking transformer with ST-BIF neurons and spike-equivalent operators.

Paper: "SpikeZIP-TF: Conversion is All You Need for Transformer-based SNN", You, Xu et al., ICML 2024,
arXiv:2406.03470; official code: github.com/Intelligent-Computing-Research-Group/SpikeZIP_transformer
(``spike_quan_layer.IFNeuron``, ``spiking_softmax``, ``Spiking_LayerNorm``, ``SAttention``; ``SNNWrapper``).

ST-BIF neuron (threshold s = quantizer step, membrane in units of s, spike tracer S_t):

    v_0 = 1/2,  S_0 = 0;   v_t = v_{t-1} + x_t / s
    o_t = +1 if v_t >= 1 and S_{t-1} < p_max;  -1 if v_t < 0 and S_{t-1} > n_min;  else 0
    S_t = S_{t-1} + o_t,  v_t <- v_t - o_t,  output o_t * s
    => once quiet, sum_t o_t s = Q(sum_t x_t)   (for any input schedule)

Operators emit the difference of their function of the running input sum: f(X_t) - f(X_{t-1}); spike-train
matmul uses A_t b_t^T + a_t B_t^T - a_t b_t^T (A, B running sums including step t), so sum_t = A_T B_T^T.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as val

from icml24.common.nets import TinyViT
from icml24.spikezip_tf.qann import (
    QAttention,
    Quantizer,
    additive_mask,
    check_activations,
    check_mask,
    quantizers,
)
from icml24.spikezip_tf.text import TinyTextEncoder

__all__ = ["STBIFNeuron", "SpikeLinear", "SpikeConv2d", "SpikeMatmul", "SpikingSoftmax", "SpikingLayerNorm",
           "SpikingAttention", "SpikingModel", "SimulationResult", "convert", "simulate", "count_macs",
           "register_runner"]


class _Stateful(nn.Module):
    """A module with per-sample state that :meth:`reset` clears (shapes follow the batch)."""

    def reset(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class STBIFNeuron(_Stateful):
    """Spike-tracer bipolar integrate-and-fire neuron (ST-BIF; official ``IFNeuron``).

    Args:
        threshold: firing threshold ``V_thr`` = the replaced quantizer's step ``s`` (> 0).
        pos_max: spike-tracer ceiling ``p_max`` (the quantizer's largest level).
        neg_min: spike-tracer floor ``n_min`` (0 for an unsigned quantizer).
        v_init: initial membrane in threshold units (paper: 1/2, realising round-half-up).
        negative_spikes: allow -1 spikes that undo an earlier overshoot (paper: True).

    After each call ``last_spikes`` holds the number of non-zero spikes per sample (shape ``(B,)``).
    """

    def __init__(self, *, threshold: float | torch.Tensor, pos_max: int, neg_min: int, v_init: float = 0.5,
                 negative_spikes: bool = True) -> None:
        super().__init__()
        val.positive("spikezip_tf", "threshold", threshold)
        thr = (threshold.detach().clone() if isinstance(threshold, torch.Tensor)
               else torch.tensor(float(threshold), dtype=torch.float64))
        if pos_max < neg_min:
            raise ValueError(f"spikezip_tf: pos_max ({pos_max}) must be >= neg_min ({neg_min})")
        val.in_range("spikezip_tf", "v_init", v_init, 0.0, 1.0, high_open=True)
        self.register_buffer("threshold", thr.reshape(()))
        self.pos_max = int(pos_max)
        self.neg_min = int(neg_min)
        self.v_init = float(v_init)
        self.negative_spikes = bool(negative_spikes)
        self.reset()

    @classmethod
    def from_quantizer(cls, q: Quantizer, *, negative_spikes: bool | str = True, **kw) -> STBIFNeuron:
        """The neuron that replaces quantizer ``q`` (threshold ``q.s``, tracer range ``[q.neg_min, q.pos_max]``).

        ``negative_spikes`` may also be ``"signed"`` / ``"unsigned"``: keep -1 spikes only if ``q`` is signed /
        unsigned (the split ablations).
        """
        if isinstance(negative_spikes, str):
            negative_spikes = q.sym if negative_spikes == "signed" else not q.sym
        return cls(threshold=q.s.detach(), pos_max=q.pos_max, neg_min=q.neg_min, negative_spikes=negative_spikes,
                   **kw)

    def extra_repr(self) -> str:
        return (f"threshold={float(self.threshold):.6g}, range=[{self.neg_min}, {self.pos_max}], "
                f"v_init={self.v_init}, negative_spikes={self.negative_spikes}")

    def reset(self) -> None:
        self.v: torch.Tensor | None = None  # membrane, threshold units
        self.acc: torch.Tensor | None = None  # spike tracer S_t (integer-valued)
        self.last_spikes: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.v is None or self.v.shape != x.shape:
            if self.v is not None:
                raise RuntimeError("spikezip_tf: input shape changed between steps; call reset() between batches")
            self.v = torch.full_like(x, self.v_init)
            self.acc = torch.zeros_like(x)
        v = self.v + x / self.threshold
        pos = (v >= 1.0) & (self.acc < self.pos_max)
        o = pos.to(x.dtype)
        if self.negative_spikes:
            o = o - ((v < 0.0) & (self.acc > self.neg_min)).to(x.dtype)
        self.acc = self.acc + o
        self.v = v - o
        self.last_spikes = o.ne(0).reshape(o.shape[0], -1).sum(1)
        return o * self.threshold


class _OnceBias(_Stateful):
    def reset(self) -> None:
        self.first = True
        self.last_sops: torch.Tensor | None = None

    def _bias(self) -> torch.Tensor | None:
        b = self.bias if self.first else None
        self.first = False
        return b


class SpikeLinear(_OnceBias):
    """``y_t = W x_t (+ b at the first step only)``, so ``sum_t y_t = W sum_t x_t + b`` (official ``LLLinear``)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.out_features = linear.out_features
        self.reset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_sops = x.ne(0).sum() * self.out_features  # each non-zero input event fans out to every output
        return F.linear(x, self.weight, self._bias())


class SpikeConv2d(_OnceBias):
    """Convolution with the bias injected at the first step only (official ``LLConv2d``)."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise TypeError("spikezip_tf: only Conv2d with numeric zero padding can be converted")
        self.weight, self.bias = conv.weight, conv.bias
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        kh, kw = conv.kernel_size
        sh, sw = conv.stride
        self.fan_out = conv.out_channels * kh * kw / (sh * sw * conv.groups)
        self.reset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_sops = x.ne(0).sum() * self.fan_out
        return F.conv2d(x, self.weight, self._bias(), self.stride, self.padding, self.dilation, self.groups)


class SpikeMatmul(_Stateful):
    """Product of two spike trains: ``out_t = A_t b_t + a_t B_t - a_t b_t`` with running sums ``A_t, B_t``
    (including step t), so that ``sum_t out_t = A_T B_T`` (paper's spike-equivalent self-attention)."""

    def reset(self) -> None:
        self.A: torch.Tensor | None = None
        self.B: torch.Tensor | None = None
        self.last_sops: torch.Tensor | None = None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.A = a if self.A is None else self.A + a
        self.B = b if self.B is None else self.B + b
        # SOPs: each event of b_t meets every row of A_t, each event of a_t every column of B_t
        self.last_sops = b.ne(0).sum() * a.shape[-2] + a.ne(0).sum() * b.shape[-1]
        return self.A @ b + a @ self.B - a @ b


class _Differencing(_Stateful):
    """Emit ``f(X_t) - f(X_{t-1})`` with ``X_t`` the running input sum and ``f(X_{-1}) := 0``."""

    def reset(self) -> None:
        self.X: torch.Tensor | None = None
        self.Y: torch.Tensor | None = None

    def fn(self, X: torch.Tensor) -> torch.Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.X = x if self.X is None else self.X + x
        y = self.fn(self.X)
        out = y if self.Y is None else y - self.Y
        self.Y = y
        return out


class SpikingSoftmax(_Differencing):
    """Spike-equivalent softmax over ``dim`` (official ``spiking_softmax``)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim
        self.reset()

    def fn(self, X: torch.Tensor) -> torch.Tensor:
        return F.softmax(X, dim=self.dim)


class SpikingLayerNorm(_Differencing):
    """Spike-equivalent LayerNorm with the original affine parameters (official ``Spiking_LayerNorm``)."""

    def __init__(self, ln: nn.LayerNorm) -> None:
        super().__init__()
        self.ln = ln
        self.reset()

    def fn(self, X: torch.Tensor) -> torch.Tensor:
        return self.ln(X)


class SpikingAttention(_Stateful):
    """Spike-equivalent self-attention (official ``SAttention``), converted from a :class:`QAttention`.

    Per step: ``q,k,v`` spikes from ST-BIF neurons; scores by :class:`SpikeMatmul` (the additive mask joins at
    the first step only); :class:`SpikingSoftmax`; ST-BIF ``attn_quan``; :class:`SpikeMatmul` with ``v``; ST-BIF
    ``after_attn_quan``; ``proj`` (:class:`SpikeLinear`); ST-BIF ``quan_proj``.
    """

    def __init__(self, qattn: QAttention, **neuron_kw) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.scale = qattn.num_heads, qattn.head_dim, qattn.scale
        self.qkv = SpikeLinear(qattn.qkv)
        self.proj = SpikeLinear(qattn.proj)
        for name in ("quan_q", "quan_k", "quan_v", "attn_quan", "after_attn_quan", "quan_proj"):
            setattr(self, name, STBIFNeuron.from_quantizer(getattr(qattn, name), **neuron_kw))
        self.qk = SpikeMatmul()
        self.softmax = SpikingSoftmax(dim=-1)
        self.av = SpikeMatmul()
        self.reset()

    def reset(self) -> None:
        self.first = True

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        check_mask(mask, b, n)
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = self.quan_q(q), self.quan_k(k), self.quan_v(v)
        s = self.qk(q * self.scale, k.transpose(-2, -1))
        if self.first:
            m = additive_mask(mask, s.dtype)
            if m is not None:
                s = s + m  # the mask is an input like an embedding: present once, at t = 0
        self.first = False
        a = self.attn_quan(self.softmax(s))
        o = self.after_attn_quan(self.av(a, v)).transpose(1, 2).reshape(b, n, c)
        return self.quan_proj(self.proj(o))


# ---------------------------------------------------------------------------------------------- runners
# A runner performs one time step of a converted top-level model: (net, x_t, t, **kw) -> output_t. Inputs that
# are not spike-driven (class token, position table, token embeddings) enter at t = 0 only.

Runner = Callable[..., torch.Tensor]


def _vit_step(net: TinyViT, x_t: torch.Tensor, t: int, **_: object) -> torch.Tensor:
    h = net.patch_embed(x_t)
    b, _n, c = h.shape
    if t == 0:
        h = torch.cat([net.cls_token.to(h.dtype).expand(b, -1, -1), h], dim=1) + net.pos_embed.to(h.dtype)
    else:
        h = torch.cat([h.new_zeros(b, 1, c), h], dim=1)
    return net.head(net.norm(net.blocks(h))[:, 0])


def _text_step(net: TinyTextEncoder, ids: torch.Tensor, t: int, mask: torch.Tensor | None = None,
               **_: object) -> torch.Tensor:
    e = net.embed(ids).to(net.pos_embed.dtype)
    h = net.emb_norm(e if t == 0 else torch.zeros_like(e))
    for blk in net.blocks:
        h = blk(h, mask=mask)
    return net.head(net.norm(h)[:, 0])


_RUNNERS: dict[type[nn.Module], tuple[Runner, bool]] = {TinyViT: (_vit_step, True),
                                                        TinyTextEncoder: (_text_step, False)}


def register_runner(model_type: type[nn.Module], runner: Runner, *, zero_input_after_first: bool) -> None:
    """Teach :func:`convert` a new top-level model type.

    Args:
        model_type: the (Q)ANN's class.
        runner: ``runner(net, x_t, t, **kw) -> out_t`` running one time step of the converted ``net``.
        zero_input_after_first: analog encoding: feed ``x`` at t = 0 and zeros afterwards (True), or hand
            ``x`` at every step and let the runner use it only at t = 0 (False, e.g. token ids).
    """
    _RUNNERS[model_type] = (runner, zero_input_after_first)


def _runner_for(model: nn.Module) -> tuple[Runner, bool]:
    for t in type(model).__mro__:
        if t in _RUNNERS:
            return _RUNNERS[t]
    raise TypeError(f"spikezip_tf: no runner for {type(model).__name__}; supported: "
                    f"{', '.join(t.__name__ for t in _RUNNERS)} (see register_runner)")


class SpikingModel(nn.Module):
    """A converted spiking network: call :meth:`step` once per time step after :meth:`reset`.

    ``sum_t step(x_t)`` over a run until quiescence equals the QANN output. Use :func:`simulate`.
    """

    def __init__(self, net: nn.Module, runner: Runner, zero_input_after_first: bool) -> None:
        super().__init__()
        self.net = net
        self._runner = runner
        self.zero_input_after_first = zero_input_after_first
        self.t = 0

    def reset(self) -> None:
        """Clear every neuron's and operator's state (required between batches)."""
        for m in self.net.modules():
            if isinstance(m, _Stateful):
                m.reset()
        self.t = 0

    def neurons(self) -> list[tuple[str, STBIFNeuron]]:
        return [(n, m) for n, m in self.net.named_modules() if isinstance(m, STBIFNeuron)]

    def synaptic_ops(self) -> list[tuple[str, nn.Module]]:
        return [(n, m) for n, m in self.net.named_modules() if isinstance(m, (_OnceBias, SpikeMatmul))]

    @torch.no_grad()
    def step(self, x_t: torch.Tensor, **kw: object) -> torch.Tensor:
        out = self._runner(self.net, x_t, self.t, **kw)
        self.t += 1
        return out

    def forward(self, x_t: torch.Tensor, **kw: object) -> torch.Tensor:
        return self.step(x_t, **kw)


def _is_unsigned_quantizer(m: nn.Module | None) -> bool:
    return isinstance(m, Quantizer) and m.neg_min == 0


def _convert_children(module: nn.Module, prefix: str, neuron_kw: dict) -> None:
    prev: nn.Module | None = None
    for name, child in list(module.named_children()):
        path = f"{prefix}.{name}" if prefix else name
        new: nn.Module | None
        if isinstance(child, Quantizer):
            new = STBIFNeuron.from_quantizer(child, **neuron_kw)
        elif isinstance(child, QAttention):
            new = SpikingAttention(child, **neuron_kw)
        elif isinstance(child, nn.Linear):
            new = SpikeLinear(child)
        elif isinstance(child, nn.Conv2d):
            new = SpikeConv2d(child)
        elif isinstance(child, nn.LayerNorm):
            new = SpikingLayerNorm(child)
        elif type(child) is nn.ReLU:
            if not _is_unsigned_quantizer(prev):
                raise TypeError(f"spikezip_tf: ReLU at '{path}' does not follow an unsigned quantizer; quantize "
                                f"the model first (quantize() merges each FFN ReLU into one)")
            new = nn.Identity()  # the unsigned ST-BIF neuron already realises max(., 0)
        elif isinstance(child, nn.Dropout):
            new = nn.Identity()
        elif isinstance(child, (nn.Identity, nn.Embedding)):
            new = None  # embeddings are used by the runner at t = 0 only
        elif len(list(child.children())) == 0 and type(child) not in (nn.Sequential, nn.ModuleList):
            raise TypeError(f"spikezip_tf: cannot convert module '{path}' of type {type(child).__name__}")
        else:
            new = None
            _convert_children(child, path, neuron_kw)
        if new is not None:
            setattr(module, name, new)
        prev = child


def convert(qann: nn.Module, *, dtype: torch.dtype | None = None, v_init: float = 0.5,
            negative_spikes: bool | str = True) -> SpikingModel:
    """Convert a QANN (from :func:`quantize`, trained or not) into a :class:`SpikingModel`.

    Quantizer -> :class:`STBIFNeuron` (threshold = step ``s``); ``QAttention`` -> :class:`SpikingAttention`;
    Linear/Conv2d -> bias-once ops; LayerNorm -> :class:`SpikingLayerNorm`; the FFN ReLU -> Identity;
    Dropout -> Identity. The QANN is not modified.

    Args:
        qann: a quantized ``TinyViT`` or ``TinyTextEncoder`` (or a type added with :func:`register_runner`).
        dtype: cast the spiking network to this dtype (e.g. ``torch.float64`` for exact checks).
        v_init: initial membrane in threshold units (paper 1/2; 0 is the "no half-threshold" ablation).
        negative_spikes: allow -1 spikes (paper True; False is the "no negative spikes" ablation);
            ``"signed"`` keeps them only in signed neurons (ablation: none in the unsigned ones, i.e. the FFN
            hidden layer and the attention probabilities), ``"unsigned"`` only in unsigned neurons (ablation:
            signed neurons, which then cannot represent a negative value at all).

    Raises:
        TypeError: a non-ReLU activation (path named), a ReLU outside a quantized FFN, an unknown leaf module
            or top-level model type.
        ValueError: a model without quantizers.
    """
    if not isinstance(qann, nn.Module):
        raise TypeError(f"spikezip_tf: qann must be an nn.Module, got {type(qann).__name__}")
    check_activations(qann)
    runner, zero_after = _runner_for(qann)
    if not quantizers(qann):
        raise ValueError("spikezip_tf: the model has no quantizers; call quantize() (and train it) before convert()")
    if isinstance(qann, (Quantizer, QAttention)):
        raise TypeError("spikezip_tf: convert() takes a whole model, not a single layer")
    if not (isinstance(negative_spikes, bool) or negative_spikes in ("signed", "unsigned")):
        raise ValueError(f"spikezip_tf: negative_spikes must be True, False, 'signed' or 'unsigned', "
                         f"got {negative_spikes!r}")
    neuron_kw = dict(v_init=v_init, negative_spikes=negative_spikes)
    STBIFNeuron(threshold=1.0, pos_max=1, neg_min=0, v_init=v_init)  # validates v_init before the deep copy
    net = copy.deepcopy(qann).eval()
    _convert_children(net, "", neuron_kw)
    if dtype is not None:
        net = net.to(dtype)
    for p in net.parameters():
        p.requires_grad_(False)
    snn = SpikingModel(net, runner, zero_after)
    snn.reset()
    return snn


@dataclass
class SimulationResult:
    """What :func:`simulate` measured.

    Attributes:
        outputs: per-step outputs ``(T, B, C)``; ``outputs.sum(0)`` is the SNN's answer.
        quiescent_step: first step index t with no spike anywhere (all later outputs are exactly zero), or
            ``None`` if the cap was reached first.
        sample_quiescent_step: per sample, the first step with no spike in that sample (-1 if never).
        spikes_per_layer: total non-zero spikes per ST-BIF layer (path -> count).
        sops_per_layer: synaptic operations (spike events x fan-out) per consuming layer (path -> count).
        spikes_per_step: total spikes at each step ``(T,)``.
        sops_per_step: total synaptic operations at each step ``(T,)``.
    """

    outputs: torch.Tensor
    quiescent_step: int | None
    sample_quiescent_step: torch.Tensor
    spikes_per_layer: dict[str, int] = field(default_factory=dict)
    sops_per_layer: dict[str, float] = field(default_factory=dict)
    spikes_per_step: torch.Tensor | None = None
    sops_per_step: torch.Tensor | None = None

    @property
    def num_steps(self) -> int:
        return int(self.outputs.shape[0])

    @property
    def logits(self) -> torch.Tensor:
        """The accumulated output ``sum_t out_t``."""
        return self.outputs.sum(0)

    def cumulative(self) -> torch.Tensor:
        """Running sums ``(T, B, C)``: the SNN's answer if stopped after each step."""
        return self.outputs.cumsum(0)


@torch.no_grad()
def simulate(snn: SpikingModel, x: torch.Tensor, *, max_steps: int, until_quiescent: bool = True,
             mask: torch.Tensor | None = None) -> SimulationResult:
    """Run ``snn`` with analog encoding (``x`` at t = 0, zeros after) from a fresh reset.

    Args:
        snn: a :class:`SpikingModel` from :func:`convert`.
        x: input batch (images ``(B, C, H, W)`` or token ids ``(B, N)``); floats are cast to the SNN's dtype.
        max_steps: step cap ``T_max`` (>= 1).
        until_quiescent: stop at the first step without any spike (later outputs would be exactly 0).
        mask: optional key mask ``(B, N)`` for text encoders (applied at t = 0).

    Returns:
        A :class:`SimulationResult`.
    """
    if not isinstance(snn, SpikingModel):
        raise TypeError(f"spikezip_tf: snn must be a SpikingModel (from convert()), got {type(snn).__name__}")
    val.integer("spikezip_tf", "max_steps", max_steps, minimum=1)
    val.tensor("spikezip_tf", "x", x)
    p = next(iter(snn.net.parameters()))
    x = x.to(p.device)
    if x.is_floating_point():
        x = x.to(p.dtype)
    if mask is not None:
        mask = mask.to(p.device)
    neurons = snn.neurons()
    ops = snn.synaptic_ops()
    snn.reset()
    outs: list[torch.Tensor] = []
    spikes_layer = {n: torch.zeros((), dtype=torch.long, device=p.device) for n, _ in neurons}
    sops_layer = {n: torch.zeros((), dtype=torch.float64, device=p.device) for n, _ in ops}
    spikes_step, sops_step, sample_steps = [], [], []
    quiet: int | None = None
    zeros = torch.zeros_like(x) if snn.zero_input_after_first else x
    for t in range(max_steps):
        outs.append(snn.step(x if t == 0 else zeros, mask=mask))
        per_sample = torch.zeros(x.shape[0], dtype=torch.long, device=p.device)
        for n, m in neurons:
            if m.last_spikes is not None:
                per_sample += m.last_spikes
                spikes_layer[n] += m.last_spikes.sum()
        step_sops = torch.zeros((), dtype=torch.float64, device=p.device)
        for n, m in ops:
            if m.last_sops is not None:
                sops_layer[n] += m.last_sops
                step_sops += m.last_sops
                m.last_sops = None
        for _, m in neurons:
            m.last_spikes = None
        sample_steps.append(per_sample)
        total = int(per_sample.sum())  # one host sync per step
        spikes_step.append(total)
        sops_step.append(step_sops)
        if total == 0:
            if quiet is None:
                quiet = t  # the FIRST silent step (later steps stay silent)
            if until_quiescent:
                break
    per = torch.stack(sample_steps)  # (T, B)
    silent = per.eq(0)
    first = torch.where(silent.any(0), silent.float().argmax(0), torch.full_like(per[0], -1))
    return SimulationResult(
        outputs=torch.stack(outs), quiescent_step=quiet, sample_quiescent_step=first,
        spikes_per_layer={n: int(v) for n, v in spikes_layer.items()},
        sops_per_layer={n: float(v) for n, v in sops_layer.items()},
        spikes_per_step=torch.tensor(spikes_step), sops_per_step=torch.stack(sops_step).cpu())


@torch.no_grad()
def count_macs(model: nn.Module, *args: torch.Tensor, **kwargs: torch.Tensor) -> dict[str, float]:
    """Multiply-accumulates of one ANN/QANN forward, per layer (Linear, Conv2d, the two attention matmuls).

    Returns ``{path: MACs}`` summed over the batch; divide by the batch size for per-sample MACs.
    """
    macs: dict[str, float] = {}
    hooks = []

    def lin(name):
        def h(m, inp, out):
            macs[name] = macs.get(name, 0.0) + out.numel() * m.in_features
        return h

    def conv(name):
        def h(m, inp, out):
            kh, kw = m.kernel_size
            macs[name] = macs.get(name, 0.0) + out.numel() * (m.in_channels // m.groups) * kh * kw
        return h

    def att(name):
        def h(m, inp, out):
            b, n, c = inp[0].shape
            macs[name + ".matmul"] = macs.get(name + ".matmul", 0.0) + 2.0 * b * n * n * c
        return h

    from icml24.common.nets import Attention

    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(lin(name)))
        elif isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv(name)))
        elif isinstance(m, (Attention, QAttention)):
            hooks.append(m.register_forward_hook(att(name)))
    was = model.training
    model.eval()
    try:
        model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    return macs

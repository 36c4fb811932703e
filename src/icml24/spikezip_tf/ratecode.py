"""Conventional rate-coded ANN -> SNN conversion: the baseline SpikeZIP-TF is measured against.

The field's recipe (Diehl et al. 2015; Rueckauer et al. 2017; SpikingJelly ``ann2snn.RateCodingRecipe``):
integrate-and-fire neurons with reset by subtraction replace the activations, thresholds come from
percentile max-normalisation of the float ANN's activations on calibration data, the analog input is presented
at every step (constant-current coding), biases are injected at every step, and the answer after T steps is the
mean of the T per-step outputs:

    v_t = v_{t-1} + z_t;   o_t = +1 if v_t >= lambda (-1 if signed and v_t <= -lambda) else 0;   v_t -= o_t lambda
    lambda = percentile_p(activation) (p = 99.9, SpikingJelly mode "99.9%");   y(T) = (1/T) sum_t out_t

For an MLP/CNN (what SpikingJelly converts) every ``nn.ReLU`` becomes an unsigned IF neuron, exactly as
SpikingJelly does (cross-checked in the tests). For a transformer (softmax, LayerNorm, attention, which
SpikingJelly's rate recipe leaves untouched) this module places IF neurons at the same sites as SpikeZIP-TF's
quantizers (``quantize``): signed neurons (bipolar IF, reset by subtraction, no spike tracer) where activations
are signed, unsigned ones after the FFN's fc1 and on the attention probabilities; the non-linear operators act
on the running *mean* of their spiking inputs (rate decoding), which is the most favourable reading of a rate
code: the only conversion error left is the IF neurons' rate quantisation and transient.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as val
from icml24.common.nets import Attention, Mlp
from icml24.spikezip_tf.qann import QAttention, Quantizer, check_activations, insert_quantizers

__all__ = ["RateIFNeuron", "RateCodedModel", "rate_convert", "rate_simulate"]

_WHO = "spikezip_tf.rate_convert"
_QUANTILE_MAX = 16_000_000  # torch.quantile's input limit


class RateIFNeuron(nn.Module):
    """Integrate-and-fire neuron with reset by subtraction (SpikingJelly ``IFNode(v_reset=None)``).

    Args:
        threshold: ``lambda`` (> 0); each spike carries the value ``lambda``.
        signed: also fire ``-1`` when ``v <= -lambda`` (bipolar IF for signed activations).
        v_init: initial membrane in threshold units (SpikingJelly: 0; ``half_threshold``: 1/2).
    """

    def __init__(self, *, threshold: float, signed: bool = False, v_init: float = 0.0) -> None:
        super().__init__()
        val.positive(_WHO, "threshold", threshold)
        val.in_range(_WHO, "v_init", v_init, 0.0, 1.0, high_open=True)
        self.register_buffer("threshold", torch.tensor(float(threshold), dtype=torch.float64))
        self.signed = bool(signed)
        self.v_init = float(v_init)
        self.reset()

    def extra_repr(self) -> str:
        return f"threshold={float(self.threshold):.6g}, signed={self.signed}, v_init={self.v_init}"

    def reset(self) -> None:
        self.v: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lam = self.threshold.to(x.dtype)
        if self.v is None:
            self.v = torch.full_like(x, self.v_init) * lam
        v = self.v + x
        o = (v >= lam).to(x.dtype)
        if self.signed:
            o = o - (v <= -lam).to(x.dtype)
        self.v = v - o * lam
        return o * lam


class _Recorder(nn.Module):
    """Identity that keeps the activations a neuron will replace (|a| if signed, relu(a) if not)."""

    def __init__(self, signed: bool) -> None:
        super().__init__()
        self.signed = signed
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((x.abs() if self.signed else x.clamp_min(0)).detach().flatten())
        return x if self.signed else x.clamp_min(0)

    def threshold(self, percentile: float) -> float:
        a = torch.cat(self.seen).double()
        if a.numel() > _QUANTILE_MAX:
            a = a[:: -(-a.numel() // _QUANTILE_MAX)]
        lam = float(torch.quantile(a, percentile / 100.0))
        return lam if lam > 0 else float(a.max()) if float(a.max()) > 0 else 1.0


class _MeanOp(nn.Module):
    """Apply ``fn`` to the running mean of the inputs received so far (rate decoding of a non-linear op)."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.reset()

    def reset(self) -> None:
        self.S: torch.Tensor | None = None
        self.t = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.S = x if self.S is None else self.S + x
        self.t += 1
        return self.fn(self.S / self.t)


class _RateAttention(nn.Module):
    """Attention on rates: ``softmax(scale * mean(q) mean(k)^T)`` and ``mean(A) mean(v)``, IF neurons between."""

    def __init__(self, qattn: QAttention) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.scale = qattn.num_heads, qattn.head_dim, qattn.scale
        self.qkv, self.proj = qattn.qkv, qattn.proj
        for name in ("quan_q", "quan_k", "quan_v", "attn_quan", "after_attn_quan", "quan_proj"):
            setattr(self, name, getattr(qattn, name))
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.t = 0

    def _mean(self, key: str, x: torch.Tensor) -> torch.Tensor:
        self.sums[key] = x if key not in self.sums else self.sums[key] + x
        return self.sums[key] / self.t

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is not None:
            raise NotImplementedError(f"{_WHO}: masks are not supported by the rate-coded baseline")
        b, n, c = x.shape
        self.t += 1
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = self.quan_q(q), self.quan_k(k), self.quan_v(v)
        scores = (self._mean("q", q) * self.scale) @ self._mean("k", k).transpose(-2, -1)
        a = self.attn_quan(F.softmax(scores, dim=-1))
        o = self.after_attn_quan(self._mean("a", a) @ self._mean("v", v)).transpose(1, 2).reshape(b, n, c)
        return self.quan_proj(self.proj(o))


class RateCodedModel(nn.Module):
    """A rate-coded SNN: the ANN's own forward, run once per time step with the same input.

    Attributes:
        net: the converted network (IF neurons in place of activations, rate-decoded non-linear operators).
        thresholds: ``{site path: lambda}`` from percentile max-normalisation.
    """

    def __init__(self, net: nn.Module, thresholds: dict[str, float]) -> None:
        super().__init__()
        self.net = net
        self.thresholds = thresholds

    def reset(self) -> None:
        for m in self.net.modules():
            if isinstance(m, (RateIFNeuron, _MeanOp, _RateAttention)):
                m.reset()

    def neurons(self) -> list[tuple[str, RateIFNeuron]]:
        return [(n, m) for n, m in self.net.named_modules() if isinstance(m, RateIFNeuron)]

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.step(x)


def _is_transformer(model: nn.Module) -> bool:
    return any(isinstance(m, (Attention, QAttention, nn.LayerNorm, Mlp)) for m in model.modules())


def _swap(root: nn.Module, pred, make) -> None:
    for name, child in list(root.named_children()):
        if pred(child):
            setattr(root, name, make(child))
        else:
            _swap(child, pred, make)


@torch.no_grad()
def rate_convert(ann: nn.Module, calib_x: torch.Tensor, *, percentile: float = 99.9,
                 v_init: float = 0.0) -> RateCodedModel:
    """Convert a float ReLU ANN into a rate-coded SNN (IF neurons, reset by subtraction, percentile norm).

    Args:
        ann: a float ReLU network: an MLP/CNN of ``Linear``/``Conv``/``ReLU``/``Flatten``/pooling modules
            (every ``nn.ReLU`` becomes an unsigned IF neuron, as in SpikingJelly), or a ``TinyViT``-style
            transformer built from ``common.nets`` blocks (IF neurons at SpikeZIP-TF's quantizer sites).
        calib_x: calibration inputs (training data), one batch.
        percentile: ``p`` of the threshold ``lambda = percentile_p(activation)`` (SpikingJelly "99.9%").
        v_init: initial membrane in threshold units (0 = SpikingJelly's default).

    Returns:
        A :class:`RateCodedModel` (the ANN is not modified). Run it with :func:`rate_simulate`.

    Raises:
        TypeError: a non-ReLU activation module, a non-module ``ann`` or an already quantized model.
        ValueError: ``percentile`` outside (0, 100], ``v_init`` outside [0, 1), a non-tensor ``calib_x``, a
            model without any ReLU or transformer block.
    """
    if not isinstance(ann, nn.Module):
        raise TypeError(f"{_WHO}: ann must be an nn.Module, got {type(ann).__name__}")
    val.in_range(_WHO, "percentile", percentile, 0.0, 100.0, low_open=True)
    val.in_range(_WHO, "v_init", v_init, 0.0, 1.0, high_open=True)
    val.tensor(_WHO, "calib_x", calib_x)
    check_activations(ann, who=_WHO)
    if any(isinstance(m, Quantizer) for m in ann.modules()):
        raise TypeError(f"{_WHO}: convert the float ANN, not a quantized model")
    if _is_transformer(ann):
        net = copy.deepcopy(ann)
        insert_quantizers(net, level=4, attn_level=4)  # only the *sites* are used; every Quantizer is replaced below
        _swap(net, lambda m: isinstance(m, Quantizer), lambda q: _Recorder(signed=q.sym))
        _swap(net, lambda m: type(m) is nn.ReLU, lambda m: nn.Identity())  # unsigned sites already apply it
    else:
        net = copy.deepcopy(ann)
        _swap(net, lambda m: type(m) is nn.ReLU, lambda m: _Recorder(signed=False))
    recorders = [(n, m) for n, m in net.named_modules() if isinstance(m, _Recorder)]
    if not recorders:
        raise ValueError(f"{_WHO}: the model has no ReLU to convert")
    net.eval()
    p = next(iter(net.parameters()))
    net(calib_x.to(device=p.device, dtype=p.dtype))  # float ANN forward (recorders are identities / ReLUs)
    thresholds = {n: r.threshold(percentile) for n, r in recorders}
    lam = {id(r): thresholds[n] for n, r in recorders}
    _swap(net, lambda m: isinstance(m, _Recorder),
          lambda r: RateIFNeuron(threshold=lam[id(r)], signed=r.signed, v_init=v_init))
    _swap(net, lambda m: isinstance(m, QAttention), _RateAttention)
    _swap(net, lambda m: isinstance(m, nn.LayerNorm), _MeanOp)
    for q in net.parameters():
        q.requires_grad_(False)
    model = RateCodedModel(net, thresholds)
    model.reset()
    return model


@torch.no_grad()
def rate_simulate(model: RateCodedModel, x: torch.Tensor, *, max_steps: int) -> torch.Tensor:
    """Run ``model`` for ``max_steps`` steps from a fresh reset with ``x`` presented at every step.

    Returns:
        Running means ``(T, B, C)``: entry ``T - 1`` is the SNN's answer after ``T`` steps.
    """
    if not isinstance(model, RateCodedModel):
        raise TypeError(f"{_WHO}: model must be a RateCodedModel (from rate_convert()), got {type(model).__name__}")
    val.integer(_WHO, "max_steps", max_steps, minimum=1)
    val.tensor(_WHO, "x", x)
    p = next(iter(model.net.parameters()))
    x = x.to(device=p.device, dtype=p.dtype)
    model.reset()
    outs = torch.stack([model.step(x) for _ in range(max_steps)])
    steps = torch.arange(1, max_steps + 1, dtype=outs.dtype, device=outs.device).reshape(-1, *[1] * (outs.dim() - 1))
    return outs.cumsum(0) / steps

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
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as val
from icml24.common.nets import TinyViT
from icml24.spikezip_tf import _fused
from icml24.spikezip_tf.qann import (
    QAttention,
    QSelfAttention,
    Quantizer,
    _is_hf_self_attention,
    _is_qkv_attention,
    additive_mask,
    check_activations,
    check_mask,
    hf_base_model,
    hf_head,
    is_hf_encoder,
    is_hf_vit,
    quantizers,
)
from icml24.spikezip_tf.text import TinyTextEncoder

__all__ = ["STBIFNeuron", "SpikeLinear", "SpikeConv2d", "SpikeMatmul", "SpikingSoftmax", "SpikingLayerNorm",
           "SpikingAttention", "SpikingSelfAttention", "SpikingModel", "AnnHead", "SimulationResult", "convert", "simulate", "count_macs",
           "register_runner"]


class _Stateful(nn.Module):
    """A module with per-sample state that :meth:`reset` clears (shapes follow the batch).

    Multi-step mode: ``steps = T`` (set by :class:`SpikingModel`) means the input holds T consecutive time steps
    stacked along dim 0, ``(T * B, ...)`` with step t in rows ``[t B, (t + 1) B)``; the module returns its T
    outputs in the same layout. Operators without state across time (the linear maps) then run once on all T
    steps; the ST-BIF recurrence and the running sums loop over t with the same arithmetic as T single steps,
    so the outputs are bit-identical to stepping one at a time.
    """

    steps: int = 1

    def reset(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def _split_time(x: torch.Tensor, steps: int) -> torch.Tensor:
    """``(T * B, ...)`` -> ``(T, B, ...)`` (a view)."""
    if x.shape[0] % steps:
        raise RuntimeError(f"spikezip_tf: leading dimension {x.shape[0]} is not a multiple of steps={steps}")
    return x.reshape(steps, x.shape[0] // steps, *x.shape[1:])


def _running_sum(prev: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """Running sums over dim 0 of ``x`` (T, ...), continuing ``prev``: one addition per step, exactly as
    ``prev = prev + x_t`` step by step (``torch.cumsum`` accumulates float32 in double and would differ)."""
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        if prev is None:
            out[t] = x[t]
        else:
            torch.add(prev, x[t], out=out[t])
        prev = out[t]
    return out


def _differences_(Y: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
    """In place, ``Y[t] <- Y[t] - Y[t - 1]`` over dim 0 with ``Y[-1] := prev`` (nothing subtracted from ``Y[0]`` if
    ``prev`` is None), the same subtractions as ``Y[1:] - Y[:-1]`` without a new tensor; returns the last row of the
    original ``Y`` (a copy: the next call's ``prev``)."""
    last = Y[-1].clone()
    for t in range(Y.shape[0] - 1, 0, -1):  # backwards: Y[t - 1] is still the original when Y[t] uses it
        Y[t].sub_(Y[t - 1])
    if prev is not None:
        Y[0].sub_(prev)
    return last


# spike counts per step that ST-BIF neurons attach to their outputs: id(output) -> (weakref(output), (T,) counts), so
# that a layer fed directly by a neuron knows its input events without another pass over the spikes
_SPIKE_EVENTS: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def _events_per_step(x: torch.Tensor, steps: int) -> torch.Tensor:
    """Non-zero entries per time step, ``(T,)`` float64 (``|sign(x)|`` summed per sample, exact below 2^24 per
    sample, then per step in float64; ~3x faster than ``ne(0).sum``, which widens to int64)."""
    known = _SPIKE_EVENTS.get(id(x))
    if known is not None and known[0]() is x:
        return known[1]
    xt = _split_time(x, steps)
    per_sample = torch.sign(xt).abs_().sum(dim=tuple(range(2, xt.dim()))) if xt.dim() > 2 else torch.sign(xt).abs_()
    return per_sample.sum(1, dtype=torch.float64)


# steps that are known to be exactly zero: id(output) -> (weakref(output), [step t may be non-zero]), attached by the
# operators that skip silent steps, so that a consumer does not scan its input for them again
_ACTIVE_STEPS: dict[int, tuple[weakref.ref, list[bool]]] = {}


def _mark_active(out: torch.Tensor, active: list[bool]) -> torch.Tensor:
    """Record that the steps t of ``out`` with ``active[t]`` False are exactly zero."""
    if len(_ACTIVE_STEPS) > 256:
        for k in [k for k, (r, _) in _ACTIVE_STEPS.items() if r() is None]:
            del _ACTIVE_STEPS[k]
    _ACTIVE_STEPS[id(out)] = (weakref.ref(out), active)
    return out


def _known_active(x: torch.Tensor, steps: int) -> list[bool] | None:
    """Whether each step of ``x`` ``(T * B, ...)`` may be non-zero, as recorded by its producer (None: unknown)."""
    known = _ACTIVE_STEPS.get(id(x))
    if known is not None and known[0]() is x and len(known[1]) == steps:
        return list(known[1])
    return None


def _active_steps(x: torch.Tensor, steps: int) -> list[bool]:
    """Whether each step of ``x`` ``(T * B, ...)`` may be non-zero: recorded by its producer, else scanned."""
    known = _known_active(x, steps)
    return known if known is not None else _fed_steps(_split_time(x, steps))


def _inherit_events(new: torch.Tensor, src: torch.Tensor, steps: int) -> torch.Tensor:
    """``new`` (a view, scaled copy or re-layout of ``src`` with the same zeros per step) gets ``src``'s known events."""
    known = _SPIKE_EVENTS.get(id(src))
    if known is not None and known[0]() is src and new.shape[0] == src.shape[0]:
        _remember_events(new, known[1])
    return new


def _fed_steps(x: torch.Tensor) -> list[bool]:
    """Whether step t of ``x`` ``(T, ...)`` has any non-zero entry (one pass, one host sync)."""
    dims = tuple(range(1, x.dim()))  # reduce in place of a reshape, which would copy a strided x
    return ((x.amax(dims) > 0) | (x.amin(dims) < 0)).tolist()


def _take(x: torch.Tensor, idx: list[int]) -> torch.Tensor:
    """``x[idx]`` along dim 0 for sorted step indices: a view when they are consecutive (the usual case)."""
    if idx and idx[-1] - idx[0] + 1 == len(idx):
        return x[idx[0]:idx[-1] + 1]
    return x.index_select(0, torch.tensor(idx, device=x.device))


def _scatter_steps(d: torch.Tensor, idx: list[int], steps: int) -> torch.Tensor:
    """``(steps, ...)`` zeros with ``d[i]`` at step ``idx[i]``."""
    if idx[-1] - idx[0] + 1 == len(idx):  # consecutive: copy once, zero only the other steps
        out = d.new_empty(steps, *d.shape[1:])
        out[idx[0]:idx[-1] + 1] = d
        out[:idx[0]].zero_()
        out[idx[-1] + 1:].zero_()
        return out
    return d.new_zeros(steps, *d.shape[1:]).index_copy_(0, torch.tensor(idx, device=d.device), d)


def _per_step_into(x: torch.Tensor, active: list[bool], shape: tuple[int, ...],
                   fn: Callable[[int, torch.Tensor, torch.Tensor], None]) -> torch.Tensor:
    """Like :func:`_per_step` with ``fn(t, x_t, out_t)`` writing step t's result into ``out_t`` (no stacking)."""
    out = x.new_empty(x.shape[0], *shape)
    for t, a in enumerate(active):
        if a:
            fn(t, x[t], out[t])
        else:
            out[t].zero_()
    return out


def _per_step(x: torch.Tensor, active: list[bool], fn: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``fn(t, x[t])`` for the active steps t of ``x`` ``(T, ...)`` (one call per step, so every product is the
    very one the step-by-step path computes), exact zeros for the others; returns ``(T, ...)``."""
    if not any(active):  # one (zero-input, hence exactly zero) step for the output's shape
        y0 = fn(0, x[0])
        return y0.new_zeros(x.shape[0], *y0.shape)
    outs: list[torch.Tensor | None] = [fn(t, x[t]) if a else None for t, a in enumerate(active)]
    ref = next(o for o in outs if o is not None)
    zero = ref.new_zeros(ref.shape)
    return torch.stack([zero if o is None else o for o in outs])


class STBIFNeuron(_Stateful):
    """Spike-tracer bipolar integrate-and-fire neuron (ST-BIF; official ``IFNeuron``).

    Args:
        threshold: firing threshold ``V_thr`` = the replaced quantizer's step ``s`` (> 0).
        pos_max: spike-tracer ceiling ``p_max`` (the quantizer's largest level).
        neg_min: spike-tracer floor ``n_min`` (0 for an unsigned quantizer).
        v_init: initial membrane in threshold units (paper: 1/2, realising round-half-up).
        negative_spikes: allow -1 spikes that undo an earlier overshoot (paper: True).

    After each call ``last_spikes`` holds the number of non-zero spikes per step and sample (shape ``(T, B)``).
    """

    def __init__(self, *, threshold: float | torch.Tensor, pos_max: int, neg_min: int, v_init: float = 0.5,
                 negative_spikes: bool = True) -> None:
        super().__init__()
        val.positive("spikezip_tf", "threshold", threshold)
        thr = (threshold.detach().clone() if isinstance(threshold, torch.Tensor)
               else torch.tensor(float(threshold), dtype=torch.float64))
        if not neg_min <= 0 <= pos_max:
            raise ValueError(f"spikezip_tf: need neg_min <= 0 <= pos_max (the spike tracer starts at 0), got "
                             f"neg_min={neg_min}, pos_max={pos_max}")
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
        self.settled = False  # no input and no spike at the last step computed
        self.last_spikes: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.requires_grad and self.threshold.dtype == x.dtype and _fused.available(x):
            return self._forward_fused(x)
        xs = _split_time(x / self.threshold, self.steps)  # (T, B, ...), the input in threshold units
        if self.v is None or self.v.shape != xs.shape[1:]:
            if self.v is not None:
                raise RuntimeError("spikezip_tf: input shape changed between steps; call reset() between batches")
            self.v = torch.full_like(xs[0], self.v_init)
            self.acc = torch.zeros_like(xs[0])
            self.settled = False
        v, acc = self.v, self.acc
        nxt = torch.empty_like(acc)
        o = torch.empty_like(xs)
        lo = -1.0 if self.negative_spikes else 0.0
        fed = _fed_steps(xs)
        for t in range(xs.shape[0]):
            if fed[t]:
                v.add_(xs[t])
                self.settled = False
            elif self.settled:
                o[t].zero_()  # no input and no spike at the previous step: nothing can change
                continue
            # +1 iff v >= 1 and S < p_max; -1 iff v < 0 and S > n_min (and -1 spikes allowed); else 0:
            # S_t = clamp(S + clamp(floor(v), lo, 1), n_min, p_max), o_t = S_t - S (small integers: exact)
            torch.floor(v, out=nxt).clamp_(lo, 1.0).add_(acc).clamp_(self.neg_min, self.pos_max)
            torch.sub(nxt, acc, out=o[t])
            v.sub_(o[t])
            acc, nxt = nxt, acc
            if not fed[t]:
                self.settled = not bool(o[t].amax() > 0 or o[t].amin() < 0)
        self.acc = acc
        out = (o * self.threshold).reshape(x.shape)
        # o is +-1/0: the sum of |o| per sample counts the spikes exactly
        counts = o.abs_().reshape(o.shape[0], o.shape[1], -1).sum(2)
        self.last_spikes = counts.long()
        _remember_events(out, counts.sum(1, dtype=torch.float64))
        return out

    def _forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        """The same update by the fused C kernel (:mod:`._fused`): one pass over memory for all T steps, same bits."""
        xs = _split_time(x, self.steps)  # (read in place by the kernel when its rows are contiguous)
        if self.v is None or self.v.shape != xs.shape[1:]:
            if self.v is not None:
                raise RuntimeError("spikezip_tf: input shape changed between steps; call reset() between batches")
            self.v = torch.full(xs.shape[1:], self.v_init, dtype=x.dtype, device=x.device)
            self.acc = torch.zeros(xs.shape[1:], dtype=x.dtype, device=x.device)
        elif not (self.v.is_contiguous() and self.acc.is_contiguous()):
            self.v, self.acc = self.v.contiguous(), self.acc.contiguous()
        if self.settled and not any(_known_active(x, self.steps) or [True]):
            # no neuron can spike without input and there is none: exact zeros, state unchanged
            out = x.new_zeros(x.shape)
            self.last_spikes = torch.zeros(xs.shape[0], xs.shape[1], dtype=torch.long, device=x.device)
            _remember_events(out, torch.zeros(xs.shape[0], dtype=torch.float64, device=x.device))
            return _mark_active(out, [False] * xs.shape[0])
        o, counts, live = _fused.stbif(xs, float(self.threshold), self.v, self.acc,
                                       lo=-1.0 if self.negative_spikes else 0.0, neg_min=self.neg_min,
                                       pos_max=self.pos_max)
        self.settled = not live  # every neuron quiet unless fed (for the PyTorch loop too: same meaning)
        self.last_spikes = counts.long()
        out = o.reshape(x.shape)
        per_step = counts.sum(1)
        _remember_events(out, per_step)
        return _mark_active(out, (per_step > 0).tolist())


def _remember_events(out: torch.Tensor, per_step: torch.Tensor) -> None:
    """Attach the events per step ``(T,)`` of ``out`` for :func:`_events_per_step` (see ``_SPIKE_EVENTS``)."""
    if len(_SPIKE_EVENTS) > 256:
        for k in [k for k, (r, _) in _SPIKE_EVENTS.items() if r() is None]:
            del _SPIKE_EVENTS[k]
    _SPIKE_EVENTS[id(out)] = (weakref.ref(out), per_step)


class _OnceBias(_Stateful):
    def reset(self) -> None:
        self.first = True
        self.last_sops: torch.Tensor | None = None  # (T,) synaptic operations per step

    def _run(self, x: torch.Tensor, fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        """``fn(x_t, b)`` with the bias at the very first step only, ``(T * B, ...)`` in and out; a step without
        any input event (after the first) gives exact zeros without computing."""
        first, self.first = self.first, False
        ev = _events_per_step(x, self.steps)
        self.last_sops = ev * self.fan_out  # each non-zero input event fans out to fan_out outputs
        active = (ev > 0).tolist()
        if first:
            active[0] = True  # the bias enters at t = 0 whatever the input
        if self.steps == 1:  # the step-by-step path: exactly the computation of one step
            return _mark_active(fn(x, self.bias if first else None), active)
        y = self._steps_out(_split_time(x, self.steps), active, first, fn)
        return _mark_active(y.reshape(y.shape[0] * y.shape[1], *y.shape[2:]), active)

    def _steps_out(self, xt: torch.Tensor, active: list[bool], first: bool, fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        return _per_step(xt, active, lambda t, x_t: fn(x_t, self.bias if first and t == 0 else None))


class SpikeLinear(_OnceBias):
    """``y_t = W x_t (+ b at the first step only)``, so ``sum_t y_t = W sum_t x_t + b`` (official ``LLLinear``)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.out_features = linear.out_features
        self.fan_out = float(linear.out_features)
        self.reset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, lambda z, b: F.linear(z, self.weight, b))

    def _steps_out(self, xt: torch.Tensor, active: list[bool], first: bool, fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        wt = self.weight.t()

        def step(t: int, x_t: torch.Tensor, out_t: torch.Tensor) -> None:
            if first and t == 0 and self.bias is not None:
                out_t.copy_(F.linear(x_t, self.weight, self.bias))
            else:
                torch.matmul(x_t, wt, out=out_t)  # F.linear without bias is this matmul

        return _per_step_into(xt, active, (*xt.shape[1:-1], self.out_features), step)


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
        return self._run(x, lambda z, b: F.conv2d(z, self.weight, b, self.stride, self.padding, self.dilation,
                                                    self.groups))


class SpikeMatmul(_Stateful):
    """Product of two spike trains: ``out_t = A_t B_t - A_{t-1} B_{t-1}`` with running sums ``A_t, B_t`` (including
    step t), so that ``sum_t out_t = A_T B_T`` (paper's spike-equivalent self-attention).

    The paper's product rule ``A_t b_t + a_t B_t - a_t b_t`` is the same increment in exact arithmetic; as
    differences of running products (SpikingJelly's multi-step ``_matmul_sequence_delta``) it takes one matrix product
    per step instead of three, batched over all the steps of a call.
    """

    def reset(self) -> None:
        self.A: torch.Tensor | None = None
        self.B: torch.Tensor | None = None
        self.P: torch.Tensor | None = None  # A_t B_t of the last step
        self.last_sops: torch.Tensor | None = None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        at, bt = _split_time(a, self.steps), _split_time(b, self.steps)
        ea, eb = _events_per_step(a, self.steps), _events_per_step(b, self.steps)
        # SOPs: each event of b_t meets every row of A_t, each event of a_t every column of B_t
        self.last_sops = eb * a.shape[-2] + ea * b.shape[-1]
        shape = (*a.shape[:-1], b.shape[-1])
        if self.steps == 1:  # the step-by-step path: always computed (a step without input gives exact zeros)
            idx = [0]
        else:
            idx = [t for t, on in enumerate(((ea + eb) > 0).tolist()) if on]
            if not idx:  # A, B unchanged: every increment is exactly zero
                return _mark_active(a.new_zeros(shape), [False] * self.steps)
        A = _running_sum(self.A, _take(at, idx))
        B = _running_sum(self.B, _take(bt, idx))
        self.A, self.B = A[-1], B[-1]
        P = torch.matmul(A, B)  # batched over steps: each product is the very one the step-by-step path computes
        self.P = _differences_(P, self.P)
        D = P
        active = ((ea + eb) > 0).tolist()  # A, B unchanged at the other steps: exact zeros
        if len(idx) == self.steps:
            return _mark_active(D.reshape(shape), active)
        return _mark_active(_scatter_steps(D, idx, self.steps).reshape(shape), active)


class _Differencing(_Stateful):
    """Emit ``f(X_t) - f(X_{t-1})`` with ``X_t`` the running input sum and ``f(X_{-1}) := 0``."""

    def reset(self) -> None:
        self.X: torch.Tensor | None = None
        self.Y: torch.Tensor | None = None

    def fn(self, X: torch.Tensor) -> torch.Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.steps == 1:  # the step-by-step path
            self.X = x if self.X is None else self.X + x
            y = self.fn(self.X)
            out = y if self.Y is None else y - self.Y
            self.Y = y
            return out
        xt = _split_time(x, self.steps)
        active = _active_steps(x, self.steps)
        if self.X is None:
            active[0] = True  # f(X_0) - f(X_{-1}) = f(0) - 0 may be non-zero (LayerNorm bias)
        idx = [t for t, a in enumerate(active) if a]
        if not idx:  # X unchanged: f(X_t) - f(X_{t-1}) = 0 exactly
            return _mark_active(x.new_zeros(x.shape), active)
        X = _running_sum(self.X, _take(xt, idx))  # the running sum only changes at steps with input
        self.X = X[-1].clone()  # (a copy: X itself can be freed and its memory reused)
        Y = self.fn(X.reshape(len(idx) * xt.shape[1], *xt.shape[2:])).reshape(X.shape)  # row-wise f, one call
        self.Y = _differences_(Y, self.Y)
        D = Y
        if len(idx) == len(active):
            return _mark_active(D.reshape(x.shape), active)
        return _mark_active(_scatter_steps(D, idx, len(active)).reshape(x.shape), active)


class SpikingSoftmax(_Differencing):
    """Spike-equivalent softmax over ``dim`` (official ``spiking_softmax``)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim
        self.reset()

    def fn(self, X: torch.Tensor) -> torch.Tensor:
        # exp(X - max) / sum: softmax in three passes (F.softmax is ~3.5x slower on short rows such as N = 17)
        e = torch.sub(X, X.amax(self.dim, keepdim=True)).exp_()
        return e.div_(e.sum(self.dim, keepdim=True))


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, **_: object) -> torch.Tensor:
        b, n, c = x.shape
        check_mask(mask, b // self.steps, n)
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim)
        # neurons on the (B, N, heads, head_dim) slices (element-wise: the layout changes nothing but the copies),
        # then (B, heads, N, head_dim) views
        st = self.steps
        spikes = [neuron(qkv[:, :, i]) for i, neuron in enumerate((self.quan_q, self.quan_k, self.quan_v))]
        q, k, v = (_inherit_events(h.transpose(1, 2), h, st) for h in spikes)
        s = self.qk(_inherit_events(q * self.scale, q, st), _inherit_events(k.transpose(-2, -1), k, st))
        if self.first:
            m = additive_mask(mask, s.dtype)
            if m is not None:  # the mask is an input like an embedding: present once, at t = 0
                n0 = b // self.steps
                s[:n0] = s[:n0] + m
        self.first = False
        a = self.attn_quan(self.softmax(s))
        o = self.after_attn_quan(self.av(a, v))
        o = _inherit_events(o.transpose(1, 2).reshape(b, n, c), o, st)
        return self.quan_proj(self.proj(o))


class SpikingSelfAttention(_Stateful):
    """Spike-equivalent Hugging Face BERT/RoBERTa self-attention (official ``SRobertaSelfAttention``), converted
    from a :class:`~icml24.spikezip_tf.qann.QSelfAttention`; returns the context ``(B, N, C)`` of each step
    (the key mask ``(B, N)`` joins the scores at the first step only)."""

    def __init__(self, qattn: QSelfAttention, **neuron_kw) -> None:
        super().__init__()
        self.num_attention_heads, self.attention_head_size = qattn.num_attention_heads, qattn.attention_head_size
        self.all_head_size, self.scaling = qattn.all_head_size, qattn.scaling
        self.query, self.key, self.value = SpikeLinear(qattn.query), SpikeLinear(qattn.key), SpikeLinear(qattn.value)
        for name in ("query_quan", "key_quan", "value_quan", "attn_quan", "after_attn_quan"):
            setattr(self, name, STBIFNeuron.from_quantizer(getattr(qattn, name), **neuron_kw))
        self.qk = SpikeMatmul()
        self.softmax = SpikingSoftmax(dim=-1)
        self.av = SpikeMatmul()
        self.reset()

    def reset(self) -> None:
        self.first = True

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape[:-1], self.num_attention_heads, self.attention_head_size).transpose(-3, -2)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None, **_: object) -> torch.Tensor:
        b, n, _c = hidden_states.shape
        check_mask(mask, b // self.steps, n)
        st = self.steps
        spikes = [neuron(lin(hidden_states)) for lin, neuron in
                  ((self.query, self.query_quan), (self.key, self.key_quan), (self.value, self.value_quan))]
        q, k, v = (_inherit_events(self._heads(h), h, st) for h in spikes)  # head views: same events per step
        s = self.qk(q, _inherit_events(k.transpose(-1, -2), k, st)) * self.scaling
        if self.first:
            m = additive_mask(mask, s.dtype)
            if m is not None:
                n0 = b // self.steps
                s[:n0] = s[:n0] + m
        self.first = False
        a = self.attn_quan(self.softmax(s))
        ctx = self.after_attn_quan(self.av(a, v)).transpose(-3, -2)
        return ctx.reshape(*ctx.shape[:-2], self.all_head_size)


class AnnHead(_Stateful):
    """A real-valued (ANN) head on the running sum of the spiking encoder's outputs, emitting differences:

    ``X_t = sum_{tau <= t} h_tau``,  ``out_t = f(X_t) - f(X_{t-1})``  (``f(X_{-1}) := 0``),

    so ``sum_t out_t = f(X_T)``: the head of the QANN applied to the SNN's accumulated encoder output, and the
    running sum of the outputs after step t is ``f`` of the encoder output accumulated so far (accuracy vs T).
    ``f`` (e.g. a BERT pooler + classifier) is evaluated once per step whose input is non-zero, on the whole
    accumulated state, so its nonlinearities (the pooler's Tanh) are exact but not spike-driven.

    NOTE(deviation): SpikeZIP-TF converts every operator; a Tanh has no spike-equivalent form in the paper or the
    official code (its RoBERTa path drops the pooler), so Hugging Face poolers and classification heads run as
    this ANN head. Their multiply-accumulates are not counted as synaptic operations.
    """

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.reset()

    def reset(self) -> None:
        self.X: torch.Tensor | None = None
        self.Y: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xt = _split_time(x, self.steps)
        active = _active_steps(x, self.steps)
        if self.X is None:
            active[0] = True

        outs: list[torch.Tensor | None] = []
        for t, a in enumerate(active):  # one call of f per step with input: identical for every chunk
            if not a:
                outs.append(None)  # X unchanged: f(X_t) - f(X_{t-1}) = 0 exactly
                continue
            self.X = xt[t].clone() if self.X is None else self.X + xt[t]
            y = self.fn(self.X)
            outs.append(y if self.Y is None else y - self.Y)
            self.Y = y
        zero = self.Y.new_zeros(self.Y.shape)
        return torch.cat([zero if o is None else o for o in outs])


class _PooledClassifier(nn.Module):
    """BERT-style ``*ForSequenceClassification`` head: ``classifier(dropout(pooler(h)))``."""

    def __init__(self, pooler: nn.Module, dropout: nn.Module, classifier: nn.Module) -> None:
        super().__init__()
        self.pooler, self.dropout, self.classifier = pooler, dropout, classifier

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.pooler(h)))


class _ClsClassifier(nn.Module):
    """``ViTForImageClassification`` head: ``classifier(h[:, 0])``."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier(h[:, 0])


# ---------------------------------------------------------------------------------------------- runners
# A runner performs time steps of a converted top-level model: (net, x, t, steps=T, **kw) -> outputs, with x the
# encoded input of the T steps t, ..., t + T - 1 stacked along dim 0 ((T * B, ...), see _Stateful) and the
# outputs in the same layout. Inputs that are not spike-driven (class token, position table, token embeddings,
# attention mask) enter at t = 0 only, i.e. in the first B rows of the first call.

Runner = Callable[..., torch.Tensor]


def _first_rows(h0: torch.Tensor, t: int, steps: int) -> torch.Tensor:
    """Stack ``h0`` (the t = 0 input, ``(B, ...)``) above zeros for the other steps of the call."""
    if t > 0:
        return h0.new_zeros(steps * h0.shape[0], *h0.shape[1:])
    if steps == 1:
        return h0
    return torch.cat([h0, h0.new_zeros((steps - 1) * h0.shape[0], *h0.shape[1:])])


def _vit_step(net: nn.Module, x: torch.Tensor, t: int, steps: int = 1) -> torch.Tensor:
    h = net.patch_embed(x)
    tb, _n, c = h.shape
    b = tb // steps
    if t == 0:
        first = torch.cat([net.cls_token.to(h.dtype).expand(b, -1, -1), h[:b]], dim=1) + net.pos_embed.to(h.dtype)
        rest = torch.cat([h.new_zeros(tb - b, 1, c), h[b:]], dim=1)
        h = torch.cat([first, rest]) if steps > 1 else first
    else:
        h = torch.cat([h.new_zeros(tb, 1, c), h], dim=1)
    return net.head(net.norm(net.blocks(h))[:, 0])


def _text_step(net: TinyTextEncoder, ids: torch.Tensor, t: int, steps: int = 1,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    e = net.embed(ids).to(net.pos_embed.dtype)
    h = net.emb_norm(_first_rows(e, t, steps))
    for blk in net.blocks:
        h = blk(h, mask=mask)
    return net.head(net.norm(h)[:, 0])


def _is_vit_layout(m: nn.Module) -> bool:
    """timm-layout ViT: ``patch_embed.proj``, ``pos_embed``, ``blocks``, ``norm``, ``head``."""
    return (hasattr(getattr(m, "patch_embed", None), "proj") and isinstance(getattr(m, "pos_embed", None), torch.Tensor)
            and hasattr(m, "blocks") and hasattr(m, "norm") and hasattr(m, "head"))


def _timm_vit_step(net: nn.Module, x: torch.Tensor, t: int, steps: int = 1) -> torch.Tensor:
    """timm ``VisionTransformer.forward`` one chunk at a time: prefix tokens and positions at t = 0 only."""
    h = net.patch_embed(x)
    if h.dim() == 4:  # NHWC output (timm's dynamic_img_size / flatten=False)
        h = h.flatten(1, 2)
    tb, _n, c = h.shape
    b = tb // steps
    prefix = [tok for tok in (getattr(net, "cls_token", None), getattr(net, "reg_token", None)) if tok is not None]
    n_prefix = sum(tok.shape[1] for tok in prefix)
    pos = net.pos_embed.to(h.dtype)
    if t == 0:
        h0, toks = h[:b], [tok.to(h.dtype).expand(b, -1, -1) for tok in prefix]
        if getattr(net, "no_embed_class", False):
            first = torch.cat([*toks, h0 + pos], dim=1)
        else:
            first = torch.cat([*toks, h0], dim=1) + pos
        if steps > 1:
            h = torch.cat([first, torch.cat([h.new_zeros(tb - b, n_prefix, c), h[b:]], dim=1)])
        else:
            h = first
    else:
        h = torch.cat([h.new_zeros(tb, n_prefix, c), h], dim=1)
    for name in ("pos_drop", "patch_drop", "norm_pre"):
        if isinstance(getattr(net, name, None), nn.Module):
            h = getattr(net, name)(h)
    h = net.norm(net.blocks(h))
    pool = getattr(net, "global_pool", "token")
    if pool == "token":
        h = h[:, 0]
    elif pool == "avg":
        h = h[:, n_prefix:].mean(dim=1)
    elif pool:
        raise NotImplementedError(f"spikezip_tf: global_pool={pool!r} is not supported")
    for name in ("fc_norm", "head_drop"):
        if isinstance(getattr(net, name, None), nn.Module):
            h = getattr(net, name)(h)
    return net.head(h)


def _hf_embed(emb: nn.Module, ids: torch.Tensor, token_type_ids: torch.Tensor | None,
              position_ids: torch.Tensor | None) -> torch.Tensor:
    """The embeddings' sum (word + position + token type) before their LayerNorm, by the model's own forward."""
    saved = emb._modules["LayerNorm"], emb._modules.get("dropout")
    emb._modules["LayerNorm"] = nn.Identity()
    if saved[1] is not None:
        emb._modules["dropout"] = nn.Identity()
    try:
        return emb(input_ids=ids, token_type_ids=token_type_ids, position_ids=position_ids)
    finally:
        emb._modules["LayerNorm"] = saved[0]
        if saved[1] is not None:
            emb._modules["dropout"] = saved[1]


def _check_ids_like(name: str, v: torch.Tensor | None, ids: torch.Tensor, *, row_ok: bool = False) -> None:
    """``v`` is None or an integer tensor of the shape of ``ids`` (``(1, N)`` too if ``row_ok``)."""
    if v is None:
        return
    if not isinstance(v, torch.Tensor) or v.is_floating_point() or v.is_complex() or v.dtype == torch.bool:
        raise TypeError(f"spikezip_tf: {name} must be an integer tensor, got "
                        f"{v.dtype if isinstance(v, torch.Tensor) else type(v).__name__}")
    if tuple(v.shape) != tuple(ids.shape) and not (row_ok and v.dim() == 2 and tuple(v.shape) == (1, ids.shape[-1])):
        raise ValueError(f"spikezip_tf: {name} must have the shape of input_ids {tuple(ids.shape)}"
                         f"{' or (1, N)' if row_ok else ''}, got {tuple(v.shape)}")


def _hf_step(net: nn.Module, ids: torch.Tensor, t: int, steps: int = 1, mask: torch.Tensor | None = None,
             token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """A Hugging Face BERT/RoBERTa encoder, one chunk: returns the ``last_hidden_state`` increments.

    Token ids, token types (segment A/B of a sentence pair), positions and the mask enter at t = 0 only."""
    _check_ids_like("token_type_ids", token_type_ids, ids)
    _check_ids_like("position_ids", position_ids, ids, row_ok=True)
    emb = net.embeddings
    w = emb.word_embeddings.weight
    if t == 0:
        e = _hf_embed(emb, ids, token_type_ids, position_ids).to(w.dtype)
    else:
        e = w.new_zeros(ids.shape[0], ids.shape[1], w.shape[1])
    h = emb.LayerNorm(_first_rows(e, t, steps))
    for layer in net.encoder.layer:
        a = layer.attention.self(h, mask=mask)
        a = layer.attention.output(a, h)  # dense -> neuron -> LayerNorm(. + h)
        h = layer.output(layer.intermediate(a), a)
    return h


def _hf_cls_step(net: nn.Module, ids: torch.Tensor, t: int, steps: int = 1, mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """A Hugging Face BERT/RoBERTa ``*ForSequenceClassification``: the encoder's ``last_hidden_state``
    increments (the classification head runs as :class:`AnnHead` on their running sum)."""
    return _hf_step(getattr(net, net.base_model_prefix), ids, t, steps, mask=mask, token_type_ids=token_type_ids,
                    position_ids=position_ids)


def _hf_vit_step(net: nn.Module, x: torch.Tensor, t: int, steps: int = 1) -> torch.Tensor:
    """A Hugging Face ``ViTModel``, one chunk: ``last_hidden_state`` increments (after the final ``layernorm``);
    the class token and the position embeddings enter at t = 0 only."""
    emb = net.embeddings
    h = emb.patch_embeddings(x)  # projection (spiking conv + neuron), flatten, transpose; checks channels / size
    tb, _n, c = h.shape
    b = tb // steps
    if t == 0:
        first = torch.cat([emb.cls_token.to(h.dtype).expand(b, -1, -1), h[:b]], dim=1)
        first = first + emb.position_embeddings.to(h.dtype)
        h = torch.cat([first, torch.cat([h.new_zeros(tb - b, 1, c), h[b:]], dim=1)]) if steps > 1 else first
    else:
        h = torch.cat([h.new_zeros(tb, 1, c), h], dim=1)
    h = emb.dropout(h)
    for layer in net.encoder.layer:  # ViTLayer.forward (pre-norm)
        h = layer.attention.output(layer.attention.attention(layer.layernorm_before(h)), h) + h
        h = layer.output(layer.intermediate(layer.layernorm_after(h)), h)  # dense -> neuron, + h
    return net.layernorm(h)


def _hf_vit_cls_step(net: nn.Module, x: torch.Tensor, t: int, steps: int = 1) -> torch.Tensor:
    """``ViTForImageClassification``: the encoder's increments (the classifier runs as :class:`AnnHead`)."""
    return _hf_vit_step(getattr(net, net.base_model_prefix), x, t, steps)


def _is_hf_text_wrapper(m: nn.Module) -> bool:
    found = hf_base_model(m)
    return found is not None and bool(found[0]) and is_hf_encoder(found[1])


def _is_hf_vit_wrapper(m: nn.Module) -> bool:
    found = hf_base_model(m)
    return found is not None and bool(found[0]) and is_hf_vit(found[1])


_RUNNERS: dict[type[nn.Module], tuple[Runner, bool, bool]] = {TinyViT: (_vit_step, True, True),
                                                              TinyTextEncoder: (_text_step, False, True)}
# structural runners, tried in order after the registered types: (predicate, runner, zero_input_after_first)
_STRUCTURAL: list[tuple[Callable[[nn.Module], bool], Runner, bool]] = [
    (_is_vit_layout, _timm_vit_step, True), (is_hf_encoder, _hf_step, False), (is_hf_vit, _hf_vit_step, True),
    (_is_hf_text_wrapper, _hf_cls_step, False), (_is_hf_vit_wrapper, _hf_vit_cls_step, True)]


def register_runner(model_type: type[nn.Module], runner: Runner, *, zero_input_after_first: bool,
                    multi_step: bool = False) -> None:
    """Teach :func:`convert` a new top-level model type.

    Args:
        model_type: the (Q)ANN's class.
        runner: ``runner(net, x_t, t, **kw) -> out_t`` running one time step of the converted ``net``; with
            ``multi_step=True``, ``runner(net, x, t, steps=T, **kw)`` runs T steps at once in the stacked
            layout ``(T * B, ...)`` (see :class:`SpikingModel`). The keyword parameters after ``t`` (other than
            ``steps``) are the inputs :func:`simulate` accepts for this model (e.g. ``mask``); any other input is
            refused with ``TypeError``, unless the runner takes ``**kw``.
        zero_input_after_first: analog encoding: feed ``x`` at t = 0 and zeros afterwards (True), or hand
            ``x`` at every step and let the runner use it only at t = 0 (False, e.g. token ids).
        multi_step: the runner accepts ``steps`` (else :func:`simulate` runs it one step at a time).
    """
    _RUNNERS[model_type] = (runner, zero_input_after_first, multi_step)


def _runner_for(model: nn.Module) -> tuple[Runner, bool, bool]:
    for t in type(model).__mro__:
        if t in _RUNNERS:
            return _RUNNERS[t]
    for pred, runner, zero_after in _STRUCTURAL:
        if pred(model):
            return runner, zero_after, True
    raise TypeError(f"spikezip_tf: no runner for {type(model).__name__}; supported: "
                    f"{', '.join(t.__name__ for t in _RUNNERS)}, timm-layout ViTs, Hugging Face BERT/RoBERTa "
                    f"encoders (bare or *ForSequenceClassification) and ViT encoders (ViTModel, "
                    f"ViTForImageClassification) (see register_runner)")


def _runner_inputs(runner: Runner) -> frozenset[str] | None:
    """The keyword inputs a runner takes besides ``(net, x, t, steps)``; ``None`` if it takes any (``**kw``)."""
    try:
        params = list(inspect.signature(runner).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params[3:] if p.kind in kinds and p.name != "steps")


class SpikingModel(nn.Module):
    """A converted spiking network: call :meth:`step` once per time step after :meth:`reset`.

    ``sum_t step(x_t)`` over a run until quiescence equals the QANN output. Use :func:`simulate`, which runs
    several time steps per call (:meth:`run_steps`) with bit-identical outputs.
    """

    def __init__(self, net: nn.Module, runner: Runner, zero_input_after_first: bool, multi_step: bool = True, *,
                 head: AnnHead | None = None, pooler: nn.Module | None = None) -> None:
        super().__init__()
        self.net = net
        self._runner = runner
        self.zero_input_after_first = zero_input_after_first
        self.multi_step = multi_step
        #: ANN head on the accumulated encoder output (HF classifiers); the steps then return its differences
        self.head = head
        #: a bare HF encoder's pooler, applied by :func:`simulate` to the accumulated output (``pooler_output``)
        self.pooler = pooler
        #: keyword inputs the runner takes (``None``: any)
        self.input_names = _runner_inputs(runner)
        self._stateful = [m for m in net.modules() if isinstance(m, _Stateful)]
        if head is not None:
            self._stateful.append(head)
        self.t = 0

    def reset(self) -> None:
        """Clear every neuron's and operator's state (required between batches)."""
        for m in self._stateful:
            m.reset()
        self.t = 0

    def neurons(self) -> list[tuple[str, STBIFNeuron]]:
        return [(n, m) for n, m in self.net.named_modules() if isinstance(m, STBIFNeuron)]

    def synaptic_ops(self) -> list[tuple[str, nn.Module]]:
        return [(n, m) for n, m in self.net.named_modules() if isinstance(m, (_OnceBias, SpikeMatmul))]

    def _set_steps(self, steps: int) -> None:
        for m in self._stateful:
            m.steps = steps

    @torch.no_grad()
    def step(self, x_t: torch.Tensor, **kw: object) -> torch.Tensor:
        """One time step: input ``x_t`` ``(B, ...)`` -> output ``(B, ...)``."""
        self._set_steps(1)
        out = self._runner(self.net, x_t, self.t, **kw)
        if self.head is not None:
            out = self.head(out)
        self.t += 1
        return out

    @torch.no_grad()
    def run_steps(self, x: torch.Tensor, steps: int, **kw: object) -> torch.Tensor:
        """``steps`` time steps in one call (multi-step runners only).

        Args:
            x: the encoded input of these steps stacked along dim 0, ``(steps * B, ...)`` (for
                ``zero_input_after_first=False`` models, such as token ids, the ``(B, ...)`` input itself).
            steps: number of time steps T.

        Returns:
            Outputs ``(T, B, ...)``; identical to T calls of :meth:`step`.
        """
        if not self.multi_step:
            raise RuntimeError("spikezip_tf: this model's runner was registered without multi_step=True")
        self._set_steps(steps)
        try:
            out = self._runner(self.net, x, self.t, steps=steps, **kw)
            if self.head is not None:
                out = self.head(out)
        finally:
            self._set_steps(1)
        self.t += steps
        return _split_time(out, steps)

    def forward(self, x_t: torch.Tensor, **kw: object) -> torch.Tensor:
        return self.step(x_t, **kw)


def _is_unsigned_quantizer(m: nn.Module | None) -> bool:
    return isinstance(m, Quantizer) and m.neg_min == 0


def _convert_children(module: nn.Module, prefix: str, neuron_kw: dict, skip: frozenset[str] = frozenset()) -> None:
    prev: nn.Module | None = None
    for name, child in list(module.named_children()):
        path = f"{prefix}.{name}" if prefix else name
        new: nn.Module | None
        if path in skip:
            new = None  # an ANN head: stays as it is
        elif isinstance(child, Quantizer):
            new = STBIFNeuron.from_quantizer(child, **neuron_kw)
        elif isinstance(child, QAttention):
            new = SpikingAttention(child, **neuron_kw)
        elif isinstance(child, QSelfAttention):
            new = SpikingSelfAttention(child, **neuron_kw)
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
        elif isinstance(child, nn.Dropout) or type(child).__name__ == "DropPath":
            new = nn.Identity()  # eval mode: identities
        elif isinstance(child, (nn.Identity, nn.Embedding)):
            new = None  # embeddings are used by the runner at t = 0 only
        elif len(list(child.children())) == 0 and type(child) not in (nn.Sequential, nn.ModuleList):
            raise TypeError(f"spikezip_tf: cannot convert module '{path}' of type {type(child).__name__}")
        else:
            new = None
            _convert_children(child, path, neuron_kw, skip)
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
        qann: a quantized ``TinyViT``, ``TinyTextEncoder``, timm-layout ViT, Hugging Face BERT/RoBERTa or ViT
            encoder (recognised by structure; its steps return ``last_hidden_state`` increments; a pooler is applied
            by :func:`simulate` to the accumulated output), a Hugging Face BERT/RoBERTa
            ``*ForSequenceClassification`` or ``ViTForImageClassification`` (its head runs as an :class:`AnnHead`
            on the accumulated encoder output; the steps return logit increments), or a type added with
            :func:`register_runner`.
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
    kind, heads = hf_head(qann)
    check_activations(qann, exclude=heads)
    runner, zero_after, multi = _runner_for(qann)
    if not quantizers(qann):
        raise ValueError("spikezip_tf: the model has no quantizers; call quantize() (and train it) before convert()")
    if isinstance(qann, (Quantizer, QAttention, QSelfAttention)):
        raise TypeError("spikezip_tf: convert() takes a whole model, not a single layer")
    if not (isinstance(negative_spikes, bool) or negative_spikes in ("signed", "unsigned")):
        raise ValueError(f"spikezip_tf: negative_spikes must be True, False, 'signed' or 'unsigned', "
                         f"got {negative_spikes!r}")
    neuron_kw = dict(v_init=v_init, negative_spikes=negative_spikes)
    STBIFNeuron(threshold=1.0, pos_max=1, neg_min=0, v_init=v_init)  # validates v_init before the deep copy
    net = copy.deepcopy(qann).eval()
    _convert_children(net, "", neuron_kw, frozenset(heads))
    if dtype is not None:
        net = net.to(dtype)
    for p in net.parameters():
        p.requires_grad_(False)
    head, pooler = _ann_head(net, kind)
    snn = SpikingModel(net, runner, zero_after, multi, head=head, pooler=pooler)
    snn.reset()
    return snn


def _ann_head(net: nn.Module, kind: str | None) -> tuple[AnnHead | None, nn.Module | None]:
    """The ANN head (classifier wrappers) or pooler (bare encoders) of a converted Hugging Face model."""
    if kind is None:
        return None, None
    if kind == "pooler":
        return None, net.pooler
    base = getattr(net, net.base_model_prefix)
    if kind == "pooled_linear":
        return AnnHead(_PooledClassifier(base.pooler, getattr(net, "dropout", nn.Identity()), net.classifier)), None
    if kind == "sequence_head":
        return AnnHead(net.classifier), None
    return AnnHead(_ClsClassifier(net.classifier)), None  # "cls_linear"


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
        pooler_output: a bare Hugging Face encoder's pooler applied (as an ANN) to the accumulated output's CLS
            state, ``(B, C)``; ``None`` for models without a pooler.
    """

    outputs: torch.Tensor
    quiescent_step: int | None
    sample_quiescent_step: torch.Tensor
    spikes_per_layer: dict[str, int] = field(default_factory=dict)
    sops_per_layer: dict[str, float] = field(default_factory=dict)
    spikes_per_step: torch.Tensor | None = None
    sops_per_step: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None

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
             mask: torch.Tensor | None = None, chunk: int | None = None,
             skip_after_quiescence: bool = True, **inputs: torch.Tensor) -> SimulationResult:
    """Run ``snn`` with analog encoding (``x`` at t = 0, zeros after) from a fresh reset.

    Args:
        snn: a :class:`SpikingModel` from :func:`convert`.
        x: input batch (images ``(B, C, H, W)`` or token ids ``(B, N)``); floats are cast to the SNN's dtype.
        max_steps: step cap ``T_max`` (>= 1).
        until_quiescent: stop at the first step without any spike (later outputs would be exactly 0).
        mask: optional key mask ``(B, N)`` for text encoders (applied at t = 0); ``attention_mask=`` is the same.
        **inputs: further inputs of the model, handed to its runner at every call and used at t = 0, e.g.
            ``token_type_ids`` (segment ids of a sentence pair) and ``position_ids`` for Hugging Face BERT/RoBERTa
            models. An input the runner does not take raises ``TypeError`` (it is never dropped).
        chunk: time steps per multi-step call (default 4): each layer processes the whole chunk before the next
            layer runs; steps without any input event are skipped (their outputs are exactly zero), row-wise
            operators (LayerNorm, softmax) run once on all steps with input, the ST-BIF recurrence loops over
            the steps in place. ``1`` is the step-by-step reference path. Quiescence is checked after each
            chunk; past it every output is exactly zero, so the remaining steps are cut (``until_quiescent``) or
            filled with zeros. Outputs are identical for every ``chunk``.
        skip_after_quiescence: without ``until_quiescent``, fill the steps after the first silent step with zeros
            instead of simulating them (exact: with zero input nothing can spike again). ``False`` simulates them,
            e.g. to check that the network indeed stays quiet.

    Returns:
        A :class:`SimulationResult`.

    Raises:
        TypeError: ``snn`` is not a :class:`SpikingModel`, or an input (``mask`` or one of ``inputs``) that the
            model's runner does not take.
        ValueError: ``max_steps`` / ``chunk`` < 1, a non-tensor ``x``, both ``mask`` and ``attention_mask``.
    """
    if not isinstance(snn, SpikingModel):
        raise TypeError(f"spikezip_tf: snn must be a SpikingModel (from convert()), got {type(snn).__name__}")
    val.integer("spikezip_tf", "max_steps", max_steps, minimum=1)
    if chunk is not None:
        val.integer("spikezip_tf", "chunk", chunk, minimum=1)
    val.tensor("spikezip_tf", "x", x)
    mask_name = "mask"
    if "attention_mask" in inputs:
        if mask is not None:
            raise ValueError("spikezip_tf: give the key mask as mask or as attention_mask, not both")
        mask, mask_name = inputs.pop("attention_mask"), "attention_mask"
    accepted = snn.input_names
    given = {**inputs, **({"mask": mask} if mask is not None else {})}
    for k in given:
        if accepted is not None and k not in accepted:
            shown = mask_name if k == "mask" else k
            takes = ", ".join(sorted(accepted)) or "nothing besides x"
            raise TypeError(f"spikezip_tf: simulate() got input '{shown}', which the runner of "
                            f"{type(snn.net).__name__} does not take (it takes {takes}); refusing rather than "
                            f"ignoring it")
    p = next(iter(snn.net.parameters()))
    if p.device.type == "cpu":
        _fused.keep_heap()  # no page faults for the per-chunk buffers (see _fused.keep_heap)
    x = x.to(p.device)
    if x.is_floating_point():
        x = x.to(p.dtype)
    if mask is not None:
        mask = mask.to(p.device)
    kw: dict[str, object] = {}
    for k, v in inputs.items():
        val.tensor("spikezip_tf", k, v)
        kw[k] = v.to(p.device)
    if accepted is None or "mask" in accepted:
        kw["mask"] = mask  # (None too: runners that take a mask always got one)
    if chunk is None:
        chunk = 4
    if not snn.multi_step:
        chunk = 1
    neurons = snn.neurons()
    ops = snn.synaptic_ops()
    snn.reset()
    b = x.shape[0]
    outs: list[torch.Tensor] = []
    spikes_layer = {n: torch.zeros((), dtype=torch.long, device=p.device) for n, _ in neurons}
    sops_layer = {n: torch.zeros((), dtype=torch.float64, device=p.device) for n, _ in ops}
    spikes_step: list[int] = []
    sops_step, sample_steps = [], []
    quiet: int | None = None
    t = 0
    while t < max_steps:
        steps = min(chunk, max_steps - t)
        if chunk == 1:  # the step-by-step reference path
            xin = x if t == 0 or not snn.zero_input_after_first else torch.zeros_like(x)
            out = snn.step(xin, **kw)[None]
        else:
            xin = _first_rows(x, t, steps) if snn.zero_input_after_first else x
            out = snn.run_steps(xin, steps, **kw)
        per_sample = torch.zeros(steps, b, dtype=torch.long, device=p.device)
        for n, m in neurons:
            if m.last_spikes is not None:
                per_sample += m.last_spikes
                spikes_layer[n] += m.last_spikes.sum()
            m.last_spikes = None
        step_sops = torch.zeros(steps, dtype=torch.float64, device=p.device)
        for n, m in ops:
            if m.last_sops is not None:
                sops_layer[n] += m.last_sops.sum()
                step_sops += m.last_sops
                m.last_sops = None
        totals = per_sample.sum(1).tolist()  # one host sync per chunk
        keep = steps
        silent = [i for i, tot in enumerate(totals) if tot == 0]
        if silent and quiet is None:
            quiet = t + silent[0]  # the FIRST silent step (later steps stay silent)
            if until_quiescent:
                # past a silent step nothing spikes and every output is exactly 0: cutting loses nothing
                keep = silent[0] + 1
        outs.append(out[:keep])
        sample_steps.append(per_sample[:keep])
        spikes_step.extend(totals[:keep])
        sops_step.append(step_sops[:keep])
        t += steps
        if quiet is not None and (until_quiescent or skip_after_quiescence):
            if not until_quiescent and t < max_steps:
                # every later step is silent with exactly zero outputs and no synaptic events (the input is zero
                # after t = 0): fill them in instead of computing them
                rest = max_steps - t
                outs.append(out.new_zeros(rest, *out.shape[1:]))
                sample_steps.append(per_sample.new_zeros(rest, b))
                spikes_step.extend([0] * rest)
                sops_step.append(step_sops.new_zeros(rest))
            break
    per = torch.cat(sample_steps)  # (T, B)
    silent_mask = per.eq(0)
    first = torch.where(silent_mask.any(0), silent_mask.float().argmax(0), torch.full_like(per[0], -1))
    outputs = torch.cat(outs)
    pooled = snn.pooler(outputs.sum(0)) if snn.pooler is not None else None  # ANN pooler on the accumulated CLS
    return SimulationResult(
        outputs=outputs, quiescent_step=quiet, sample_quiescent_step=first, pooler_output=pooled,
        spikes_per_layer={n: int(v) for n, v in spikes_layer.items()},
        sops_per_layer={n: float(v) for n, v in sops_layer.items()},
        spikes_per_step=torch.tensor(spikes_step), sops_per_step=torch.cat(sops_step).cpu())


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

    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(lin(name)))
        elif isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv(name)))
        elif (isinstance(m, (QAttention, QSelfAttention)) or _is_qkv_attention(m) or _is_hf_self_attention(m)):
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

"""Enhancing Vision Transformer: Amplifying Non-Linearity in Feedforward Network Module (Xu et al., ICML 2024).

arXiv: none (PMLR 235:55100-55111, ``pmlr-v235-xu24n``) · official code: none published.

A ViT FFN ``Y = W2 σ(W1 X)`` gives one non-linear basis function per hidden unit, so its non-linearity grows
with the hidden width C' = r·C. IFFN keeps a *reduced* hidden width and applies n learnable activations
``AGeLU_k(u) = a_k · GeLU(b_k · u + c_k) + d_k`` to the same ``U = W1 X`` (n·C' basis functions), adds a
spatial branch ``AGeLU_s(DWConv_k×k(grid(U)))`` over the patch-token grid, and projects the concatenation:
``Y = W2 [AGeLU_1(U), ..., AGeLU_n(U), AGeLU_s(DWConv(U))]``.

The paper text and code were not available: AGeLU's form, the initialisation, the concat/add merge of the
spatial branch, its normalisation and the hidden ratio are RECONSTRUCTIONS, each a constructor option.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from icml24.common import validate as v

__all__ = [
    "AGeLU",
    "IFFN",
    "agelu_parameter_names",
    "agelu_shift_spread",
    "agelu_shifts",
    "count_flops",
    "ffn_flops_per_token",
    "ffn_num_params",
    "replace_ffn",
]

AGeLUInit = Literal["gelu", "shift", "sign"]


class AGeLU(nn.Module):
    """Arbitrary GeLU, ``AGeLU_k(u) = a_k · GeLU(b_k · u + c_k) + d_k`` with learnable ``a, b, c, d``.

    With ``n_instances = n > 1`` the n instances are applied to the same input and concatenated along the last
    dimension (instance-major): ``(..., C') -> (..., n·C')``, i.e. ``cat([AGeLU_1(u), ..., AGeLU_n(u)], -1)``.

    Args:
        num_features: C', the width of the last input dimension; needed for ``param_shape="channel"``.
            ``None`` (as when used as a timm ``act_layer()``) gives scalar parameters.
        n_instances: n, number of AGeLU instances (>= 1).
        param_shape: ``"channel"`` (C' values per instance) or ``"scalar"`` (one value per instance). The
            parameters are stored **1-D**, instance-major: ``a`` has shape ``(n·C',)`` (``"channel"``) or ``(n,)``
            (``"scalar"``), so ``a[k·C' + j]`` scales output channel ``k·C' + j``; :meth:`per_instance` gives the
            ``(n, C')`` / ``(n, 1)`` view. Being 1-D they fall in the no-decay group of timm's rule
            (``ndim <= 1``); checkpoints with the former 2-D ``(n, C')`` shapes still load.
        init: ``"gelu"``: a=b=1, c=d=0 for every instance (exactly ``F.gelu``); ``"shift"``: a=b=1, d=0,
            c_k evenly spaced in ``[-shift, shift]`` (c=0 when n=1); ``"sign"``: b_k alternates +1, -1 and
            c_k = shift (a sign flip alone would be linearly dependent: GeLU(-u) = GeLU(u) - u).
            RECONSTRUCTED: the paper's initialisation is not known.
        shift: the shift used by ``init="shift"``/``"sign"``.
        learnable: if False, a, b, c, d are fixed buffers (the "n shifted plain GeLUs" ablation).
        approximate: GeLU form passed to ``F.gelu`` (``"none"`` = exact erf GeLU, torch's default).
        device: device of the parameters.
        dtype: dtype of the parameters.
    """

    def __init__(self, num_features: int | None = None, *, n_instances: int = 1,
                 param_shape: Literal["channel", "scalar"] = "channel", init: AGeLUInit = "gelu",
                 shift: float = 0.5, learnable: bool = True, approximate: Literal["none", "tanh"] = "none",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        v.integer("iffn", "n_instances", n_instances, minimum=1)
        v.one_of("iffn", "param_shape", param_shape, ("channel", "scalar"))
        if num_features is None:
            param_shape = "scalar"
        else:
            v.integer("iffn", "num_features", num_features, minimum=1)
        v.one_of("iffn", "init", init, ("gelu", "shift", "sign"))
        v.finite("iffn", "shift", shift)
        v.one_of("iffn", "approximate", approximate, ("none", "tanh"))
        self.num_features = num_features
        self.n_instances = n_instances
        self.param_shape = param_shape
        self.init = init
        self.shift = shift
        self.approximate = approximate
        width = num_features if param_shape == "channel" else 1
        kw = {"device": device, "dtype": dtype}
        a = torch.ones(n_instances, width, **kw)
        b = torch.ones(n_instances, width, **kw)
        c = torch.zeros(n_instances, width, **kw)
        d = torch.zeros(n_instances, width, **kw)
        if init == "shift" and n_instances > 1:
            c += torch.linspace(-shift, shift, n_instances, **kw)[:, None]
        elif init == "sign":
            b *= torch.tensor([(-1.0) ** k for k in range(n_instances)], **kw)[:, None]
            c += shift
        self._width = width
        for name, value in (("a", a), ("b", b), ("c", c), ("d", d)):
            value = value.reshape(-1)  # 1-D: excluded from weight decay by timm's ``ndim <= 1`` rule
            if learnable:
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)

    def initial_shifts(self) -> torch.Tensor:
        """The ``(n, C')`` (or ``(n, 1)``) shifts c_k this layer was initialised with (``init``, ``shift``)."""
        c = torch.zeros(self.n_instances, self._width, device=self.c.device, dtype=self.c.dtype)
        if self.init == "shift" and self.n_instances > 1:
            c += torch.linspace(-self.shift, self.shift, self.n_instances, device=c.device, dtype=c.dtype)[:, None]
        elif self.init == "sign":
            c += self.shift
        return c

    def per_instance(self, name: Literal["a", "b", "c", "d"]) -> torch.Tensor:
        """The parameter ``name`` as an ``(n, C')`` view (``(n, 1)`` for scalar parameters); row k is instance k."""
        v.one_of("iffn", "name", name, ("a", "b", "c", "d"))
        return getattr(self, name).view(self.n_instances, self._width)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for name in "abcd":  # checkpoints written with the former (n, C') layout
            t = state_dict.get(prefix + name)
            if isinstance(t, torch.Tensor) and t.ndim == 2 and t.shape == (self.n_instances, self._width):
                state_dict[prefix + name] = t.reshape(-1)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    @property
    def out_features(self) -> int | None:
        """n·C' (None when the width is not fixed)."""
        return None if self.num_features is None else self.n_instances * self.num_features

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if self.param_shape == "channel" and u.shape[-1] != self.num_features:
            raise ValueError(f"iffn: AGeLU expects last dimension {self.num_features}, got {tuple(u.shape)}")
        a, b, c, d = (t.view(self.n_instances, self._width) for t in (self.a, self.b, self.c, self.d))
        if self.n_instances == 1:
            return a[0] * F.gelu(b[0] * u + c[0], approximate=self.approximate) + d[0]
        z = u.unsqueeze(-2)  # (..., 1, C') against (n, C') -> (..., n, C')
        h = a * F.gelu(b * z + c, approximate=self.approximate) + d
        return h.flatten(-2)

    def extra_repr(self) -> str:
        return (f"num_features={self.num_features}, n_instances={self.n_instances}, "
                f"param_shape={self.param_shape!r}, init={self.init!r}")


class IFFN(nn.Module):
    """The improved FFN: reduced hidden width, n AGeLU instances, optional depthwise-conv spatial branch.

    ``U = fc1(X)`` (C -> C'), ``H_c = cat_k AGeLU_k(U)`` (n·C'), ``H_s = AGeLU_s(norm(DWConv(grid(U))))``
    (C', patch tokens only; prefix/cls tokens get zeros), ``Y = fc2(cat(H_c, H_s))`` for ``spatial_merge=
    "concat"`` or ``fc2(H_c + repeat_n(H_s))`` for ``"add"`` (``topology="parallel"``, the default).
    ``topology="serial"`` puts the depthwise conv *before* the activations, as in LocalViT / CMT's IRFFN:
    ``Y = fc2(cat_k AGeLU_k(norm(DWConv(grid(U)))))`` (fc2 input n·C'; prefix tokens skip the conv, keeping U).

    The first eight arguments are timm's ``Mlp`` signature (``in_features, hidden_features, out_features,
    act_layer, norm_layer, bias, drop, use_conv``) with timm's defaults and meaning: ``IFFN(64, 256)`` has
    hidden width 256, as ``Mlp(64, 256)`` has. timm's ``Block`` calls ``mlp_layer(in_features=dim,
    hidden_features=int(dim*mlp_ratio), act_layer=, norm_layer=, bias=, drop=, device=, dtype=)``, so
    ``IFFN`` (host width) or ``functools.partial(IFFN, hidden_ratio=1.0, ...)`` (the paper's reduced width)
    fill the ``mlp_layer`` slot unchanged. The token grid is inferred at forward time: ``H = W = sqrt(N -
    num_prefix_tokens)`` for ``(B, N, C)`` input, or taken from the shape of channels-last ``(B, H, W, C)``
    input (Swin layout, no prefix tokens), or of channels-first ``(B, C, H, W)`` input with ``use_conv=True``.

    Args:
        in_features: C, token width.
        hidden_features: hidden width C' (timm: ``int(C·mlp_ratio)``; default C), used unless ``hidden_ratio``
            is given.
        out_features: output width (default C).
        act_layer: accepted for timm compatibility and ignored: the activations are AGeLU (GeLU-based).
        norm_layer: optional norm over the fc2 input width (timm's ``scale_mlp_norm``), else identity. With
            ``use_conv=True`` it sees the channels-first ``(B, fc2_in, H, W)`` map, as in timm.
        bias: bias of fc1/fc2 (a bool or a pair like timm's ``to_2tuple``); the depthwise conv uses ``bias[0]``.
        drop: dropout after the activations and after fc2: a float or a pair ``(drop1, drop2)`` (timm's
            ``to_2tuple``).
        use_conv: timm's 1x1-conv form: fc1/fc2 are ``nn.Conv2d(kernel_size=1)`` (state dicts match timm's
            ``Mlp(use_conv=True)``) and the input is a channels-first ``(B, C, H, W)`` map, which is also the
            spatial branch's grid (no prefix tokens: ``num_prefix_tokens`` is set to 0).
        hidden_ratio: r, the paper's reduced hidden width ``C' = round(r·C)`` (e.g. 1.0 instead of ViT's 4);
            when given it overrides ``hidden_features``; ``None`` (default) keeps ``hidden_features``.
        n_instances: n, AGeLU instances on the channel path.
        spatial: whether to add the depthwise-conv spatial branch.
        kernel_size: k, odd side of the depthwise kernel (padding k//2 keeps the grid), or an odd pair
            ``(k_h, k_w)``: ``(1, k)`` with ``grid_size=(1, L)`` is a 1-D depthwise conv along a token sequence.
        spatial_merge: ``"concat"`` (fc2 input (n+1)·C') or ``"add"`` (fc2 input n·C'). RECONSTRUCTED.
        spatial_norm: ``"none"`` or ``"bn"`` (BatchNorm2d after the depthwise conv). RECONSTRUCTED.
        spatial_act: ``"agelu"`` (learnable, GeLU init) or ``"gelu"`` (plain GeLU) after the conv.
        agelu_init: initialisation of the channel-path instances (see :class:`AGeLU`). RECONSTRUCTED.
        agelu_shift: shift used by ``agelu_init``.
        agelu_learnable: False fixes a, b, c, d (plain shifted GeLUs; ablation).
        param_shape: ``"channel"`` or ``"scalar"`` AGeLU parameters.
        num_prefix_tokens: P, leading tokens (cls/dist) that bypass the spatial branch (0 for Swin-like hosts,
            whose FFN sees the ``(B, H·W, C)`` stage map, or for window tokens ``(B·nW, ws², C)``).
        grid_size: default ``(H, W)`` of the patch-token grid of ``(B, N, C)`` input when the host cannot pass
            one (a non-square Swin stage); ``None`` infers a square grid. A ``grid_size`` given to
            :meth:`forward` takes precedence.
        topology: ``"parallel"`` (conv branch beside the activations, merged by ``spatial_merge``) or
            ``"serial"`` (fc1 -> DWConv -> norm -> AGeLU_k -> fc2, LocalViT/CMT; ``spatial_merge`` and
            ``spatial_act`` unused). RECONSTRUCTED: the paper's topology is not known.
        device: device of the parameters.
        dtype: dtype of the parameters.
    """

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: Callable[..., nn.Module] | None = None,
                 norm_layer: Callable[[int], nn.Module] | None = None,
                 bias: bool | tuple[bool, bool] = True, drop: float | tuple[float, float] = 0.0,
                 use_conv: bool = False, *, hidden_ratio: float | None = None, n_instances: int = 2, spatial: bool = True,
                 kernel_size: int | tuple[int, int] = 3, spatial_merge: Literal["concat", "add"] = "concat",
                 spatial_norm: Literal["none", "bn"] = "none", spatial_act: Literal["agelu", "gelu"] = "agelu",
                 agelu_init: AGeLUInit = "shift", agelu_shift: float = 0.5, agelu_learnable: bool = True,
                 param_shape: Literal["channel", "scalar"] = "channel", num_prefix_tokens: int = 1,
                 grid_size: tuple[int, int] | None = None, topology: Literal["parallel", "serial"] = "parallel",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        v.integer("iffn", "in_features", in_features, minimum=1)
        if hidden_features is not None:
            v.integer("iffn", "hidden_features", hidden_features, minimum=1)
        if out_features is not None:
            v.integer("iffn", "out_features", out_features, minimum=1)
        if hidden_ratio is not None:
            v.positive("iffn", "hidden_ratio", hidden_ratio)
        v.integer("iffn", "n_instances", n_instances, minimum=1)
        if isinstance(kernel_size, (tuple, list)):
            if len(kernel_size) != 2:
                raise ValueError(f"iffn: kernel_size must be an int or a pair (k_h, k_w), got {kernel_size!r}")
            kernel_hw = tuple(kernel_size)
        else:
            kernel_hw = (kernel_size, kernel_size)
        for k in kernel_hw:
            v.integer("iffn", "kernel_size", k, minimum=1)
            if k % 2 == 0:
                raise ValueError(f"iffn: kernel_size must be odd (even kernels shift the token grid), got "
                                 f"{kernel_size}")
        v.integer("iffn", "num_prefix_tokens", num_prefix_tokens, minimum=0)
        v.one_of("iffn", "spatial_merge", spatial_merge, ("concat", "add"))
        v.one_of("iffn", "spatial_norm", spatial_norm, ("none", "bn"))
        v.one_of("iffn", "spatial_act", spatial_act, ("agelu", "gelu"))
        v.one_of("iffn", "topology", topology, ("parallel", "serial"))
        if grid_size is not None:
            _check_grid_size(grid_size)
            grid_size = (int(grid_size[0]), int(grid_size[1]))
        drops = tuple(drop) if isinstance(drop, (tuple, list)) else (drop, drop)
        if len(drops) != 2:
            raise ValueError(f"iffn: drop must be a float or a pair (drop1, drop2), got {drop!r}")
        for d in drops:
            v.in_range("iffn", "drop", d, 0.0, 1.0, high_open=True)
        biases = (bias, bias) if isinstance(bias, bool) else tuple(bias)
        if len(biases) != 2:
            raise ValueError(f"iffn: bias must be a bool or a pair of bools, got {bias!r}")
        if not isinstance(use_conv, bool):
            raise TypeError(f"iffn: use_conv must be a bool, got {type(use_conv).__name__}")
        if use_conv:
            num_prefix_tokens = 0  # a (B, C, H, W) map has no cls token
        del act_layer  # NOTE(deviation): the host's act_layer is replaced by AGeLU (the method's point).

        # timm's rule (hidden_features or in_features) unless the paper's ratio r is asked for explicitly
        hidden = max(1, int(round(hidden_ratio * in_features))) if hidden_ratio is not None else (
            hidden_features or in_features)
        self.hidden_ratio = hidden_ratio
        self.use_conv = use_conv
        self.in_features = in_features
        self.hidden = hidden
        self.out_features = out_features or in_features
        self.n_instances = n_instances
        self.spatial = spatial
        self.kernel_size = kernel_size if isinstance(kernel_size, int) else kernel_hw
        self.kernel_hw: tuple[int, int] = kernel_hw
        self.spatial_merge = spatial_merge
        self.num_prefix_tokens = num_prefix_tokens
        self.grid_size = grid_size
        self.topology = topology
        self.bias = biases
        kw = {"device": device, "dtype": dtype}

        linear = functools.partial(nn.Conv2d, kernel_size=1) if use_conv else nn.Linear
        self.fc1 = linear(in_features, hidden, bias=biases[0], **kw)
        self.act = AGeLU(hidden, n_instances=n_instances, param_shape=param_shape, init=agelu_init,
                         shift=agelu_shift, learnable=agelu_learnable, **kw)
        if spatial:
            self.dwconv = nn.Conv2d(hidden, hidden, kernel_hw, padding=(kernel_hw[0] // 2, kernel_hw[1] // 2),
                                    groups=hidden,
                                    bias=biases[0], **kw)
            self.spatial_norm = nn.BatchNorm2d(hidden, **kw) if spatial_norm == "bn" else nn.Identity()
            if topology == "parallel":
                self.spatial_act = (AGeLU(hidden, param_shape=param_shape, init="gelu", **kw)
                                    if spatial_act == "agelu" else nn.GELU())
        concat = spatial and topology == "parallel" and spatial_merge == "concat"
        self.fc2_in = hidden * (n_instances + (1 if concat else 0))
        self.drop1 = nn.Dropout(drops[0])
        self.norm = norm_layer(self.fc2_in) if norm_layer is not None else nn.Identity()
        if device is not None or dtype is not None:
            self.norm.to(device=device, dtype=dtype)
        self.fc2 = linear(self.fc2_in, self.out_features, bias=biases[1], **kw)
        self.drop2 = nn.Dropout(drops[1])

    # ------------------------------------------------------------------ forward
    def _grid(self, n_tokens: int, p: int, grid_size: tuple[int, int] | None) -> tuple[int, int]:
        n_grid = n_tokens - p
        if n_grid < 1:
            raise ValueError(f"iffn: the spatial branch needs patch tokens: N={n_tokens} <= num_prefix_tokens={p}")
        if grid_size is not None:
            _check_grid_size(grid_size)
            h, w = grid_size
            if h * w != n_grid:
                raise ValueError(f"iffn: grid_size {grid_size} has {h * w} cells but there are {n_grid} patch "
                                 f"tokens (N={n_tokens}, num_prefix_tokens={p})")
            return h, w
        side = math.isqrt(n_grid)
        if side * side != n_grid:
            raise ValueError(f"iffn: the spatial branch needs a square token grid, but N - num_prefix_tokens = "
                             f"{n_tokens} - {p} = {n_grid} is not a perfect square; pass grid_size=(H, W) or use "
                             f"(B, H, W, C) input")
        return side, side

    def forward(self, x: torch.Tensor, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """Apply IFFN to ``(B, N, C)`` tokens (P prefix tokens first, then an H×W grid, row-major) or to a
        channels-last ``(B, H, W, C)`` grid. ``grid_size=(H, W)`` overrides the square-grid inference.
        Without the spatial branch any ``(..., C)`` input is accepted."""
        if self.use_conv:
            return self._forward_conv(x)
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"iffn: expected last dimension {self.in_features}, got {tuple(x.shape)}")
        if not self.spatial:  # token-wise: any (..., C) input
            return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))
        if x.ndim not in (3, 4):
            raise ValueError(f"iffn: the spatial branch needs (B, N, C) or (B, H, W, C) input, got shape "
                             f"{tuple(x.shape)}")
        if x.ndim == 4:  # channels-last grid (Swin layout): no prefix tokens
            b, gh, gw, c = x.shape
            y = self._forward_tokens(x.reshape(b, gh * gw, c), 0, (gh, gw))
            return y.reshape(b, gh, gw, -1)
        return self._forward_tokens(x, self.num_prefix_tokens, grid_size if grid_size is not None else self.grid_size)

    def _forward_conv(self, x: torch.Tensor) -> torch.Tensor:
        """timm's ``use_conv`` form: channels-first ``(B, C, H, W)`` in and out, 1x1-conv fc1/fc2."""
        if x.ndim != 4 or x.shape[1] != self.in_features:
            raise ValueError(f"iffn: use_conv=True expects (B, {self.in_features}, H, W) input, got "
                             f"{tuple(x.shape)}")
        b, c, gh, gw = x.shape
        tokens = x.flatten(2).transpose(1, 2)               # (B, H·W, C), row-major grid
        h = self._hidden(tokens, 0, (gh, gw))               # (B, H·W, fc2_in)
        h = h.transpose(1, 2).reshape(b, self.fc2_in, gh, gw)
        return self.drop2(self.fc2(self.norm(h)))           # norm and 1x1 conv on the channels-first map

    def _fc1(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_conv:  # a 1x1 conv is a linear map of the channel vector
            return F.linear(x, self.fc1.weight.flatten(1), self.fc1.bias)
        return self.fc1(x)

    def _forward_tokens(self, x: torch.Tensor, p: int, grid_size: tuple[int, int] | None) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self._hidden(x, p, grid_size))))

    def _hidden(self, x: torch.Tensor, p: int, grid_size: tuple[int, int] | None) -> torch.Tensor:
        """The fc2 input (after ``drop1``, before ``norm``) of ``(B, N, C)`` tokens."""
        hw = self._grid(x.shape[1], p, grid_size) if self.spatial else None
        u = self._fc1(x)                                    # (B, N, C')
        if self.spatial and self.topology == "serial":     # fc1 -> DWConv -> act (LocalViT / CMT)
            b, _, cp = u.shape
            g = u[:, p:].transpose(1, 2).reshape(b, cp, hw[0], hw[1])
            s = self.spatial_norm(self.dwconv(g)).flatten(2).transpose(1, 2)
            h = self.act(torch.cat([u[:, :p], s], dim=1))   # prefix tokens keep U (no conv)
            return self.drop1(h)
        h = self.act(u)                                     # (B, N, n·C')
        if self.spatial:
            b, _, cp = u.shape
            g = u[:, p:].transpose(1, 2).reshape(b, cp, hw[0], hw[1])
            s = self.spatial_norm(self.dwconv(g)).flatten(2).transpose(1, 2)
            s = self.spatial_act(s)                         # (B, N-P, C')
            s = torch.cat([s.new_zeros(b, p, cp), s], dim=1)  # prefix tokens: zero spatial part
            h = torch.cat([h, s], dim=-1) if self.spatial_merge == "concat" else h + s.repeat(1, 1, self.n_instances)
        return self.drop1(h)

    # ------------------------------------------------------------------ costs
    def flops(self, *, batch_size: int, num_tokens: int, num_prefix_tokens: int | None = None) -> int:
        """FLOPs of one forward pass as ``torch.utils.flop_counter.FlopCounterMode`` counts them: 2 × the
        multiply-accumulates of fc1, fc2 and the depthwise conv (biases, activations, norms not counted).
        ``num_prefix_tokens`` defaults to the layer's; pass 0 for channels-last ``(B, H, W, C)`` input."""
        v.integer("iffn", "batch_size", batch_size, minimum=1)
        v.integer("iffn", "num_tokens", num_tokens, minimum=1)
        p = self.num_prefix_tokens if num_prefix_tokens is None else num_prefix_tokens
        v.integer("iffn", "num_prefix_tokens", p, minimum=0)
        dense = 2 * num_tokens * (self.in_features * self.hidden + self.fc2_in * self.out_features)
        conv = 2 * (num_tokens - p) * self.hidden * self.kernel_hw[0] * self.kernel_hw[1] if self.spatial else 0
        return batch_size * (dense + conv)

    def flops_per_token(self, num_tokens: int | None = None) -> float:
        """FLOPs per token (counter convention, 2 per MAC). ``num_tokens=None``: a patch token (spatial branch
        included); ``num_tokens=N``: the mean over a sequence of N tokens whose P prefix tokens skip the conv."""
        if num_tokens is None:
            conv = 2 * self.hidden * self.kernel_hw[0] * self.kernel_hw[1] if self.spatial else 0
            return float(2 * (self.in_features * self.hidden + self.fc2_in * self.out_features) + conv)
        return self.flops(batch_size=1, num_tokens=num_tokens) / num_tokens

    def num_params(self) -> int:
        """Learnable parameters from the closed form (fc1, AGeLU, depthwise conv, norm, fc2)."""
        c, cp, o = self.in_features, self.hidden, self.out_features
        total = c * cp + (cp if self.bias[0] else 0)
        total += sum(t.numel() for t in self.act.parameters())
        if self.spatial:
            total += cp * self.kernel_hw[0] * self.kernel_hw[1] + (cp if self.bias[0] else 0)
            total += sum(t.numel() for t in self.spatial_norm.parameters())
            if self.topology == "parallel":
                total += sum(t.numel() for t in self.spatial_act.parameters())
        total += sum(t.numel() for t in self.norm.parameters())
        return total + self.fc2_in * o + (o if self.bias[1] else 0)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, hidden={self.hidden}, hidden_ratio={self.hidden_ratio}, "
                f"use_conv={self.use_conv}, n_instances={self.n_instances}, "
                f"spatial={self.spatial}, kernel_size={self.kernel_size}, spatial_merge={self.spatial_merge!r}, "
                f"num_prefix_tokens={self.num_prefix_tokens}, topology={self.topology!r}")


def _check_grid_size(grid_size: object) -> None:
    if (not isinstance(grid_size, (tuple, list)) or len(grid_size) != 2
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid_size)):
        raise ValueError(f"iffn: grid_size must be two ints >= 1, got {grid_size!r}")


def ffn_flops_per_token(*, in_features: int, hidden_features: int, out_features: int | None = None) -> int:
    """FLOPs per token of a standard FFN ``fc2(act(fc1 x))`` (counter convention: 2·(C·C' + C'·C_out))."""
    v.integer("iffn", "in_features", in_features, minimum=1)
    v.integer("iffn", "hidden_features", hidden_features, minimum=1)
    out = out_features or in_features
    return 2 * (in_features * hidden_features + hidden_features * out)


def ffn_num_params(*, in_features: int, hidden_features: int, out_features: int | None = None,
                   bias: bool = True) -> int:
    """Parameters of a standard FFN (two linear layers, parameter-free activation)."""
    v.integer("iffn", "in_features", in_features, minimum=1)
    v.integer("iffn", "hidden_features", hidden_features, minimum=1)
    out = out_features or in_features
    return in_features * hidden_features + hidden_features * out + ((hidden_features + out) if bias else 0)


def count_flops(module: nn.Module, *inputs: torch.Tensor) -> int:
    """Total FLOPs of ``module(*inputs)`` (forward only, no grad) measured by ``FlopCounterMode``."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(*inputs)
    return int(counter.get_total_flops())


_PREFIX_TOKEN_ATTRS = ("cls_token", "dist_token", "distillation_token")


def _default_prefix_tokens(model: nn.Module) -> int:
    """timm's ``model.num_prefix_tokens`` if present, else the leading tokens held by the first module (the model
    itself, or HF's ``embeddings``) that has a ``cls_token``: one per ``cls_token``/``dist_token``/
    ``distillation_token`` tensor plus the ``register_tokens`` (DINOv2 with registers); 0 when no module has a
    cls token (Swin-like models)."""
    p = getattr(model, "num_prefix_tokens", None)
    if p is not None:
        return int(p)
    for mod in model.modules():
        if isinstance(getattr(mod, "cls_token", None), torch.Tensor):
            n = sum(isinstance(getattr(mod, k, None), torch.Tensor) for k in _PREFIX_TOKEN_ATTRS)
            reg = getattr(mod, "register_tokens", None)
            return n + (int(reg.shape[1]) if isinstance(reg, torch.Tensor) and reg.ndim == 3 else 0)
    return sum(isinstance(getattr(model, k, None), torch.Tensor) for k in ("cls_token", "dist_token"))


def _as_pointwise(layer: object) -> tuple[int, int] | None:
    """``(in, out)`` of an ``nn.Linear`` or a 1x1 ``nn.Conv2d`` (timm's ``use_conv`` Mlp), else None."""
    if isinstance(layer, nn.Linear):
        return layer.in_features, layer.out_features
    if (isinstance(layer, nn.Conv2d) and layer.kernel_size == (1, 1) and layer.stride == (1, 1)
            and layer.padding == (0, 0) and layer.dilation == (1, 1) and layer.groups == 1):
        return layer.in_channels, layer.out_channels
    return None


def _hf_pair(parent: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """``(intermediate, output)`` when ``parent`` is an HF encoder layer with the FFN split in two (ViTLayer,
    DeiTLayer, BertLayer...): ``intermediate.dense`` Linear C -> C' + activation, ``output.dense`` Linear
    C' -> C (then dropout, residual or norm inside ``output``)."""
    inter, out = getattr(parent, "intermediate", None), getattr(parent, "output", None)
    if not (isinstance(inter, nn.Module) and isinstance(out, nn.Module)):
        return None
    d1, d2 = getattr(inter, "dense", None), getattr(out, "dense", None)
    if not (isinstance(d1, nn.Linear) and isinstance(d2, nn.Linear)):
        return None
    if d1.out_features != d2.in_features or d2.out_features != d1.in_features:
        return None
    return inter, out


def replace_ffn(model: nn.Module, *, attr: str = "mlp", style: Literal["auto", "timm", "hf"] = "auto",
                num_prefix_tokens: int | None = None, keep_weights: bool = False,
                new_fc2_columns: Literal["zeros", "init"] = "zeros", **iffn_kwargs: object) -> int:
    """Replace every FFN of ``model`` by an :class:`IFFN`; raise if there is none to replace.

    Two layouts are found (``style="auto"``: both):

    - ``"timm"``: an FFN stored as ``<block>.<attr>`` with ``fc1``/``fc2`` that are ``nn.Linear`` (timm-style
      ViTs ``blocks.i.mlp``, Swin-like models ``layers.i.blocks.j.mlp``, the package's ``TinyViT``) or 1x1
      ``nn.Conv2d`` (timm's ``Mlp(use_conv=True)``: the IFFN gets ``use_conv=True``).
    - ``"hf"``: Hugging Face's split FFN, ``<layer>.intermediate`` (``dense`` C -> C' + activation) and
      ``<layer>.output`` (``dense`` C' -> C, dropout, then the residual add in ``ViTOutput`` / ``DeiTOutput``,
      or add + LayerNorm in ``BertOutput``). ``intermediate`` becomes the IFFN (C -> C) and ``output.dense``
      becomes ``nn.Identity``, so ``output`` keeps its own dropout, residual and norm; the IFFN's ``drop``
      defaults to 0 there (``output.dropout`` already follows it). The HF ``hidden_act`` is replaced by AGeLU,
      and ``config.intermediate_size`` no longer describes the model (``save_pretrained`` writes weights that
      a stock class will not load).

    The new module lives on the old one's device/dtype and keeps its in/out widths; ``hidden_features``
    defaults to the old hidden width (kept unless ``hidden_ratio`` is given).

    With ``keep_weights=True`` the pretrained linear weights are copied where shapes allow (old hidden width
    C'_old, new C', m = min(C', C'_old)): ``fc1.weight[:m]``/``fc1.bias[:m]`` <- the old first m rows (hidden
    units m..C'-1, if any, keep their fresh init); ``fc2.weight[:, :m]`` (the columns read by the first AGeLU
    instance) <- the old first m columns; ``fc2.bias`` <- the old bias. Every other fc2 input column (AGeLU
    instances 2..n, the concat spatial part, units beyond C'_old) is zero (``new_fc2_columns="zeros"``: the
    new paths start silent, so with ``n_instances=1, agelu_init="gelu", spatial=False`` and the old width the
    block computes the old FFN exactly, given a GeLU host) or keeps its fresh init (``"init"``). A reduced
    width (C' < C'_old) keeps the *first* C' hidden units, not a selection by importance.

    Args:
        model: the network, modified in place (only after every target has been checked).
        attr: attribute name of the FFN inside a timm-style block.
        style: ``"auto"``, ``"timm"`` or ``"hf"``: which layouts to look for.
        num_prefix_tokens: P for every IFFN; default ``model.num_prefix_tokens`` (timm convention), else the
            count of cls/distillation/register tokens of the first module holding a ``cls_token`` (HF ViT's
            ``embeddings``: 1), else 0 (Swin-like models).
        keep_weights: copy the old fc1/fc2 weights as described above.
        new_fc2_columns: ``"zeros"`` or ``"init"`` for the fc2 columns without a pretrained counterpart.
        **iffn_kwargs: keyword arguments of :class:`IFFN` (``hidden_ratio``, ``n_instances``, ``spatial``...).

    Returns:
        The number of replaced FFNs (>= 1).

    Raises:
        ValueError: no FFN of either layout was found (also when every FFN already is an IFFN), or bad arguments.
    """
    if not attr:
        raise ValueError("iffn: attr must name the FFN attribute, got ''")
    v.one_of("iffn", "style", style, ("auto", "timm", "hf"))
    if not isinstance(keep_weights, bool):
        raise TypeError(f"iffn: keep_weights must be a bool, got {type(keep_weights).__name__}")
    v.one_of("iffn", "new_fc2_columns", new_fc2_columns, ("zeros", "init"))
    if num_prefix_tokens is None:
        num_prefix_tokens = _default_prefix_tokens(model)
    # (kind, parent, old FFN or HF output, fc1, fc2) for every target, collected before any change
    targets: list[tuple[str, nn.Module, nn.Module, nn.Module, nn.Module]] = []
    n_iffn = 0
    for parent in model.modules():
        old = getattr(parent, attr, None)
        if style in ("auto", "timm") and isinstance(old, nn.Module):
            if isinstance(old, IFFN):
                n_iffn += 1
            else:
                fc1, fc2 = getattr(old, "fc1", None), getattr(old, "fc2", None)
                s1, s2 = _as_pointwise(fc1), _as_pointwise(fc2)
                if s1 is not None and s2 is not None and type(fc1) is type(fc2):
                    targets.append(("timm", parent, old, fc1, fc2))
        if style in ("auto", "hf"):
            if isinstance(getattr(parent, "intermediate", None), IFFN):
                n_iffn += 1
                continue
            pair = _hf_pair(parent)
            if pair is not None:
                inter, out = pair
                targets.append(("hf", parent, out, inter.dense, out.dense))
    if not targets:
        where = {"auto": f"no `<block>.{attr}` with Linear/1x1-conv fc1/fc2 and no Hugging Face "
                         "`intermediate.dense`/`output.dense` pair",
                 "timm": f"no `<block>.{attr}` with Linear/1x1-conv fc1/fc2",
                 "hf": "no Hugging Face `intermediate.dense`/`output.dense` pair"}[style]
        hint = (f" ({n_iffn} FFN(s) already are IFFNs)" if n_iffn else
                "; pass attr= (timm layout) or style= naming the layout of this model")
        raise ValueError(f"iffn: replace_ffn found nothing to replace in {type(model).__name__}: {where}{hint}")
    news = []
    for _, _, _, fc1, fc2 in targets:
        w = fc1.weight
        in_f, hid = _as_pointwise(fc1)
        out_f = _as_pointwise(fc2)[1]
        kwargs: dict[str, object] = {"hidden_features": hid, "out_features": out_f,
                                     "bias": (fc1.bias is not None, fc2.bias is not None),
                                     "num_prefix_tokens": num_prefix_tokens, "device": w.device, "dtype": w.dtype}
        if isinstance(fc1, nn.Conv2d):
            kwargs["use_conv"] = True
        kwargs.update(iffn_kwargs)
        new = IFFN(in_f, **kwargs)  # every IFFN is built (and its arguments checked) before the model changes
        if keep_weights:
            _copy_ffn_weights(fc1, fc2, new, zero_rest=new_fc2_columns == "zeros")
        news.append(new)
    for (kind, parent, holder, _, _), new in zip(targets, news, strict=True):
        if kind == "timm":
            setattr(parent, attr, new)
        else:  # HF: intermediate -> IFFN (C -> C), output.dense -> identity (output keeps dropout + residual)
            parent.intermediate = new
            holder.dense = nn.Identity()
    return len(targets)


@torch.no_grad()
def _copy_ffn_weights(fc1: nn.Module, fc2: nn.Module, new: IFFN, *, zero_rest: bool) -> None:
    (in1, hid), (_, out2) = _as_pointwise(fc1), _as_pointwise(fc2)
    if out2 != new.out_features or in1 != new.in_features:
        raise ValueError(f"iffn: keep_weights needs the same in/out widths, got {in1}->{out2} vs "
                         f"{new.in_features}->{new.out_features}")
    m = min(hid, new.hidden)
    new.fc1.weight[:m].copy_(fc1.weight[:m].view_as(new.fc1.weight[:m]))
    if new.fc1.bias is not None and fc1.bias is not None:
        new.fc1.bias[:m].copy_(fc1.bias[:m])
    if zero_rest:
        new.fc2.weight.zero_()
    new.fc2.weight[:, :m].copy_(fc2.weight[:, :m].view_as(new.fc2.weight[:, :m]))
    if new.fc2.bias is not None and fc2.bias is not None:
        new.fc2.bias.copy_(fc2.bias)


def agelu_parameter_names(model: nn.Module) -> list[str]:
    """Names (as in ``model.named_parameters()``) of every learnable AGeLU a, b, c, d: the list to subtract
    from transformers' ``Trainer.get_decay_parameter_names``, whose name-based rule decays them."""
    return [f"{mod_name}.{p_name}" if mod_name else p_name
            for mod_name, mod in model.named_modules() if isinstance(mod, AGeLU)
            for p_name, _ in mod.named_parameters(recurse=False)]


def agelu_shifts(model: nn.Module, *, channel_only: bool = True) -> dict[str, torch.Tensor]:
    """The learned shifts c of every learnable AGeLU in ``model``: ``{module name: (n, C') tensor}`` (detached
    copies; ``(n, 1)`` for scalar parameters). ``channel_only`` skips the spatial branch's single AGeLU
    (``*.spatial_act``), keeping the multi-instance channel-path activations."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, AGeLU) and isinstance(mod.c, nn.Parameter):
            if channel_only and name.split(".")[-1] == "spatial_act":
                continue
            out[name] = mod.per_instance("c").detach().clone()
    return out


def agelu_shift_spread(model: nn.Module, *, channel_only: bool = True) -> dict[str, object]:
    """Spread of the learned shifts c (see :func:`agelu_shifts`) over all channels of all AGeLU layers:
    ``std``, ``min``, ``max``, ``iqr`` of c; ``moved_std``/``moved_max_abs`` of c minus its init; and per
    instance k the mean and std of c_k (layers with the same n only, else omitted). Empty dict if none."""
    shifts = agelu_shifts(model, channel_only=channel_only)
    if not shifts:
        return {}
    mods = dict(model.named_modules())
    c = torch.cat([t.flatten() for t in shifts.values()]).double()
    moved = torch.cat([(t - mods[k].initial_shifts()).flatten() for k, t in shifts.items()]).double()
    q = torch.quantile(c, torch.tensor([0.25, 0.75], dtype=c.dtype))
    out: dict[str, object] = {
        "n_layers": len(shifts), "n_values": int(c.numel()), "mean": float(c.mean()),
        "std": float(c.std(unbiased=False)), "min": float(c.min()), "max": float(c.max()),
        "iqr": float(q[1] - q[0]), "moved_std": float(moved.std(unbiased=False)),
        "moved_max_abs": float(moved.abs().max())}
    ns = {t.shape[0] for t in shifts.values()}
    if len(ns) == 1:
        per = torch.cat([t.double() for t in shifts.values()], dim=1)  # (n, Σ C')
        out["per_instance_mean"] = per.mean(1).tolist()
        out["per_instance_std"] = per.std(1, unbiased=False).tolist()
    return out

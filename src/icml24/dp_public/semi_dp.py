"""Semi-DP SGD: "Optimal Differentially Private Model Training with Public Data" (Lowy et al., ICML 2024).

arXiv: 2306.15056 · official code: optimization-for-data-driven-science/DP-with-public-data
(``optimizer/semi_dp_optimizer.py``, "Algorithm 1" of its README).

One step mixes a DP-SGD gradient of a Poisson-sampled private batch with a public-batch gradient:

    g_priv = (1/b) [ Σ_{i in B_priv} clip_C(∇ℓ(w; x_i)) + N(0, σ² C² I) ]      (b = expected batch size)
    g_pub  = (1/|B_pub|) Σ_{i in B_pub} clip_C(∇ℓ(w; x_i))                     (clipping optional)
    w     <- w − η (β g_priv + (1 − β) g_pub).

Only the private batches touch the privacy accountant (Opacus RDP/PRV accountant, extra ``dp``).
Per-sample gradients come from ``torch.func`` (vmap of grad).

Neighbouring relation: add/remove one private record by default (Poisson subsampling, as Opacus accounts it;
the clipped sum's sensitivity is C and it is divided by a declared public constant b, never by the realised or
the data set's size, which are private under add/remove); ``neighbouring="replace_one"`` (full batch only,
q = 1, where n is public) calibrates the noise to the sensitivity 2C. The mean estimators of
:mod:`icml24.dp_public.mean_estimation` use replace-one. No exception depends on a
private value: non-finite private inputs/targets are set to 0 and a private per-sample gradient with a
non-finite entry is replaced by the zero gradient (both fixed rules applied to every record), so the
clipped contribution of each record still has norm <= C.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from icml24.common import validate as v

__all__ = [
    "per_sample_grads",
    "clip_and_sum",
    "sanitize_grad_samples",
    "SemiDPSGD",
    "ReproducibleNoiseWarning",
    "OpacusWrappingError",
    "make_public_only_sgd",
    "make_dp_sgd",
    "noise_multiplier_for",
    "epsilon_for",
    "inverse_variance_beta",
    "poisson_sample",
    "TrainResult",
    "train_semi_dp",
]

AccountantName = Literal["rdp", "prv"]
Neighbouring = Literal["add_remove", "replace_one"]
_CLIP_EPS = 1e-6  # same stabiliser as Opacus' DPOptimizer.clip_and_accumulate


def _import_opacus():
    try:
        import opacus  # noqa: F401
        from opacus.accountants.registry import create_accountant
        from opacus.accountants.utils import get_noise_multiplier
    except ImportError as e:  # pragma: no cover - opacus is installed in the dev environment
        raise ImportError("dp_public: privacy accounting needs Opacus; install it with "
                          "`pip install icml24[dp]`") from e
    return create_accountant, get_noise_multiplier


class ReproducibleNoiseWarning(UserWarning):
    """The privacy noise is drawn from a caller-supplied ``torch.Generator``: anyone who knows its seed (or its
    state) can recompute the noise and subtract it, so the release is not private. Pass ``generator=None`` (the
    global generator, which is seeded from OS entropy unless the program seeds it) or a secretly seeded
    generator for a real release; a fixed seed is for experiments and tests only. Same pattern as
    :class:`icml24.private_density.ReproducibleNoiseWarning`."""


class OpacusWrappingError(ValueError):
    """A :class:`SemiDPSGD` was wrapped in an Opacus ``DPOptimizer`` (e.g. ``PrivacyEngine().make_private(...,
    optimizer=SemiDPSGD(...))``), which would clip and noise the private gradients a second time and charge a
    second accountant."""


_OPACUS_WRAPPED = ("SemiDPSGD.step: this optimizer is wrapped in an Opacus DPOptimizer (e.g. by "
                   "PrivacyEngine().make_private(..., optimizer=SemiDPSGD(...))), which clips and noises the private "
                   "gradients a second time and charges its own accountant, so neither epsilon would describe the "
                   "run. SemiDPSGD does its own clipping, noise and accounting: wrap only the model, "
                   "opacus.GradSampleModule(model, loss_reduction='mean'), and call opt.capture_public() after the "
                   "public backward pass and opt.step() after the private one (see the dp_public README)")


def _warn_reproducible(owner: str, generator: object, noise_multiplier: float, stacklevel: int = 3) -> None:
    if generator is not None and noise_multiplier > 0:
        warnings.warn(f"{owner}: the privacy noise is drawn from a caller-supplied torch.Generator, so anyone who "
                      "knows its seed or state can recompute it and the release is not private; use "
                      "generator=None (or a secretly seeded generator) for a real release",
                      ReproducibleNoiseWarning, stacklevel=stacklevel)


def _check_accountant(where: str, accountant: object, *, allow_none: bool = False) -> None:
    """"rdp" or "prv" (or None when allowed). "gdp" is refused: Opacus' Gaussian-DP accountant is a central-limit
    approximation that can under-estimate ε (Opacus itself warns "GDP accounting is experimental and can
    underestimate privacy expenditure", arXiv:2106.02848), so it cannot back the (ε, δ) guarantee promised here."""
    if accountant == "gdp":
        raise ValueError(f"{where}: accountant='gdp' is refused: Gaussian-DP accounting is a central-limit "
                         "approximation that can under-estimate epsilon (Opacus warns the same), so it does not "
                         "give the (epsilon, delta) guarantee documented here; use 'rdp' or 'prv'")
    v.one_of(where, "accountant", accountant, ("rdp", "prv", None) if allow_none else ("rdp", "prv"))


def _check_accounting(where: str, *, sample_rate: float, steps: int, accountant: str) -> None:
    v.in_range(where, "sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    v.integer(where, "steps", steps, minimum=1)
    _check_accountant(where, accountant)


# ------------------------------------------------------------------------------------ per-sample gradients
def per_sample_grads(model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """Per-sample gradients ∇_w ℓ(w; x_i, y_i) of every trainable parameter, via ``torch.func.vmap(grad)``.

    Args:
        model: the network; must not mix samples in its forward pass (no BatchNorm in train mode).
        loss_fn: ``loss_fn(outputs, targets)`` on a batch of one sample, returning a scalar.
        inputs: (B, ...) inputs.
        targets: (B, ...) targets.

    Returns:
        One tensor of shape (B, *p.shape) per trainable parameter, in ``model.parameters()`` order.
    """
    v.tensor("per_sample_grads", "inputs", inputs)
    v.tensor("per_sample_grads", "targets", targets)
    v.same_length("per_sample_grads", ("inputs", "targets"), inputs.shape[0], targets.shape[0])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    if inputs.shape[0] == 0:
        return [params[n].new_zeros((0, *params[n].shape)) for n in names]

    def loss_one(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return loss_fn(out, y.unsqueeze(0))

    g = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, inputs, targets)
    return [g[n] for n in names]


def clip_and_sum(grad_samples: Sequence[torch.Tensor], *, max_grad_norm: float) -> list[torch.Tensor]:
    """Σ_i clip_C(g_i): each sample's gradient (across all parameters) scaled by min(1, C / (||g_i|| + 1e-6)).

    Args:
        grad_samples: one (B, *p.shape) tensor per parameter.
        max_grad_norm: C > 0.
    """
    v.positive("clip_and_sum", "max_grad_norm", max_grad_norm)
    b = grad_samples[0].shape[0]
    if b == 0:
        return [g.new_zeros(g.shape[1:]) for g in grad_samples]
    norms = torch.stack([g.reshape(b, -1).norm(2, dim=-1) for g in grad_samples], dim=1).norm(2, dim=1)
    factor = (max_grad_norm / (norms + _CLIP_EPS)).clamp(max=1.0)
    return [torch.einsum("i,i...", factor.to(g.dtype), g) for g in grad_samples]


def sanitize_grad_samples(grad_samples: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per-sample gradients with every sample that has a non-finite entry (in any parameter) replaced by zeros.

    The rule applied to private per-sample gradients before clipping (no exception on a private value); it acts
    on each sample separately, so it keeps the per-record sensitivity of the clipped sum.

    Args:
        grad_samples: one (B, *p.shape) tensor per parameter.
    """
    b = grad_samples[0].shape[0]
    if b == 0:
        return list(grad_samples)
    ok = torch.ones(b, dtype=torch.bool, device=grad_samples[0].device)
    for g in grad_samples:
        ok &= torch.isfinite(g.reshape(b, -1)).all(dim=1)
    out = []
    for g in grad_samples:
        mask = ok.reshape((b,) + (1,) * (g.dim() - 1))
        out.append(torch.where(mask, g, torch.zeros((), dtype=g.dtype, device=g.device)))
    return out


# ------------------------------------------------------------------------------------------------ optimizer
class SemiDPSGD(torch.optim.Optimizer):
    """Semi-DP SGD (Lowy et al. 2024, Alg. 1 of the official code): w <- w − η (β g_priv + (1 − β) g_pub).

    ``step(private_grad_samples=..., public_grad_samples=...)`` takes per-sample gradients (e.g. from
    :func:`per_sample_grads`). With both given the update mixes them with weight β; with only private ones it
    is a plain DP-SGD step (baseline "treat public as private" when the private batch is drawn from all data);
    with only public ones it is a non-private step on public data (baseline "throw away private data").

    Privacy guarantee: let every private batch be drawn by Poisson sampling with rate ``sample_rate`` from a
    fixed private data set, let every per-sample gradient depend on one private example only (no
    cross-sample layers such as BatchNorm), and let σ, C, q be fixed. Then after T steps that received private
    gradients, the sequence of iterates is (ε, δ)-DP w.r.t. the private data set, for every fixed public data
    set (semi-DP), with ε = :meth:`get_epsilon` (δ) from the Opacus accountant (Gaussian mechanism, Poisson
    subsampling, adaptive composition). Public data, β, and hyper-parameter search are not accounted for.

    Args:
        params: parameters to optimise.
        lr: η > 0.
        beta: β in [0, 1], weight of the private gradient (1 = DP-SGD step, 0 = public step).
        noise_multiplier: σ >= 0 (noise std σ C on the clipped sum).
        max_grad_norm: C > 0, per-sample clipping norm.
        expected_batch_size: b >= 1, a public constant: the private sum is divided by b (Opacus
            ``loss_reduction="mean"``), whatever the realised batch size (which is private).
        sample_rate: q in (0, 1], Poisson sampling rate of the private batches (for the accountant).
        clip_public: clip public per-sample gradients to C too (official code: yes).
        momentum: heavy-ball momentum in [0, 1) applied to the mixed gradient.
        weight_decay: L2 weight decay >= 0 added to the mixed gradient.
        accountant: ``"rdp"`` or ``"prv"`` (Opacus; both are upper bounds on ε) or ``None`` (no accounting).
            ``"gdp"`` is refused with a ``ValueError``: Gaussian-DP accounting is a central-limit approximation
            that can under-estimate ε (Opacus warns the same), so it cannot back an (ε, δ) guarantee.
        generator: torch generator for the noise (on the parameters' device); ``None`` uses the global one.
            A generator (with σ > 0) raises a :class:`ReproducibleNoiseWarning`: its seed reproduces the noise.
            Its state is saved by :meth:`state_dict`, so a resumed run continues the noise stream instead of
            replaying it.
        neighbouring: ``"add_remove"`` (default; the clipped sum has L2 sensitivity C, noise std σC) or
            ``"replace_one"`` (sensitivity 2C, noise std 2σC; only with ``sample_rate=1``, i.e. full batches of
            a data set whose size is public: the Opacus accountants' Poisson subsampling is add/remove).

    Raises:
        OpacusWrappingError: from :meth:`step`, when the optimizer runs inside an Opacus ``DPOptimizer``.
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict], *, lr: float, beta: float,
                 noise_multiplier: float, max_grad_norm: float, expected_batch_size: int, sample_rate: float,
                 clip_public: bool = True, momentum: float = 0.0, weight_decay: float = 0.0,
                 accountant: AccountantName | None = "rdp", generator: torch.Generator | None = None,
                 neighbouring: Neighbouring = "add_remove") -> None:
        w = "SemiDPSGD"
        v.positive(w, "lr", lr)
        v.probability(w, "beta", beta)
        v.non_negative(w, "noise_multiplier", noise_multiplier)
        v.positive(w, "max_grad_norm", max_grad_norm)
        v.integer(w, "expected_batch_size", expected_batch_size, minimum=1)
        v.in_range(w, "sample_rate", sample_rate, 0.0, 1.0, low_open=True)
        v.in_range(w, "momentum", momentum, 0.0, 1.0, high_open=True)
        v.non_negative(w, "weight_decay", weight_decay)
        _check_accountant(w, accountant, allow_none=True)
        v.one_of(w, "neighbouring", neighbouring, ("add_remove", "replace_one"))
        if neighbouring == "replace_one" and sample_rate != 1.0:
            raise ValueError(f"{w}: neighbouring='replace_one' needs sample_rate=1 (full batches), got {sample_rate}: "
                             "the Opacus accountants' Poisson subsampling is analysed under add/remove neighbours")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"{w}: generator must be a torch.Generator or None, got {type(generator).__name__}")
        _warn_reproducible(w, generator, noise_multiplier)
        super().__init__(params, {"lr": float(lr), "momentum": float(momentum),
                                  "weight_decay": float(weight_decay)})
        self.beta = float(beta)
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.expected_batch_size = int(expected_batch_size)
        self.sample_rate = float(sample_rate)
        self.clip_public = bool(clip_public)
        self.generator = generator
        self.neighbouring = neighbouring
        # L2 sensitivity of the clipped sum: C under add/remove, 2C under replace-one (x_i -> x_i')
        self.sensitivity = self.max_grad_norm * (2.0 if neighbouring == "replace_one" else 1.0)
        self.private_steps = 0
        self.accountant = None
        if accountant is not None:
            create_accountant, _ = _import_opacus()
            self.accountant = create_accountant(accountant)

    @property
    def params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _check_grads(self, gs: Sequence[torch.Tensor], name: str, *, private: bool = False) -> int:
        """Shapes always; values (NaN/inf) only for public gradients (a private value must never raise)."""
        ps = self.params
        if len(gs) != len(ps):
            raise ValueError(f"SemiDPSGD.step: {name} has {len(gs)} tensors but the optimizer has {len(ps)} "
                             "parameters")
        b = gs[0].shape[0] if gs[0].dim() else -1
        for i, (g, p) in enumerate(zip(gs, ps, strict=True)):
            if tuple(g.shape[1:]) != tuple(p.shape) or g.shape[0] != b:
                raise ValueError(f"SemiDPSGD.step: {name}[{i}] must have shape (B, *{tuple(p.shape)}) with a "
                                 f"common B, got {tuple(g.shape)}")
            if not private and not torch.isfinite(g).all():
                raise ValueError(f"SemiDPSGD.step: {name}[{i}] contains NaN or inf")
        return b

    def private_gradient(self, private_grad_samples: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """g_priv = (Σ clip_C(s(g_i)) + N(0, σ² Δ² I)) / b: clip, noise (one draw per parameter, in order), scale.

        s(g_i) is the fixed rule applied to every private sample: g_i itself when all its entries (across all
        parameters) are finite, the zero gradient otherwise. A record's contribution has norm <= C either way,
        so the sensitivity Δ of the clipped sum (C add/remove, 2C replace-one) holds for any private data. b is
        the public ``expected_batch_size``, never the realised batch size (Opacus #420).
        """
        private_grad_samples = sanitize_grad_samples(private_grad_samples)
        summed = clip_and_sum(private_grad_samples, max_grad_norm=self.max_grad_norm)
        std = self.noise_multiplier * self.sensitivity
        out = []
        for s in summed:
            if std > 0:
                noise = torch.normal(mean=0.0, std=std, size=s.shape, device=s.device, generator=self.generator,
                                     dtype=s.dtype)
                s = s + noise
            out.append(s / self.expected_batch_size)
        return out

    def public_gradient(self, public_grad_samples: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """g_pub = mean_i clip_C(g_i) (or the unclipped mean when ``clip_public=False``)."""
        b = public_grad_samples[0].shape[0]
        if b == 0:
            raise ValueError("SemiDPSGD.step: public_grad_samples has an empty batch")
        if self.clip_public:
            summed = clip_and_sum(public_grad_samples, max_grad_norm=self.max_grad_norm)
        else:
            summed = [g.sum(0) for g in public_grad_samples]
        return [s / b for s in summed]

    @torch.no_grad()
    def step(self, closure: None = None, *, private_grad_samples: Sequence[torch.Tensor] | None = None,
             public_grad_samples: Sequence[torch.Tensor] | None = None) -> None:
        """One update; see the class docstring. Validates every input before changing any state.

        Opacus convention: called with no per-sample arguments (a plain ``optimizer.step()``), the private
        per-sample gradients are read from ``p.grad_sample`` (set by an Opacus ``GradSampleModule`` on the
        backward pass of the private batch; use ``loss_reduction="mean"`` there with a mean loss, or "sum"
        with a summed loss, so that ``grad_sample`` holds per-sample gradients of the per-sample losses) and
        the public ones from :meth:`capture_public`; both are cleared after the step.
        """
        if closure is not None:
            raise TypeError("SemiDPSGD.step: closures are not supported; pass per-sample gradients")
        # inside an Opacus DPOptimizer.step, clip_and_accumulate has just set p.summed_grad (a structural fact of
        # the wrapping, not a property of any record): refuse before any state changes
        if any(isinstance(getattr(p, "summed_grad", None), torch.Tensor) for p in self.params):
            raise OpacusWrappingError(_OPACUS_WRAPPED)
        from_module = private_grad_samples is None and public_grad_samples is None
        if from_module:
            private_grad_samples = self._read_grad_samples()
            public_grad_samples = self._public_stash
        if private_grad_samples is None and public_grad_samples is None:
            raise ValueError("SemiDPSGD.step: pass private_grad_samples, public_grad_samples or both (or run a "
                             "backward pass through an Opacus GradSampleModule first)")
        if private_grad_samples is not None:
            self._check_grads(private_grad_samples, "private_grad_samples", private=True)
        if public_grad_samples is not None:
            self._check_grads(public_grad_samples, "public_grad_samples")
        g_priv = self.private_gradient(private_grad_samples) if private_grad_samples is not None else None
        g_pub = self.public_gradient(public_grad_samples) if public_grad_samples is not None else None
        if g_priv is not None and g_pub is not None:
            mixed = [self.beta * a + (1.0 - self.beta) * b for a, b in zip(g_priv, g_pub, strict=True)]
        else:
            mixed = g_priv if g_priv is not None else g_pub
        i = 0
        for group in self.param_groups:
            lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                d = mixed[i]
                i += 1
                if wd:
                    d = d.add(p, alpha=wd)
                if mom:
                    st = self.state[p]
                    buf = st.get("momentum_buffer")
                    if buf is None:
                        buf = st["momentum_buffer"] = d.clone()
                    else:
                        buf.mul_(mom).add_(d)
                    d = buf
                p.add_(d, alpha=-lr)
        if private_grad_samples is not None:
            self.private_steps += 1
            if self.accountant is not None:
                self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)
        if from_module:
            self._clear_grad_samples()

    # ---------------------------------------------------------------------------- Opacus grad_sample path
    def _read_grad_samples(self) -> list[torch.Tensor] | None:
        gs = [getattr(p, "grad_sample", None) for p in self.params]
        if all(g is None for g in gs):
            return None
        if any(g is None for g in gs) or any(not isinstance(g, torch.Tensor) for g in gs):
            raise ValueError("SemiDPSGD.step: every parameter of the optimizer needs a tensor p.grad_sample (one "
                             "backward pass through an Opacus GradSampleModule; pass only trainable parameters)")
        return gs

    def _clear_grad_samples(self) -> None:
        for p in self.params:
            if hasattr(p, "grad_sample"):
                p.grad_sample = None
        self._public_stash = None

    _public_stash: list[torch.Tensor] | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``torch.optim.Optimizer.zero_grad`` that also clears ``p.grad_sample`` and the captured public
        gradients (as Opacus' ``DPOptimizer.zero_grad``), so per-sample gradients never leak into the next step."""
        super().zero_grad(set_to_none=set_to_none)
        self._clear_grad_samples()

    def capture_public(self) -> None:
        """Move the current ``p.grad_sample`` (from a backward pass of the *public* batch through an Opacus
        ``GradSampleModule``) aside as the public per-sample gradients of the next plain ``step()``; the
        private batch's backward pass then fills ``p.grad_sample`` again."""
        gs = self._read_grad_samples()
        if gs is None:
            raise ValueError("SemiDPSGD.capture_public: no p.grad_sample to capture; run the public batch's "
                             "backward pass through an Opacus GradSampleModule first")
        self._check_grads(gs, "public grad_sample")
        self._public_stash = [g.detach().clone() for g in gs]
        for p in self.params:
            p.grad_sample = None

    def get_epsilon(self, delta: float) -> float:
        """ε spent so far on the private data at this δ (Opacus accountant; 0 before any private step)."""
        v.probability("SemiDPSGD.get_epsilon", "delta", delta, open_low=True, open_high=True)
        if self.accountant is None:
            raise ValueError("SemiDPSGD.get_epsilon: this optimizer was built with accountant=None")
        if self.private_steps == 0:
            return 0.0
        return float(self.accountant.get_epsilon(delta=delta))

    def state_dict(self) -> dict:
        """The optimizer state plus the privacy spend: the private step count, the accountant's history and the
        noise generator's state.

        A resumed run that loads this reports the ε of the whole run, as Opacus checkpoints do (without it a
        resumed optimizer would restart its accounting at ε = 0), and continues the noise stream where it
        stopped (without it a re-created seeded generator would replay the pre-checkpoint noise, and two
        steps with the same noise are not independent Gaussian mechanisms).
        """
        state = super().state_dict()
        state["privacy"] = {"private_steps": self.private_steps,
                            "accountant": None if self.accountant is None else self.accountant.state_dict(),
                            "generator": None if self.generator is None else self.generator.get_state()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load :meth:`state_dict`; refuses a state without the privacy spend or from another accountant.

        The saved generator state is loaded into this optimizer's generator (when both exist). A state saved
        without one (an older checkpoint) is refused when this optimizer has a generator: its noise would start
        again from the generator's seed and replay the noise of the first steps.
        """
        state = dict(state_dict)
        privacy = state.pop("privacy", None)
        if privacy is None:
            raise ValueError("SemiDPSGD.load_state_dict: the state has no 'privacy' entry (private step count and "
                             "accountant history); loading it would under-report ε")
        acc = privacy.get("accountant")
        if (acc is None) != (self.accountant is None):
            raise ValueError("SemiDPSGD.load_state_dict: the saved optimizer and this one disagree on whether "
                             "an accountant is used")
        if acc is not None and acc.get("mechanism") != self.accountant.mechanism():
            raise ValueError(f"SemiDPSGD.load_state_dict: saved accountant {acc.get('mechanism')!r} != this "
                             f"optimizer's {self.accountant.mechanism()!r}")
        if self.generator is not None and "generator" not in privacy:
            raise ValueError("SemiDPSGD.load_state_dict: the state has no generator state (a checkpoint from an "
                             "older version); this optimizer's generator would replay the noise of the steps "
                             "before the checkpoint; load it into an optimizer built with generator=None and assign a "
                             "freshly (secretly) seeded generator afterwards")
        gen_state = privacy.get("generator")
        super().load_state_dict(state)
        self.private_steps = int(privacy["private_steps"])
        if acc is not None:
            self.accountant.load_state_dict(acc)
        if gen_state is not None and self.generator is not None:
            self.generator.set_state(gen_state)


def make_public_only_sgd(params: Iterable[torch.Tensor], *, lr: float, clip_norm: float | None = None,
                         momentum: float = 0.0) -> SemiDPSGD:
    """Baseline "throw away the private data": SGD on public gradients only (β = 0, no noise, no accountant).

    Privacy: the private data is never used, so the output is (0, 0)-DP w.r.t. it. Call ``step`` with
    ``public_grad_samples`` only. ``clip_norm=None`` averages unclipped gradients (official ``throw_away_sgd``).
    """
    return SemiDPSGD(params, lr=lr, beta=0.0, noise_multiplier=0.0,
                     max_grad_norm=clip_norm if clip_norm is not None else 1.0, expected_batch_size=1,
                     sample_rate=1.0, clip_public=clip_norm is not None, momentum=momentum, accountant=None)


def make_dp_sgd(params: Iterable[torch.Tensor], *, lr: float, noise_multiplier: float, max_grad_norm: float,
                expected_batch_size: int, sample_rate: float, momentum: float = 0.0,
                accountant: AccountantName | None = "rdp", generator: torch.Generator | None = None,
                neighbouring: Neighbouring = "add_remove") -> SemiDPSGD:
    """DP-SGD (β = 1). Call ``step`` with ``private_grad_samples`` only; for the baseline "treat public as
    private" draw the Poisson batches from the union of public and private data.

    Privacy: as :class:`SemiDPSGD` with the data set being every sample the batches are drawn from.
    """
    return SemiDPSGD(params, lr=lr, beta=1.0, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
                     expected_batch_size=expected_batch_size, sample_rate=sample_rate, momentum=momentum,
                     accountant=accountant, generator=generator, neighbouring=neighbouring)


# -------------------------------------------------------------------------------------------- accounting
def noise_multiplier_for(*, target_epsilon: float, target_delta: float, sample_rate: float, steps: int,
                         accountant: AccountantName = "rdp", epsilon_tolerance: float = 0.01) -> float:
    """Smallest σ (Opacus ``get_noise_multiplier``) with ε(σ, q, T, δ) <= target ε; re-checked afterwards
    (Opacus issues #346/#348: the binary search must not overshoot).

    Raises:
        ValueError: the target is below what the accountant can certify at any σ; for ``"rdp"`` (whose
            conversion to (ε, δ) has a floor set by its largest Rényi order, about 0.1 at δ = 1e-5) the error
            names ``accountant="prv"``, which reaches smaller ε.
    """
    where = "noise_multiplier_for"
    v.privacy_budget(where, target_epsilon, target_delta, epsilon_name="target_epsilon",
                     delta_name="target_delta")
    _check_accounting(where, sample_rate=sample_rate, steps=steps, accountant=accountant)
    v.in_range(where, "epsilon_tolerance", epsilon_tolerance, 0.0, target_epsilon, low_open=True, high_open=True)
    return _noise_multiplier_cached(float(target_epsilon), float(target_delta), float(sample_rate), int(steps),
                                    accountant, float(epsilon_tolerance))


@functools.lru_cache(maxsize=256)
def _noise_multiplier_cached(target_epsilon: float, target_delta: float, sample_rate: float, steps: int,
                             accountant: str, epsilon_tolerance: float) -> float:
    _, get_noise_multiplier = _import_opacus()
    try:
        sigma = float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=target_delta,
                                           sample_rate=sample_rate, steps=steps, accountant=accountant,
                                           epsilon_tolerance=epsilon_tolerance))
    except ValueError as e:
        if "too low" not in str(e):
            raise
        hint = ('; the RDP accountant\'s conversion to (epsilon, delta) has a floor set by its largest Renyi order: '
                'use accountant="prv", which reaches smaller epsilon' if accountant == "rdp"
                else "; raise target_epsilon, target_delta or lower sample_rate or steps")
        raise ValueError(f"noise_multiplier_for: target_epsilon={target_epsilon} cannot be reached by the "
                         f"{accountant!r} accountant at any noise multiplier (delta={target_delta}, "
                         f"sample_rate={sample_rate}, steps={steps}){hint}") from e
    while epsilon_for(noise_multiplier=sigma, sample_rate=sample_rate, steps=steps, delta=target_delta,
                      accountant=accountant) > target_epsilon:
        sigma *= 1.01
    return sigma


def epsilon_for(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                accountant: AccountantName = "rdp") -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian steps (σ, q) at δ, from the Opacus accountant."""
    where = "epsilon_for"
    v.probability(where, "delta", delta, open_low=True, open_high=True)
    _check_accounting(where, sample_rate=sample_rate, steps=steps, accountant=accountant)
    v.positive(where, "noise_multiplier", noise_multiplier)
    create_accountant, _ = _import_opacus()
    acc = create_accountant(accountant)
    acc.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    return float(acc.get_epsilon(delta=delta))


def inverse_variance_beta(*, dim: int, noise_multiplier: float, max_grad_norm: float, batch_size: int,
                          public_batch_size: int) -> float:
    """Heuristic β from inverse-variance weighting of the two gradient estimators (mirrors r* of mean estimation).

    Var_pub ≈ C² / b_pub, Var_priv ≈ C² / b + d σ² C² / b²; β = Var_pub / (Var_pub + Var_priv).
    NOTE(deviation): the paper's theory choice of β is not available here; this proxy bounds each gradient's
    sampling variance by C² and ignores the bias from clipping and from public/private distribution shift.
    """
    w = "inverse_variance_beta"
    for name, k in (("dim", dim), ("batch_size", batch_size), ("public_batch_size", public_batch_size)):
        v.integer(w, name, k, minimum=1)
    v.positive(w, "max_grad_norm", max_grad_norm)
    v.non_negative(w, "noise_multiplier", noise_multiplier)
    c2 = max_grad_norm**2
    v_pub = c2 / public_batch_size
    v_priv = c2 / batch_size + dim * noise_multiplier**2 * c2 / batch_size**2
    return float(v_pub / (v_pub + v_priv))


def poisson_sample(n: int, *, sample_rate: float, generator: torch.Generator | None = None,
                   device: str | torch.device = "cpu") -> torch.Tensor:
    """Indices of a Poisson-subsampled batch: each of n examples is included independently with prob. q."""
    v.integer("poisson_sample", "n", n, minimum=0)
    v.in_range("poisson_sample", "sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    if sample_rate >= 1.0:
        return torch.arange(n, device=device)
    mask = torch.rand(n, generator=generator, device=device) < sample_rate
    return mask.nonzero().flatten()


# ------------------------------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    """Output of :func:`train_semi_dp`: the trained model, ε spent (None when no private data was used),
    σ and the number of steps."""

    model: nn.Module
    epsilon: float | None
    noise_multiplier: float
    steps: int


def train_semi_dp(model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                  mode: Literal["semi_dp", "public_only", "dp_sgd_all"], x_priv: torch.Tensor,
                  y_priv: torch.Tensor, x_pub: torch.Tensor, y_pub: torch.Tensor, epsilon: float, delta: float,
                  steps: int, lr: float, beta: float = 0.5, max_grad_norm: float = 1.0,
                  batch_size: int | None = None, expected_batch_size: int | None = None,
                  neighbouring: Neighbouring = "add_remove", public_batch_size: int | None = None,
                  clip_public: bool = True, momentum: float = 0.0, accountant: AccountantName = "rdp",
                  generator: torch.Generator | None = None,
                  grad_sample_fn: Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]] | None = None
                  ) -> TrainResult:
    """Train ``model`` in place with semi-DP SGD or one of its two baselines, at a target (ε, δ).

    Modes: ``semi_dp`` (Poisson private batches + public batches mixed with β), ``public_only`` (public SGD,
    private data discarded), ``dp_sgd_all`` (DP-SGD with Poisson batches from the union of public and private
    data: the public data treated as private). σ is calibrated with :func:`noise_multiplier_for` for
    (ε, δ, q = b/n, T = ``steps``).

    Batches and normalisation: with ``batch_size=b`` each step draws a Poisson batch with q = b/n from the n
    rows the noisy batch comes from (n_priv, or n_priv + n_pub for ``dp_sgd_all``; q computed from n as
    Opacus' ``DPDataLoader`` does) and divides the noisy sum by b. Full batch (``batch_size=None``, q = 1)
    depends on ``neighbouring``: under ``"add_remove"`` (default) the data set's size is private, so dividing
    by len(x_priv) would release it (Opacus #571/#819): declare a public ``expected_batch_size`` (e.g. the
    planned size of the data set) and the sum is divided by it; without one full batch is refused. Under
    ``"replace_one"`` (full batch only) n is public, the sum is divided by ``expected_batch_size`` or n, and
    the noise is calibrated to the replace-one sensitivity 2C (std 2σC).

    Privacy: ``semi_dp`` and ``dp_sgd_all`` are (ε, δ)-DP w.r.t. the private data (semi-DP, for the declared
    ``neighbouring`` relation) under the preconditions of :class:`SemiDPSGD` (per-example losses, Poisson
    sampling or full batches, fixed σ, C, q); ``public_only`` does not touch it. A ``generator`` raises a
    :class:`ReproducibleNoiseWarning` (for experiments only). Hyper-parameter selection on data is not accounted for.
    Private values never raise: non-finite entries of floating ``x_priv``/``y_priv`` are set to 0 (a fixed
    rule on every entry) and non-finite private per-sample gradients to 0 (:func:`sanitize_grad_samples`);
    public data with NaN/inf is refused.

    Args:
        model: network on the device of the data; trained in place.
        loss_fn: per-sample loss ``loss_fn(outputs, targets)`` (batch of one) -> scalar.
        mode: see above.
        x_priv, y_priv: private data (n_priv, ...) / (n_priv, ...).
        x_pub, y_pub: public data with the same feature shape.
        epsilon: target ε > 0; delta: δ in (0, 1).
        steps: T >= 1 iterations.
        lr: η > 0.
        beta: β in [0, 1] (``semi_dp`` only).
        max_grad_norm: C > 0.
        batch_size: expected private batch size b of Poisson batches (``None``: full batch, q = 1).
        expected_batch_size: the public normaliser b of full batches (required for full batch under
            add/remove; with ``batch_size`` it must equal it or be ``None``).
        neighbouring: ``"add_remove"`` or ``"replace_one"`` (full batch only); see above.
        public_batch_size: public batch size (``None``: all public data).
        clip_public: clip public per-sample gradients to C.
        momentum, accountant, generator: passed to :class:`SemiDPSGD`; ``generator`` drives sampling and noise.
        grad_sample_fn: ``grad_sample_fn(x, y)`` -> the per-sample gradients of the trainable parameters (in
            ``model.parameters()`` order) at the model's current weights; default :func:`per_sample_grads` with
            ``loss_fn``. A closed form (e.g. for a linear model) skips torch.func's per-call overhead; it must
            equal the default (the privacy analysis only needs each record's gradient to be clipped).
    """
    where = "train_semi_dp"
    v.one_of(where, "mode", mode, ("semi_dp", "public_only", "dp_sgd_all"))
    v.privacy_budget(where, epsilon, delta)
    _check_accountant(where, accountant)
    v.probability(where, "beta", beta)
    v.positive(where, "max_grad_norm", max_grad_norm)
    v.integer(where, "steps", steps, minimum=1)
    for name, t in (("x_priv", x_priv), ("y_priv", y_priv), ("x_pub", x_pub), ("y_pub", y_pub)):
        v.tensor(where, name, t)
    for name, t in (("x_pub", x_pub), ("y_pub", y_pub)):  # public: a value check is allowed
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise ValueError(f"{where}: {name} contains NaN or inf")
    if x_pub.shape[1:] != x_priv.shape[1:]:
        raise ValueError(f"{where}: public data has feature shape {tuple(x_pub.shape[1:])} but private data has "
                         f"{tuple(x_priv.shape[1:])}")
    v.same_length(where, ("x_pub", "y_pub"), len(x_pub), len(y_pub))
    v.same_length(where, ("x_priv", "y_priv"), len(x_priv), len(y_priv))
    if len(x_pub) == 0 or len(x_priv) == 0:
        raise ValueError(f"{where}: public and private data must be non-empty")
    if public_batch_size is not None:
        v.integer(where, "public_batch_size", public_batch_size, minimum=1)
    v.one_of(where, "neighbouring", neighbouring, ("add_remove", "replace_one"))
    if expected_batch_size is not None:
        v.integer(where, "expected_batch_size", expected_batch_size, minimum=1)
    if batch_size is not None:
        v.integer(where, "batch_size", batch_size, minimum=1)
        if neighbouring == "replace_one":
            raise ValueError(f"{where}: neighbouring='replace_one' is for full batches only (batch_size=None): the "
                             "Opacus accountants' Poisson subsampling is analysed under add/remove neighbours")
        if expected_batch_size is not None and expected_batch_size != batch_size:
            raise ValueError(f"{where}: expected_batch_size ({expected_batch_size}) must equal batch_size "
                             f"({batch_size}) or be None: Poisson batches are divided by batch_size")
    elif neighbouring == "add_remove" and expected_batch_size is None and mode != "public_only":
        raise ValueError(f"{where}: full batch (batch_size=None) under neighbouring='add_remove' needs a public "
                         "expected_batch_size: the private data set's size is private under add/remove, and "
                         "dividing by len(x_priv) would release it (Opacus #571); declare expected_batch_size, "
                         "or use neighbouring='replace_one' if the size is public (sensitivity 2C)")
    # private data: a fixed rule on every entry instead of an exception (non-finite -> 0)
    x_priv, y_priv = (torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0) if t.is_floating_point() else t
                      for t in (x_priv, y_priv))

    params = [p for p in model.parameters() if p.requires_grad]
    n_pub = len(x_pub)
    b_pub = n_pub if public_batch_size is None else min(public_batch_size, n_pub)
    if mode == "dp_sgd_all":
        xp, yp = torch.cat([x_priv, x_pub]), torch.cat([y_priv, y_pub])
    else:
        xp, yp = x_priv, y_priv
    n = len(xp)
    if batch_size is None:  # full batch: divide by the declared public constant (or n when n is public)
        b, q = (n if expected_batch_size is None else int(expected_batch_size)), 1.0
    else:
        b = int(batch_size)
        if b > n:
            raise ValueError(f"{where}: batch_size must be in [1, {n}], got {batch_size}")
        q = b / n
    sigma = 0.0
    if mode == "public_only":
        opt = make_public_only_sgd(params, lr=lr, clip_norm=max_grad_norm if clip_public else None,
                                   momentum=momentum)
    else:
        sigma = noise_multiplier_for(target_epsilon=epsilon, target_delta=delta, sample_rate=q, steps=steps,
                                     accountant=accountant)
        _warn_reproducible(where, generator, sigma)
        with warnings.catch_warnings():  # warned once, here, at the caller's line
            warnings.simplefilter("ignore", ReproducibleNoiseWarning)
            opt = SemiDPSGD(params, lr=lr, beta=beta if mode == "semi_dp" else 1.0, noise_multiplier=sigma,
                            max_grad_norm=max_grad_norm, expected_batch_size=b, sample_rate=q,
                            clip_public=clip_public, momentum=momentum, accountant=accountant,
                            generator=generator, neighbouring=neighbouring)
    dev = x_priv.device
    for _ in range(steps):
        xs, ys = [], []
        k = 0  # number of public rows actually stacked first (the split below uses it, never b_pub)
        if mode in ("semi_dp", "public_only"):
            idx = (torch.arange(n_pub, device=dev) if b_pub == n_pub
                   else torch.randperm(n_pub, generator=generator, device=dev)[:b_pub])
            xs.append(x_pub[idx])
            ys.append(y_pub[idx])
            k = int(idx.numel())
        if mode != "public_only":
            idx = poisson_sample(n, sample_rate=q, generator=generator, device=dev)
            xs.append(xp[idx])
            ys.append(yp[idx])
        # one vmap call for both batches; rows [0, k) are public in semi_dp / public_only
        xb, yb = torch.cat(xs), torch.cat(ys)
        gs = per_sample_grads(model, loss_fn, xb, yb) if grad_sample_fn is None else grad_sample_fn(xb, yb)
        pub = [g[:k] for g in gs] if k else None
        priv = [g[k:] for g in gs] if mode != "public_only" else None
        opt.step(private_grad_samples=priv, public_grad_samples=pub)
    eps = opt.get_epsilon(delta) if mode != "public_only" else None
    return TrainResult(model=model, epsilon=eps, noise_multiplier=sigma, steps=steps)

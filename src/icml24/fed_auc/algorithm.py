"""Federated stochastic multi-level compositional minimax for deep AUC maximisation: one client's local step.

Zhang, Payani, Lee, Souvenir, Gao, "A Federated Stochastic Multi-Level Compositional Minimax Algorithm for Deep AUC
Maximization", ICML 2024 (PMLR v235 zhang24aw; no arXiv id, no official code). The local rule is reconstructed from
the authors' two-level LocalSCGDAM (NeurIPS 2023) and LibAUC's PDSCA (notes §2.3, [R]):

    h_1 ← (1−β)h_1 + β(x − η0∇L_CE^(k)(x; ξ)),   h_l ← (1−β)h_l + β(h_{l−1} − η0∇L_CE^(k)(h_{l−1}; ξ))
    G_x = J_1ᵀ⋯J_{L−1}ᵀ ∇_u f^(k)(h_{L−1}, a, b, α; ξ),   J_l = I − η0∇²L_CE^(k)(point of level l)
    m ← (1−γ)m + γG_x,  n ← (1−γ_y)n + γ_y ∂_α f,  x ← x − η_x m,  α ← max(0, α + η_y n)
    every I local steps: x, a, b, α, m, n, h_1..h_{L−1} ← their average over the clients

Three forms of the Jacobian product in G_x (``jacobian=``): ``"hvp"``, the exact per-batch product (L−1
Hessian-vector products by double backward); ``"identity"``, J_l ≈ I (PDSCA); ``"estimator"``, the Jacobian-vector
products tracked by their own moving-average estimators, as the companion compositional work tracks its Jacobians
(NOTE(deviation): the ICML 2024 paper's body is not available, so this form is reconstructed):

    z_L = ∇_u f,   z_l ← (1−β_J)z_l + β_J(z_{l+1} − η0∇²L_CE^(k)(point of level l) z_{l+1}),  l = L−1, ..., 1
    G_x = z_1      (β_J = 1 is the exact product; the z_l are averaged with the model like the h_l)

LibAUC's stabilisers (PESG/PDSCA), for every objective: an elementwise clip of the primal stochastic gradient
(``clip_value``), the epoch-decay proximal term λ0(x − x_ref) added to the primal gradient (``epoch_decay``; x_ref
starts at the initial weights, as PESG's docstring, and is reset at every decay to the average of the synchronised
iterates of the stage that ends, NOTE(deviation): LibAUC averages every local iterate, which differ across clients),
and the step decay η_x, η_y ← η/``decay_factor`` at the local step counts ``decay_at`` (LibAUC: at 50% and 75% of
training); η0 is not decayed (it defines the objective).

The same class runs the baselines on the same code path: ``objective="ce"`` (CE-FedAvg with momentum),
``"aucm"`` (LocalSGDAM / CoDA-style federated AUC-M minimax) and ``"compositional"`` with ``levels=2``
(LocalSCGDAM). The communication back ends (in-process simulator, torch.distributed) live in
:mod:`icml24.fed_auc.backends`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from icml24.common import validate as v
from icml24.fed_auc.losses import aucm_loss, bce_on_logits

__all__ = ["FederatedCompositionalAUC", "OBJECTIVES", "JACOBIANS"]

OBJECTIVES = ("compositional", "aucm", "ce")
JACOBIANS = ("hvp", "identity", "estimator")
_OWNER = "FederatedCompositionalAUC"
State = dict[str, torch.Tensor]


class FederatedCompositionalAUC:
    """The per-client update of the federated multi-level compositional AUC minimax method and its baselines.

    A client state is a dict of flat tensors: ``w`` (network weights x), ``ab`` (a, b), ``alpha`` (α), ``m_w``,
    ``m_ab`` (primal momentum m), ``n`` (dual momentum), ``h1``..``h{L-1}`` (inner-level estimators, model-sized)
    and ``t`` (local step count, not communicated). States are plain tensors so a back end can average them.

    Args:
        model: the network; maps a batch to one logit per sample (scores h = sigmoid(logit)). Its current
            parameters are the initial x (every client starts from them).
        objective: ``"compositional"`` (the method; L = ``levels``), ``"aucm"`` (federated AUC-M minimax) or
            ``"ce"`` (CE-FedAvg with momentum).
        levels: L ≥ 2, the number of levels of the compositional objective (L−1 inner CE steps).
        eta0: η0 ≥ 0, step of the inner CE map u(w) = w − η0∇L_CE(w).
        lr_x: η_x > 0, primal step (x, a, b).
        lr_y: η_y > 0, dual step (α).
        beta: β ∈ [0, 1], weight of the new value in the estimators' moving average (β = 0 freezes them at their
            first value: the negative control).
        gamma: γ ∈ (0, 1], weight of the new gradient in the primal momentum (LibAUC/PDSCA convention).
        gamma_y: γ_y ∈ (0, 1], the same for the dual (default: ``gamma``; 1 = no dual momentum, as PESG).
        local_steps: I ≥ 1, local steps between averagings (read by the back ends).
        margin: m > 0 of the AUC-M loss.
        imratio: p ∈ (0, 1), positive ratio used by loss ``v1`` (a public number: the federation's ratio).
        loss_version: ``"v1"`` or ``"v2"`` AUC-M loss.
        jacobian: ``"hvp"`` (exact Jacobian-vector products J_lᵀv = v − η0∇²L_CE v by double backward),
            ``"identity"`` (J_l ≈ I, PDSCA's approximation) or ``"estimator"`` (the products tracked by moving-average
            estimators z_l with weight ``jvp_beta`` on the new value; NOTE(deviation), see the module docstring).
        jvp_beta: β_J ∈ (0, 1], new-value weight of the JVP estimators (default: ``beta``; 1 = exact HVP).
        epoch_decay: λ0 ≥ 0 of LibAUC's epoch-level proximal term λ0(x − x_ref) on x, a, b (0 = none).
        decay_at: local step counts (multiples of ``local_steps``: round boundaries) at which η_x, η_y are divided by
            ``decay_factor`` and x_ref is reset (LibAUC's ``update_regularizer``).
        decay_factor: > 0, LibAUC's 10.
        clip_value: elementwise clip of the primal stochastic gradients (LibAUC uses 1.0); ``None`` = no clip.
        weight_decay: λ ≥ 0 added to the primal gradient as λx (also on a, b, like LibAUC).
        primal_from: ``"x"`` (x ← x − η_x m, LocalSCGDAM) or ``"estimator"`` (w ← h_{L−1} − η_x m, PDSCA, which
            overwrites the weights with the moving average).
        dual_grad: ``"exact"`` (∂f/∂α by autograd) or ``"pesg"`` (LibAUC's closed form 2(m + b − a) − 2α with the
            updated a, b).
    """

    def __init__(self, model: nn.Module, *, objective: str = "compositional", levels: int = 3, eta0: float = 0.1,
                 lr_x: float = 0.1, lr_y: float = 0.1, beta: float = 0.9, gamma: float = 0.9,
                 gamma_y: float | None = None, local_steps: int = 8, margin: float = 1.0,
                 imratio: float | None = None, loss_version: str = "v1", jacobian: str = "hvp",
                 clip_value: float | None = None, weight_decay: float = 0.0, primal_from: str = "x",
                 dual_grad: str = "exact", jvp_beta: float | None = None, epoch_decay: float = 0.0,
                 decay_at: tuple[int, ...] | list[int] = (), decay_factor: float = 10.0) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"{_OWNER}: model must be a torch.nn.Module, got {type(model).__name__}")
        self.objective = v.one_of(_OWNER, "objective", objective, OBJECTIVES)
        self.levels = v.integer(_OWNER, "levels (L)", levels, minimum=2)
        self.eta0 = v.non_negative(_OWNER, "eta0", eta0)
        self.lr_x = v.positive(_OWNER, "lr_x", lr_x)
        self.lr_y = v.positive(_OWNER, "lr_y", lr_y)
        self.beta = v.probability(_OWNER, "beta", beta)
        self.gamma = v.in_range(_OWNER, "gamma", gamma, 0.0, 1.0, low_open=True)
        self.gamma_y = self.gamma if gamma_y is None else v.in_range(_OWNER, "gamma_y", gamma_y, 0.0, 1.0,
                                                                     low_open=True)
        self.local_steps = v.integer(_OWNER, "local_steps (I)", local_steps, minimum=1)
        self.margin = v.positive(_OWNER, "margin", margin)
        self.loss_version = v.one_of(_OWNER, "loss_version", loss_version, ("v1", "v2"))
        if self.objective != "ce" and self.loss_version == "v1":
            if imratio is None:
                raise ValueError(f"{_OWNER}: imratio (p) is required for loss_version 'v1'")
            v.in_range(_OWNER, "imratio", imratio, 0.0, 1.0, low_open=True, high_open=True)
        self.imratio = None if imratio is None else float(imratio)
        self.jacobian = v.one_of(_OWNER, "jacobian", jacobian, JACOBIANS)
        self.jvp_beta = (self.beta if jvp_beta is None
                         else v.in_range(_OWNER, "jvp_beta", jvp_beta, 0.0, 1.0, low_open=True))
        if self.jacobian == "estimator" and self.jvp_beta == 0.0:
            raise ValueError(f"{_OWNER}: jvp_beta must be > 0 with jacobian='estimator' (beta=0 freezes the "
                             "function estimators only: pass jvp_beta)")
        self.epoch_decay = v.non_negative(_OWNER, "epoch_decay", epoch_decay)
        self.decay_factor = v.positive(_OWNER, "decay_factor", decay_factor)
        steps = sorted(v.integer(_OWNER, "decay_at", d, minimum=1) for d in decay_at)
        bad = [d for d in steps if d % self.local_steps]
        if bad or len(set(steps)) != len(steps):
            raise ValueError(f"{_OWNER}: decay_at must hold distinct multiples of local_steps={self.local_steps} "
                             f"(round boundaries), got {list(decay_at)}")
        self.decay_at = tuple(steps)
        self.clip_value = None if clip_value is None else v.positive(_OWNER, "clip_value", clip_value)
        self.weight_decay = v.non_negative(_OWNER, "weight_decay", weight_decay)
        self.primal_from = v.one_of(_OWNER, "primal_from", primal_from, ("x", "estimator"))
        if primal_from == "estimator" and objective != "compositional":
            raise ValueError(f"{_OWNER}: primal_from='estimator' needs objective='compositional', got {objective!r}")
        self.dual_grad = v.one_of(_OWNER, "dual_grad", dual_grad, ("exact", "pesg"))
        self.model = model
        named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"{_OWNER}: model has no trainable parameters")
        self._names = [k for k, _ in named]
        self._shapes = [p.shape for _, p in named]
        self._numels = [p.numel() for _, p in named]
        self._buffers = dict(model.named_buffers())
        self.num_params = sum(self._numels)

    # ------------------------------------------------------------------ functional model
    def unflatten(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flat weights -> ``{name: tensor}`` views for ``torch.func.functional_call``."""
        return {k: t.view(s) for k, t, s in zip(self._names, torch.split(w, self._numels), self._shapes,
                                                 strict=True)}

    def logits(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The network's logits at flat weights ``w``, shape ``(N,)``."""
        return functional_call(self.model, {**self.unflatten(w), **self._buffers}, (x,)).reshape(-1)

    def _ce(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return bce_on_logits(self.logits(w, x), y)

    def _auc(self, w: torch.Tensor, ab: torch.Tensor, alpha: torch.Tensor, x: torch.Tensor,
             y: torch.Tensor) -> torch.Tensor:
        return aucm_loss(torch.sigmoid(self.logits(w, x)), y, a=ab[0], b=ab[1], alpha=alpha[0], margin=self.margin,
                         imratio=self.imratio, version=self.loss_version)

    # ------------------------------------------------------------------ state
    @property
    def estimator_keys(self) -> list[str]:
        return [f"h{l}" for l in range(1, self.levels)] if self.objective == "compositional" else []

    @property
    def jvp_keys(self) -> list[str]:
        """The JVP estimators z_1..z_{L−1} (``jacobian="estimator"`` only), model-sized."""
        if self.objective == "compositional" and self.jacobian == "estimator":
            return [f"z{l}" for l in range(1, self.levels)]
        return []

    @property
    def comm_keys(self) -> list[str]:
        """The state tensors averaged at each communication round."""
        if self.objective == "ce":
            return ["w", "m_w"]
        return ["w", "ab", "alpha", "m_w", "m_ab", "n", *self.estimator_keys, *self.jvp_keys]

    def lr_scale(self, t: int) -> float:
        """The factor on η_x, η_y at local step ``t`` (0-based): 1/decay_factor per decay step ≤ t."""
        return float(self.decay_factor) ** -sum(1 for d in self.decay_at if d <= t)

    def floats_per_client(self) -> int:
        """Floats one client uploads per communication round (the multi-level method adds L−1 model-sized h_l)."""
        sizes = {"w": self.num_params, "m_w": self.num_params, "ab": 2, "m_ab": 2, "alpha": 1, "n": 1}
        return sum(sizes.get(k, self.num_params) for k in self.comm_keys)

    def init_state(self, *, device: str | torch.device | None = None) -> State:
        """A fresh client state at the model's current weights; a = b = α = 0, momenta and estimators unset."""
        w = torch.cat([p.detach().reshape(-1) for k, p in self.model.named_parameters() if k in self._names])
        w = w.clone().to(device) if device is not None else w.clone()
        z = lambda n: torch.zeros(n, dtype=w.dtype, device=w.device)  # noqa: E731
        st: State = {"w": w, "ab": z(2), "alpha": z(1), "m_w": torch.zeros_like(w), "m_ab": z(2), "n": z(1),
                     "t": torch.zeros((), dtype=torch.long, device=w.device)}
        for k in self.estimator_keys:
            st[k] = w.clone()  # overwritten by the first new value (LibAUC's buffer initialisation)
        for k in self.jvp_keys:
            st[k] = torch.zeros_like(w)  # overwritten by the first new value
        if self.epoch_decay > 0:  # x_ref (set to the global x at the first step), sum of the stage's synced iterates
            st.update(w_ref=w.clone(), ab_ref=z(2), w_acc=torch.zeros_like(w), ab_acc=z(2), acc_n=z(1))
        return st

    def predictor_weights(self, state: State) -> torch.Tensor:
        """Weights used for prediction: u_{L−1}'s estimator h_{L−1} for the compositional method, else x."""
        if self.objective == "compositional":
            return state[f"h{self.levels - 1}"]
        return state["w"]

    @torch.no_grad()
    def scores(self, state: State, x: torch.Tensor, *, weights: str = "predictor") -> torch.Tensor:
        """h(x) = sigmoid(logit) with the predictor weights (``weights="x"`` uses x itself).

        The model runs in ``eval()`` mode (BatchNorm uses its running statistics and does not update them, dropout
        is off), as ``model.eval(); model(x)`` would; every submodule's own mode is restored after.
        """
        v.one_of(_OWNER, "weights", weights, ("predictor", "x"))
        w = self.predictor_weights(state) if weights == "predictor" else state["w"]
        modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        try:
            return torch.sigmoid(self.logits(w, x))
        finally:
            for m, mode in modes:
                m.training = mode

    # ------------------------------------------------------------------ one local step
    def _primal_grad(self, g: torch.Tensor, p: torch.Tensor, ref: torch.Tensor | None = None) -> torch.Tensor:
        if self.clip_value is not None:
            g = g.clamp(-self.clip_value, self.clip_value)
        if ref is not None and self.epoch_decay > 0:  # LibAUC: clip(g) + λ0(p − p_ref) + λp
            g = g + self.epoch_decay * (p - ref)
        return g + self.weight_decay * p if self.weight_decay else g

    def _stage(self, state: State, t: int) -> None:
        """Epoch-decay bookkeeping at the start of local step ``t``: at t = 0 x_ref is the (global) initial x; at
        each later round boundary the synchronised iterate joins the stage's average, and at a decay step x_ref
        becomes that average (LibAUC's ``update_regularizer``)."""
        if self.epoch_decay <= 0:
            return
        if t == 0:
            state["w_ref"], state["ab_ref"] = state["w"].clone(), state["ab"].clone()
            return
        if t % self.local_steps:
            return
        state["w_acc"] = state["w_acc"] + state["w"]
        state["ab_acc"] = state["ab_acc"] + state["ab"]
        state["acc_n"] = state["acc_n"] + 1.0
        if t in self.decay_at:
            state["w_ref"], state["ab_ref"] = state["w_acc"] / state["acc_n"], state["ab_acc"] / state["acc_n"]
            state["w_acc"], state["ab_acc"] = torch.zeros_like(state["w_acc"]), torch.zeros_like(state["ab_acc"])
            state["acc_n"] = torch.zeros_like(state["acc_n"])

    def local_step(self, state: State, x: torch.Tensor, y: torch.Tensor) -> State:
        """One local update of a client on the minibatch ``(x, y)``; updates ``state`` in place and returns it."""
        t = int(state["t"])
        first = t == 0
        self._stage(state, t)
        scale = self.lr_scale(t)
        w, ab, alpha = state["w"], state["ab"], state["alpha"]
        g_ab = g_alpha = None
        if self.objective == "ce":
            wr = w.detach().requires_grad_(True)
            (g_w,) = torch.autograd.grad(self._ce(wr, x, y), wr)
        elif self.objective == "aucm":
            wr, abr, alr = (t.detach().requires_grad_(True) for t in (w, ab, alpha))
            g_w, g_ab, g_alpha = torch.autograd.grad(self._auc(wr, abr, alr, x, y), (wr, abr, alr))
        else:
            exact = self.jacobian in ("hvp", "estimator") and self.eta0 > 0
            prev, points = w, []
            for l in range(1, self.levels):
                pt = prev.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(self._ce(pt, x, y), pt, create_graph=exact)
                new = (pt - self.eta0 * g).detach()
                key = f"h{l}"
                state[key] = new if first else (1.0 - self.beta) * state[key] + self.beta * new
                points.append((pt, g))
                prev = state[key]
            ur, abr, alr = (t.detach().requires_grad_(True) for t in (prev, ab, alpha))
            g_w, g_ab, g_alpha = torch.autograd.grad(self._auc(ur, abr, alr, x, y), (ur, abr, alr))
            if self.jacobian != "identity":
                for l in range(self.levels - 1, 0, -1):  # J_lᵀ v = v − η0 ∇²L_CE(pt) v, l = L−1, ..., 1
                    pt, g = points[l - 1]
                    if exact:
                        (hv,) = torch.autograd.grad(g, pt, grad_outputs=g_w.detach())
                        new = (g_w - self.eta0 * hv).detach()
                    else:
                        new = g_w.detach()
                    if self.jacobian == "estimator":  # z_l tracks J_lᵀ z_{l+1} by its own moving average
                        key = f"z{l}"
                        state[key] = new if first else (1.0 - self.jvp_beta) * state[key] + self.jvp_beta * new
                        g_w = state[key]
                    else:
                        g_w = new
        g_w = self._primal_grad(g_w.detach(), w, state.get("w_ref"))
        state["m_w"] = g_w if first else (1.0 - self.gamma) * state["m_w"] + self.gamma * g_w
        base = state[f"h{self.levels - 1}"] if self.primal_from == "estimator" else w
        state["w"] = base - scale * self.lr_x * state["m_w"]
        if self.objective != "ce":
            assert g_ab is not None and g_alpha is not None
            g_ab = self._primal_grad(g_ab.detach(), ab, state.get("ab_ref"))
            state["m_ab"] = g_ab if first else (1.0 - self.gamma) * state["m_ab"] + self.gamma * g_ab
            state["ab"] = ab - scale * self.lr_x * state["m_ab"]
            if self.dual_grad == "pesg":  # LibAUC: closed form with the already-updated a, b
                a_new, b_new = state["ab"][0:1], state["ab"][1:2]
                g_y = 2.0 * (self.margin + b_new - a_new) - 2.0 * alpha
            else:
                g_y = g_alpha.detach()
            state["n"] = g_y if first else (1.0 - self.gamma_y) * state["n"] + self.gamma_y * g_y
            state["alpha"] = torch.clamp(alpha + scale * self.lr_y * state["n"], min=0.0)  # projection onto α ≥ 0
        state["t"] = state["t"] + 1
        return state

    def __repr__(self) -> str:
        lv = f", levels={self.levels}" if self.objective == "compositional" else ""
        return (f"{_OWNER}(objective={self.objective!r}{lv}, eta0={self.eta0}, lr_x={self.lr_x}, lr_y={self.lr_y}, "
                f"beta={self.beta}, gamma={self.gamma}, local_steps={self.local_steps}, jacobian={self.jacobian!r})")


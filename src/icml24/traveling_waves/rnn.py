"""The Elman RNN of the paper's experiments and its trainer (curriculum over the output horizon).

h(t+1) = tanh(W_hh h(t) + W_uh x(t+1)),  ŷ(t) = W_r h(t),  h(-1) = 0, no biases (paper code:
``torch.nn.RNN(d, hidden, nonlinearity='tanh', bias=False)`` + ``Linear(hidden, d, bias=False)``, PyTorch default
initialisation, Adam lr 1e-3, gradient-norm clip 1.0, batch 64).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.traveling_waves.tasks import Curriculum, make_batch, task_matrix
from icml24.traveling_waves.twm import shift_operator

__all__ = ["ElmanRNN", "LSTMNet", "orthogonal_rnn", "wave_init_rnn", "TrainResult", "train_rnn",
           "evaluate_accuracy"]
_OWNER = "traveling_waves"


class _Recurrent(nn.Module):
    """A batch-first ``self.rnn`` read out by ``self.readout``: the interface both networks share."""

    def __init__(self, *, d: int, hidden: int, rnn: Callable[[int, int], nn.RNNBase]) -> None:
        super().__init__()
        self.d = v.integer(_OWNER, "d", d, minimum=1)
        self.hidden = v.integer(_OWNER, "hidden", hidden, minimum=1)
        self.rnn = rnn(self.d, self.hidden)
        self.readout = nn.Linear(self.hidden, self.d, bias=False)

    def hidden_states(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden trajectory h(0..T-1), shape (B, T, H), from h(-1) = 0."""
        v.tensor(_OWNER, "x", x, ndim=3, floating=True)
        if x.shape[-1] != self.d:
            raise ValueError(f"{_OWNER}: x must have {self.d} features, got shape {tuple(x.shape)}")
        h, _ = self.rnn(x)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Outputs ŷ(0..T-1), shape (B, T, d)."""
        return self.readout(self.hidden_states(x))


class ElmanRNN(_Recurrent):
    """tanh Elman RNN without biases: h(t) = tanh(W_hh h(t-1) + W_uh x(t)), ŷ(t) = W_r h(t).

    Args:
        d: input/output dimension.
        hidden: hidden size H.
    """

    def __init__(self, *, d: int, hidden: int) -> None:
        super().__init__(d=d, hidden=hidden, rnn=lambda d, h: nn.RNN(d, h, nonlinearity="tanh", bias=False,
                                                                      batch_first=True))

    @property
    def W_hh(self) -> torch.Tensor:
        """Recurrent matrix (H, H)."""
        return self.rnn.weight_hh_l0

    @property
    def W_uh(self) -> torch.Tensor:
        """Input matrix (H, d)."""
        return self.rnn.weight_ih_l0

    @property
    def W_r(self) -> torch.Tensor:
        """Readout matrix (d, H)."""
        return self.readout.weight


class LSTMNet(_Recurrent):
    """LSTM baseline with the Elman RNN's interface: h(t) = LSTM(x(≤t)), ŷ(t) = W_r h(t) (PyTorch default init,
    gate biases included; readout without bias, as the Elman RNN's).

    Args:
        d: input/output dimension.
        hidden: LSTM units (64 units have about the parameters of the 128-unit Elman RNN).
    """

    def __init__(self, *, d: int, hidden: int) -> None:
        super().__init__(d=d, hidden=hidden, rnn=lambda d, h: nn.LSTM(d, h, batch_first=True))


def orthogonal_rnn(*, d: int, hidden: int, generator: torch.Generator | None = None) -> ElmanRNN:
    """The Elman RNN with its recurrent matrix W_hh drawn by ``torch.nn.init.orthogonal_`` (W_uh, W_r: default)."""
    model = ElmanRNN(d=d, hidden=hidden)
    with torch.no_grad():
        torch.nn.init.orthogonal_(model.W_hh, generator=generator)
    return model


def wave_init_rnn(*, d: int, hidden: int, s: int, generator: torch.Generator | None = None) -> ElmanRNN:
    """The Elman RNN whose recurrence starts as the T1 traveling wave of window ``s`` in a random basis.

    W_hh = Q · blockdiag(M_s, R) · Qᵀ with M_s the T1 TWM operator (the cyclic block shift of s rows of d, a
    permutation matrix), R a random orthogonal (H − s·d)-square matrix and Q a random orthogonal basis (both from
    ``torch.nn.init.orthogonal_``): W_hh is orthogonal, like :func:`orthogonal_rnn`'s, and differs from it only
    in carrying a window-s wave (s·d eigenvalues at the s-th roots of unity). W_uh and W_r keep PyTorch's default
    initialisation, so the network still has to learn to write the input into the wave and read it out.
    """
    d = v.integer(_OWNER, "d", d, minimum=1)
    hidden = v.integer(_OWNER, "hidden", hidden, minimum=1)
    s = v.integer(_OWNER, "s", s, minimum=1)
    n = s * d
    if n > hidden:
        raise ValueError(f"{_OWNER}: the wave needs s*d <= hidden, got s*d = {n} > hidden = {hidden}")
    model = ElmanRNN(d=d, hidden=hidden)
    M = shift_operator(F=task_matrix(task="T1", d=d, s=s), d=d, s=s)
    block = torch.zeros(hidden, hidden, dtype=torch.float64)
    block[:n, :n] = M
    if hidden > n:
        R = torch.empty(hidden - n, hidden - n, dtype=torch.float64)
        block[n:, n:] = torch.nn.init.orthogonal_(R, generator=generator)
    Q = torch.nn.init.orthogonal_(torch.empty(hidden, hidden, dtype=torch.float64), generator=generator)
    with torch.no_grad():
        model.W_hh.copy_((Q @ block @ Q.T).to(model.W_hh.dtype))
    return model


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, *, task: str, s: int, horizon: int, batches: int, batch_size: int,
                      generator: torch.Generator) -> float:
    """Sign accuracy of ŷ on the output steps t ≥ s over ``batches`` fresh batches."""
    correct, total = 0.0, 0
    p = next(model.parameters())
    for _ in range(batches):
        x, z = make_batch(task=task, d=model.d, s=s, horizon=horizon, batch_size=batch_size, generator=generator,
                          dtype=p.dtype)
        y = model(x.to(p.device))[:, s:]
        correct += float((torch.sign(y) == z[:, s:].to(p.device)).float().sum())
        total += y.numel()
    return correct / total


@dataclass
class TrainResult:
    """What :func:`train_rnn` returns: the model at the checkpoint chosen on validation, and its history."""

    model: nn.Module
    best_step: int
    best_val_accuracy: float
    steps: int
    final_stage: int
    history: list[dict[str, float]] = field(default_factory=list)


def train_rnn(model: nn.Module, *, task: str, s: int, steps: int, generator: torch.Generator,
              val_generator_seed: int, lr: float = 1e-3, weight_decay: float = 0.0, clip: float = 1.0,
              batch_size: int = 64, curriculum: Curriculum | None = None, val_horizon: int = 200,
              val_every: int = 250, val_batches: int = 4, stop_accuracy: float = 0.99,
              show_progress: bool = False) -> TrainResult:
    """Train ``model`` on an HDS task by BPTT with the horizon curriculum; choose the checkpoint on validation.

    MSE on steps t ≥ s, Adam(lr, weight_decay) and gradient-norm clipping (paper code). Every ``val_every``
    steps (once the curriculum is at its last stage) the model is scored on ``val_batches`` fresh validation
    batches at ``val_horizon`` (the same batches each time, drawn from ``val_generator_seed``); the best
    checkpoint is kept. Training stops early once the validation accuracy reaches ``stop_accuracy``.

    Args:
        model: the RNN (any module with ``d`` and ``forward``: :class:`ElmanRNN`, :class:`LSTMNet`; trained in
            place; the returned ``model`` is a copy at the best checkpoint).
        task: ``"T1"``-``"T4"``.
        s: memory window of the task.
        steps: maximum number of optimisation steps.
        generator: source of the training batches.
        val_generator_seed: seed of the validation batches (never the test batches).
        lr, weight_decay, clip, batch_size: Adam lr, L2 weight decay, gradient-norm clip, batch size B.
        curriculum: horizon curriculum (default: paper's 10, 20, 40, 60, 100 at 0.96).
        val_horizon: output horizon of the validation batches (paper's test horizon 200).
        val_every, val_batches: validation period (steps) and number of batches.
        stop_accuracy: early stop threshold on the validation accuracy.
        show_progress: tqdm bar.
    """
    steps = v.integer(_OWNER, "steps", steps, minimum=1)
    v.positive(_OWNER, "lr", lr)
    v.non_negative(_OWNER, "weight_decay", weight_decay)
    v.positive(_OWNER, "clip", clip)
    v.integer(_OWNER, "val_every", val_every, minimum=1)
    cur = copy.deepcopy(curriculum) if curriculum is not None else Curriculum()
    p = next(model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    best: dict[str, Any] = {"acc": -1.0, "step": 0, "state": copy.deepcopy(model.state_dict())}
    history: list[dict[str, float]] = []

    def validate(step: int) -> float:
        g = torch.Generator().manual_seed(val_generator_seed)
        acc = evaluate_accuracy(model, task=task, s=s, horizon=val_horizon, batches=val_batches,
                                batch_size=batch_size, generator=g)
        history.append({"step": float(step), "val_acc": acc, "horizon": float(cur.horizon)})
        if acc > best["acc"]:
            best.update(acc=acc, step=step, state=copy.deepcopy(model.state_dict()))
        return acc

    it = progress(range(1, steps + 1), desc=f"{_OWNER} {task}") if show_progress else range(1, steps + 1)
    step = 0
    for step in it:
        x, z = make_batch(task=task, d=model.d, s=s, horizon=cur.horizon, batch_size=batch_size,
                          generator=generator, dtype=p.dtype)
        x, z = x.to(p.device), z.to(p.device)
        y = model(x)
        loss = torch.mean((y[:, s:] - z[:, s:]) ** 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        with torch.no_grad():
            acc = float((torch.sign(y[:, s:]) == z[:, s:]).float().mean())
        cur.update(acc)
        if cur.done and step % val_every == 0 and validate(step) >= stop_accuracy:
            break
    if not history or history[-1]["step"] != step:
        validate(step)
    final = copy.deepcopy(model)
    final.load_state_dict(best["state"])
    return TrainResult(model=final, best_step=int(best["step"]), best_val_accuracy=float(best["acc"]), steps=step,
                       final_stage=cur.stage, history=history)

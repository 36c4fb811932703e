"""Learning speed on T1: steps to criterion of a wave-initialised RNN against non-wave baselines.

The gradient argument of the paper (blog, "Gradient Propagation with Traveling Waves"): while the window is held
as a traveling wave, ∂C/∂x(t−k) carries no power of the recurrent Jacobian over the window, so the gradient does
not vanish within it. If that is what makes the wave solution learnable, a network whose recurrence *starts* as
the window-s wave learns the window-s task faster than networks without one, and a wave of the wrong window s′
does not help. Arms (all trained on T1 with window s, the same batches per seed, Adam + clipping, lr tuned):

- ``wave``: Elman RNN, W_hh = Q blockdiag(M_s, R) Qᵀ (:func:`wave_init_rnn`; orthogonal, window-s wave);
- ``wrong_window``: the same with M_{s′} (a wave of window s′ ≠ s; negative control);
- ``orthogonal``: Elman RNN, W_hh from ``torch.nn.init.orthogonal_`` (no wave; baseline);
- ``lstm``: ``torch.nn.LSTM`` (baseline);
- ``default``: the paper's Elman RNN with PyTorch's default initialisation (reported).

Steps to criterion: the first validation check (every ``check_every`` steps, fixed validation batches at the
training horizon) at which the sign accuracy reaches the criterion; a run that never does within ``cap`` steps is
*censored* and counted at the cap (a lower bound on its steps), and the censoring is reported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from icml24.common import validate as v
from icml24.common.seeding import torch_generator
from icml24.traveling_waves.rnn import (
    ElmanRNN,
    LSTMNet,
    evaluate_accuracy,
    orthogonal_rnn,
    train_rnn,
    wave_init_rnn,
)
from icml24.traveling_waves.tasks import Curriculum

__all__ = ["SPEED_ARMS", "SpeedSetting", "build_arm", "steps_to_criterion", "log_steps"]
_OWNER = "traveling_waves"
SPEED_ARMS: tuple[str, ...] = ("wave", "wrong_window", "orthogonal", "lstm", "default")


@dataclass(frozen=True)
class SpeedSetting:
    """What one steps-to-criterion run needs (a picklable slice of the experiment's Config)."""

    d: int
    s: int
    control_s: int
    hidden: int
    lstm_hidden: int
    horizon: int
    cap: int
    check_every: int
    criterion: float
    val_batches: int
    test_batches: int
    batch_size: int
    clip: float


def build_arm(arm: str, *, st: SpeedSetting, seed: int) -> nn.Module:
    """The untrained network of ``arm`` for ``seed``.

    The Elman arms share their default-initialised W_uh and W_r (``torch.manual_seed(seed)`` first) and draw their
    orthogonal matrices from one generator of the seed, so that they differ only in W_hh.
    """
    v.one_of(_OWNER, "arm", arm, SPEED_ARMS)
    torch.manual_seed(seed)
    g = torch_generator(90_000 + seed)
    if arm == "lstm":
        return LSTMNet(d=st.d, hidden=st.lstm_hidden)
    if arm == "orthogonal":
        return orthogonal_rnn(d=st.d, hidden=st.hidden, generator=g)
    if arm == "default":
        return ElmanRNN(d=st.d, hidden=st.hidden)
    return wave_init_rnn(d=st.d, hidden=st.hidden, s=st.s if arm == "wave" else st.control_s, generator=g)


def steps_to_criterion(arm: str, lr: float, seed: int, st: SpeedSetting) -> dict[str, Any]:
    """Train ``arm`` on T1 (window s, output horizon ``st.horizon``, no curriculum) until its validation accuracy
    reaches ``st.criterion`` or ``st.cap`` steps pass.

    Returns:
        ``steps`` (to criterion; the cap when censored), ``reached``, ``best_val_acc``, ``test_acc`` (separate
        test batches, at the checkpoint chosen on validation), ``wall_s``.
    """
    v.positive(_OWNER, "lr", lr)
    t0 = time.perf_counter()
    model = build_arm(arm, st=st, seed=seed)
    tr = train_rnn(model, task="T1", s=st.s, steps=st.cap, generator=torch_generator(60_000 + seed),
                   val_generator_seed=70_000 + seed, lr=lr, clip=st.clip, batch_size=st.batch_size,
                   curriculum=Curriculum(horizons=(st.horizon,)), val_horizon=st.horizon, val_every=st.check_every,
                   val_batches=st.val_batches, stop_accuracy=st.criterion)
    reached = tr.best_val_accuracy >= st.criterion
    test_acc = evaluate_accuracy(tr.model, task="T1", s=st.s, horizon=st.horizon, batches=st.test_batches,
                                 batch_size=st.batch_size, generator=torch_generator(80_000 + seed))
    return {"arm": arm, "lr": float(lr), "seed": int(seed), "steps": int(tr.best_step if reached else st.cap),
            "reached": bool(reached), "best_val_acc": float(tr.best_val_accuracy), "test_acc": float(test_acc),
            "wall_s": time.perf_counter() - t0}


def log_steps(runs: Sequence[dict[str, Any]]) -> list[float]:
    """log(steps to criterion) per run (censored runs at the cap)."""
    return [math.log(r["steps"]) for r in runs]

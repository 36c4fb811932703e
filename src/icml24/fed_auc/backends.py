"""Two communication back ends for the same client update: an in-process simulator and torch.distributed.

Both run ``algo.local_step`` I times per round on each client's own minibatches (drawn with replacement by a
per-client generator seeded from ``(seed, client index)``) and then replace every communicated state tensor by its
average over the participating clients. Given the same seeds and data they produce the same model (tested).

Simulator: clients run one after the other in one process; optional per-round dropout; a client that raises during
its local steps is logged and left out of that round's average; a count of floats communicated (uploads).
torch.distributed: one process per client (``torchrun --nproc-per-node K -m icml24.fed_auc.launch ...``); the
round's average is one ``all_reduce`` (sum) of the flattened communicated tensors divided by the world size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from icml24.common import validate as v
from icml24.common.progress import progress
from icml24.fed_auc.algorithm import FederatedCompositionalAUC, State

__all__ = ["SimulationResult", "average_states", "validate_clients", "simulate", "run_distributed",
           "client_generator"]

log = logging.getLogger("icml24.fed_auc")
_OWNER = "fed_auc"
RoundCallback = Callable[[int, State, int], Any]


@dataclass
class SimulationResult:
    """Final global state, per-client states, floats communicated and per-round logs."""

    state: State
    client_states: list[State]
    floats_communicated: int
    participants: list[list[int]] = field(default_factory=list)
    failures: list[tuple[int, int, str]] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)


def client_generator(seed: int, client: int) -> torch.Generator:
    """The batch-sampling generator of client ``client`` (identical in both back ends)."""
    return torch.Generator().manual_seed(int(seed) * 100_003 + int(client) + 1)


def _check_client(k: int, x: Any, y: Any) -> None:
    v.tensor(_OWNER, f"client {k} x", x, floating=True)
    v.tensor(_OWNER, f"client {k} y", y, ndim=1)
    if len(y) == 0:
        raise ValueError(f"{_OWNER}: client {k} has no data")
    v.same_length(_OWNER, (f"client {k} x", f"client {k} y"), x.shape[0], y.shape[0])
    if y.is_floating_point() or y.is_complex():
        raise TypeError(f"{_OWNER}: client {k} labels must be an integer or bool tensor, got {y.dtype}")
    if not bool(((y == 0) | (y == 1)).all()):
        raise ValueError(f"{_OWNER}: client {k} labels must be binary (0/1), got values "
                         f"{sorted(torch.unique(y).tolist())[:5]}")


def validate_clients(clients: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Clear errors before any compute: K ≥ 1, every client non-empty, matching lengths, binary labels, and at
    least one positive sample in the federation."""
    if not isinstance(clients, Sequence) or len(clients) < 1:
        raise ValueError(f"{_OWNER}: the number of clients K must be >= 1, got "
                         f"{len(clients) if hasattr(clients, '__len__') else clients!r}")
    for k, item in enumerate(clients):
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"{_OWNER}: client {k} must be an (x, y) pair of tensors")
        _check_client(k, *item)
    if sum(int(y.sum()) for _, y in clients) == 0:
        raise ValueError(f"{_OWNER}: the federation has no positive sample (AUC is undefined); "
                         "lower the imbalance or change the split")


def _check_run_args(algo: Any, rounds: int, batch_size: int, seed: int) -> None:
    if not isinstance(algo, FederatedCompositionalAUC):
        raise TypeError(f"{_OWNER}: algo must be a FederatedCompositionalAUC, got {type(algo).__name__}")
    v.integer(_OWNER, "rounds", rounds, minimum=1)
    v.integer(_OWNER, "batch_size", batch_size, minimum=1)
    v.integer(_OWNER, "seed", seed, minimum=0)


def average_states(states: Sequence[State], keys: Sequence[str]) -> State:
    """A new state: the mean over ``states`` of every tensor in ``keys``; other entries copied from the first."""
    out = {k: t.clone() for k, t in states[0].items()}
    for k in keys:
        out[k] = torch.stack([s[k] for s in states]).sum(0) / len(states)
    return out


def _copy(state: State) -> State:
    return {k: t.clone() for k, t in state.items()}


def _local_round(algo: FederatedCompositionalAUC, state: State, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int, gen: torch.Generator, fault_at: int | None = None) -> None:
    n = len(y)
    for step in range(algo.local_steps):
        if fault_at is not None and step == fault_at:
            raise RuntimeError("injected client fault")
        idx = torch.randint(n, (batch_size,), generator=gen).to(x.device)
        algo.local_step(state, x[idx], y[idx])


def simulate(algo: FederatedCompositionalAUC, clients: Sequence[tuple[torch.Tensor, torch.Tensor]], *, rounds: int,
             batch_size: int = 32, seed: int = 0, communicate: bool = True, dropout: float = 0.0,
             fault: Callable[[int, int], int | None] | None = None, client_seeds: Sequence[int] | None = None,
             callback: RoundCallback | None = None, callback_every: int = 1, desc: str | None = None,
             ) -> SimulationResult:
    """Run the federation in this process, clients one after the other.

    Args:
        algo: the client update (its ``local_steps`` is I).
        clients: K ``(x, y)`` pairs, y ∈ {0, 1}.
        rounds: communication rounds R (R·I local steps per client).
        batch_size: local minibatch size.
        seed: seeds each client's batch generator with ``(seed, k)``.
        communicate: ``False`` trains every client alone (no averaging; the no-federation control).
        dropout: probability that a client sits out a round (its local work is not done; it receives the new
            average).
        fault: test hook ``fault(round, k) -> local step at which client k raises, or None``.
        client_seeds: per-client generator seeds overriding ``(seed, k)`` (e.g. identical clients).
        callback: ``callback(round, global_state, floats_so_far)`` after rounds ``callback_every, 2·…`` and the
            last; its return values are collected in ``SimulationResult.callbacks``.
        callback_every: rounds between callbacks.
        desc: progress-bar label (None: no bar).

    Returns:
        :class:`SimulationResult`; ``state`` is the global (averaged) state, or client 0's when not communicating.
    """
    _check_run_args(algo, rounds, batch_size, seed)
    validate_clients(clients)
    v.in_range(_OWNER, "dropout", dropout, 0.0, 1.0, high_open=True)
    v.integer(_OWNER, "callback_every", callback_every, minimum=1)
    K = len(clients)
    if client_seeds is not None and len(client_seeds) != K:
        raise ValueError(f"{_OWNER}: client_seeds must have one seed per client ({K}), got {len(client_seeds)}")
    gens = [torch.Generator().manual_seed(int(client_seeds[k])) if client_seeds is not None
            else client_generator(seed, k) for k in range(K)]
    drop_rng = np.random.default_rng([seed, 7])
    device = clients[0][0].device
    glob = algo.init_state(device=device)
    states = [_copy(glob) for _ in range(K)]
    payload = algo.floats_per_client()
    res = SimulationResult(state=glob, client_states=states, floats_communicated=0)
    it = range(1, rounds + 1)
    for r in (progress(it, desc=desc, total=rounds) if desc else it):
        active = [k for k in range(K) if not (communicate and dropout > 0 and drop_rng.random() < dropout)]
        ok = []
        for k in active:
            x, y = clients[k]
            try:
                _local_round(algo, states[k], x, y, batch_size, gens[k], fault(r, k) if fault else None)
                ok.append(k)
            except Exception as e:  # noqa: BLE001 - a failing client must not stop the federation
                log.warning("fed_auc: client %d failed in round %d (%s); excluded from this round's average", k, r, e)
                res.failures.append((r, k, repr(e)))
        res.participants.append(ok)
        if communicate:
            glob = average_states([states[k] for k in ok], algo.comm_keys) if ok else glob
            res.floats_communicated += payload * len(ok)
            states[:] = [_copy(glob) for _ in range(K)]
        else:
            glob = states[0]
        if callback is not None and (r % callback_every == 0 or r == rounds):
            res.callbacks.append(callback(r, glob, res.floats_communicated))
    res.state, res.client_states = glob, states
    return res


def run_distributed(algo: FederatedCompositionalAUC, x: torch.Tensor, y: torch.Tensor, *, rounds: int,
                    batch_size: int = 32, seed: int = 0, callback: RoundCallback | None = None,
                    callback_every: int = 1) -> tuple[State, int]:
    """Run this process's client (rank k of K) in an initialised ``torch.distributed`` process group.

    The initial weights are broadcast from rank 0; each round ends with one ``all_reduce`` (sum) of the flattened
    communicated tensors, divided by K. Returns the final global state and the floats communicated (all ranks).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{_OWNER}: run_distributed needs an initialised torch.distributed process group "
                           "(launch with torchrun; see icml24.fed_auc.launch)")
    _check_run_args(algo, rounds, batch_size, seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:  # every rank learns of any rank's bad input (a lone raise would leave the others waiting)
        _check_client(rank, x, y)
        err, n_pos = "", float(y.sum())
    except (TypeError, ValueError) as e:
        err, n_pos = str(e), 0.0
    flags = torch.tensor([float(bool(err)), n_pos])
    dist.all_reduce(flags)
    if err:
        raise ValueError(err)
    if flags[0] > 0:
        raise ValueError(f"{_OWNER}: another rank's client data is invalid (see its error)")
    if flags[1] == 0:
        raise ValueError(f"{_OWNER}: the federation has no positive sample (AUC is undefined)")
    state = algo.init_state(device=x.device)
    dist.broadcast(state["w"], src=0)
    for k in algo.estimator_keys:
        state[k] = state["w"].clone()
    gen = client_generator(seed, rank)
    keys = algo.comm_keys
    floats = 0
    for r in range(1, rounds + 1):
        _local_round(algo, state, x, y, batch_size, gen)
        flat = torch.cat([state[k].reshape(-1) for k in keys])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat / world
        for k, piece in zip(keys, torch.split(flat, [state[k].numel() for k in keys]), strict=True):
            state[k] = piece.view_as(state[k]).clone()
        floats += algo.floats_per_client() * world
        if callback is not None and (r % callback_every == 0 or r == rounds):
            callback(r, state, floats)
    return state, floats

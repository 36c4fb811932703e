"""Training loop for TD3/ALH: warm-up, exploration, evaluation every N steps, checkpoint and resume.

The loop follows the official ``main.py``/``main_toy.py``: ``start_steps`` random actions, then
a = clip(π(s, h') + 𝒩(0, (expl_noise · a_max)²), ±a_max) and one agent update per environment step;
ALH-a watches every transition and forgets at every episode end; evaluation (deterministic policy, its own
environment reseeded to ``seed + 100`` every time; none during the warm-up, unbiased resets) calls ``forget()`` once and ``watch`` after
every step of all the evaluation episodes. A checkpoint written at each evaluation holds the agent, the buffer,
the environment and every generator, so a resumed run continues with the same numbers (bit for bit; an env that
cannot be snapshotted exactly is refused when a checkpoint is asked for). Action bounds may be any box [low, high]:
exploration noise is relative to the scale (high − low)/2 and actions are clipped to the box (cleanrl's TD3).
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icml24.alh.envs import action_bounds
from icml24.alh.td3 import ReplayBuffer, TD3Agent
from icml24.common import validate as v
from icml24.common.progress import progress

__all__ = ["train", "evaluate"]


def evaluate(agent: TD3Agent, env: Any, *, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` deterministic episodes; the env is reseeded to ``seed`` first, the agent's
    hypothesis is reset once (``forget``) and updated after every step, across episodes (official
    ``eval_policy``)."""
    agent.forget()
    total = 0.0
    s, _ = env.reset(seed=seed)
    for ep in range(episodes):
        if ep > 0:
            s, _ = env.reset()
        done = False
        while not done:
            a = agent.act(s)
            s2, r, term, trunc, _ = env.step(a)
            total += float(r)
            agent.watch(s, a, float(r))
            s, done = s2, bool(term or trunc)
    return total / episodes


def _wrappers(env: Any) -> list[Any]:
    out = [env]
    while hasattr(out[-1], "env"):
        out.append(out[-1].env)
    return out


_WRAPPER_FIELDS = ("_elapsed_steps", "_has_reset")  # TimeLimit's step counter, OrderEnforcing's reset flag
_CLASSIC_FIELDS = ("state", "last_u", "steps_beyond_terminated")  # what gymnasium's classic-control envs change


def _wrapper_state(env: Any) -> list[dict[str, Any]]:
    return [{k: getattr(w, k) for k in _WRAPPER_FIELDS if k in vars(w)} for w in _wrappers(env)]


def _restore_wrappers(env: Any, saved: list[dict[str, Any]]) -> None:
    for w, fields in zip(_wrappers(env), saved, strict=False):
        for k, val in fields.items():
            setattr(w, k, val)


def _snapshot_kind(env: Any) -> str | None:
    """How :func:`_env_state` snapshots ``env``: ``"state"`` (its own ``get_state``/``set_state``, e.g.
    MultiNormEnv), ``"mujoco"`` (gymnasium MuJoCo tasks), ``"classic"`` (gymnasium classic-control tasks such as
    Pendulum-v1, whose whole state is ``unwrapped.state`` and the generator), else None (no exact snapshot)."""
    if hasattr(env, "get_state") and hasattr(env, "set_state"):
        return "state"
    u = getattr(env, "unwrapped", None)
    if u is None:
        return None
    if hasattr(u, "data") and hasattr(u, "set_state"):
        return "mujoco"
    if type(u).__module__.startswith("gymnasium.envs.classic_control."):
        return "classic"
    return None


def _env_state(env: Any) -> Any:
    """A snapshot of the environment's state (kinds in :func:`_snapshot_kind`): the env's own state, or the
    unwrapped env's dynamic state and generator plus the wrappers' step counters and reset flags; None when the
    env cannot be snapshotted."""
    kind = _snapshot_kind(env)
    if kind == "state":
        return {"kind": kind, "state": env.get_state()}
    if kind is None:
        return None
    u = env.unwrapped
    st: dict[str, Any] = {"kind": kind, "rng": copy.deepcopy(u.np_random.bit_generator.state),
                          "wrappers": _wrapper_state(env)}
    if kind == "mujoco":
        d = u.data
        st.update(qpos=d.qpos.copy(), qvel=d.qvel.copy(), warm=d.qacc_warmstart.copy(), time=float(d.time))
    else:
        st["fields"] = {k: copy.deepcopy(getattr(u, k)) for k in _CLASSIC_FIELDS if k in vars(u)}
    return st


def _restore_env(env: Any, st: Any) -> bool:
    """Restore a snapshot from :func:`_env_state`; False when there is none (the episode then restarts)."""
    if st is None:
        return False
    if isinstance(st, tuple):  # checkpoints written before the classic-control snapshots
        if st[0] == "state":
            st = {"kind": "state", "state": st[1]}
        else:
            _, qpos, qvel, warm, t, rng, steps = st
            for w, n in zip([w for w in _wrappers(env) if hasattr(w, "_elapsed_steps")], steps, strict=False):
                w._elapsed_steps = n
            st = {"kind": "mujoco", "qpos": qpos, "qvel": qvel, "warm": warm, "time": t, "rng": rng, "wrappers": []}
    if st["kind"] == "state":
        env.set_state(st["state"])
        return True
    env.reset()  # wrappers that check the call order (OrderEnforcing, the passive checker) see a reset env
    u = env.unwrapped
    if st["kind"] == "mujoco":
        u.set_state(st["qpos"], st["qvel"])
        u.data.qacc_warmstart[:] = st["warm"]
        u.data.time = st["time"]
    else:
        for k, val in st["fields"].items():
            setattr(u, k, copy.deepcopy(val))
    u.np_random.bit_generator.state = st["rng"]
    _restore_wrappers(env, st["wrappers"])
    return True


def train(*, agent: TD3Agent, env: Any, eval_env: Any, total_steps: int, start_steps: int = 25_000,
          batch_size: int = 256, expl_noise: float = 0.1, eval_every: int = 5_000, eval_episodes: int = 10,
          seed: int = 0, timeout_is_terminal: bool = False, buffer_size: int | None = None,
          checkpoint: str | Path | None = None, stop_after: int | None = None, desc: str = "") -> dict[str, Any]:
    """Train ``agent`` on ``env`` for ``total_steps`` environment steps (one update per step after warm-up).

    Args:
        agent: a :class:`~icml24.alh.td3.TD3Agent` or :class:`~icml24.alh.alh.ALHAgent`.
        env, eval_env: training and evaluation environments (gymnasium-style API, Box action space).
        total_steps: environment steps T. start_steps: random-action warm-up steps (no updates).
        batch_size: B, transitions per update (must be <= start_steps: the buffer size when training starts).
        expl_noise: exploration noise std relative to a_max (>= 0).
        eval_every: evaluate at every multiple of ``eval_every`` steps from ``start_steps`` on, once before
            training and at the end (official: also during the warm-up, where the policy does not change).
        eval_episodes: episodes per evaluation. seed: seeds the runner's generators (eval env: ``seed + 100``).
        timeout_is_terminal: store time-limit ends as terminal (official MultiNormEnv code) or bootstrap through
            them (official MuJoCo code).
        checkpoint: file written at every evaluation; if it exists, training resumes from it.
        stop_after: stop once this step is reached and checkpointed (simulates an interruption).

    Returns:
        ``{"steps": [...], "returns": [...], "critic_loss": [...], "finite": bool, "episodes": int}``: the
        evaluation curve (step 0 first), mean critic loss per evaluation interval.
    """
    w = "alh.train"
    state_dim, action_dim, low, high = action_bounds(w, env)
    _, _, elow, ehigh = action_bounds(w, eval_env)
    if state_dim != agent.state_dim or action_dim != agent.action_dim:
        raise ValueError(f"{w}: the env has observation size {state_dim} and action size {action_dim}, the "
                         f"agent's networks expect {agent.state_dim} and {agent.action_dim}")
    for name, (lo, hi) in (("env", (low, high)), ("eval_env", (elow, ehigh))):
        if not (np.allclose(lo, agent.action_low, rtol=1e-6, atol=1e-6)
                and np.allclose(hi, agent.action_high, rtol=1e-6, atol=1e-6)):
            raise ValueError(f"{w}: the {name}'s action bounds [{lo}, {hi}] differ from the agent's "
                             f"[{agent.action_low}, {agent.action_high}] (give the agent action_low/action_high "
                             "or max_action to match)")
    if checkpoint is not None and _snapshot_kind(env) is None:
        raise ValueError(f"{w}: cannot checkpoint the env {env!r} ({type(getattr(env, 'unwrapped', env)).__name__}) "
                         "bit-exactly: resuming would restart its episode with other numbers. Supported: envs with "
                         "get_state()/set_state(), gymnasium MuJoCo and classic-control tasks; add get_state/"
                         "set_state to the env or train without a checkpoint")
    v.integer(w, "total_steps", total_steps, minimum=1)
    v.integer(w, "start_steps", start_steps, minimum=0)
    v.integer(w, "batch_size", batch_size, minimum=1)
    if batch_size > start_steps:
        raise ValueError(f"{w}: batch_size ({batch_size}) is larger than the buffer when training starts "
                         f"(start_steps={start_steps} transitions)")
    v.non_negative(w, "expl_noise", expl_noise)
    v.integer(w, "eval_every", eval_every, minimum=1)
    v.integer(w, "eval_episodes", eval_episodes, minimum=1)
    v.integer(w, "seed", seed, minimum=0)
    cap = total_steps if buffer_size is None else v.integer(w, "buffer_size", buffer_size, minimum=batch_size)

    scale = (high - low) / 2.0
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(state_dim=state_dim, action_dim=action_dim, capacity=cap, seed=seed + 2)
    log: dict[str, Any] = {"steps": [], "returns": [], "critic_loss": [], "finite": True, "episodes": 0}
    watch = bool(getattr(agent, "watch_during_training", False))
    ckpt = Path(checkpoint) if checkpoint is not None else None

    t0 = 0
    losses: list[float] = []
    if ckpt is not None and ckpt.exists():
        st = torch.load(ckpt, weights_only=False, map_location=agent.device)
        agent.load_state_dict(st["agent"])
        buf.load_state_dict(st["buffer"])
        rng.bit_generator.state = st["rng"]
        log = st["log"]
        t0 = st["t"]
        if _restore_env(env, st["env"]):
            s, ep_steps = st["obs"], st["ep_steps"]
        else:  # a checkpoint written without an env snapshot (older code): the interrupted episode restarts
            s, _ = env.reset()
            ep_steps = 0
    else:
        s, _ = env.reset(seed=seed)
        ep_steps = 0
        log["steps"].append(0)
        log["returns"].append(evaluate(agent, eval_env, episodes=eval_episodes, seed=seed + 100))
        log["critic_loss"].append(float("nan"))

    for t in progress(range(t0, total_steps), desc=desc or "alh train", total=total_steps - t0):
        if t < start_steps:
            a = env.random_action(rng) if hasattr(env, "random_action") else \
                rng.uniform(low, high, size=action_dim).astype(np.float32)
        else:  # exploration noise relative to the action scale (high − low)/2 (a_max; cleanrl: action_scale)
            a = np.clip(agent.act(s) + rng.normal(0.0, scale * expl_noise, size=action_dim),
                        low, high).astype(np.float32)
        s2, r, term, trunc, _ = env.step(a)
        ep_steps += 1
        if watch:
            agent.watch(s, a, float(r))
        buf.add(s, a, s2, float(r), float(term or (trunc and timeout_is_terminal)))
        s = s2
        if t >= start_steps:
            out = agent.update(buf.sample(batch_size, agent.device))
            losses.append(out["critic_loss"])
        if term or trunc:
            s, _ = env.reset()
            ep_steps = 0
            log["episodes"] += 1
            if watch:
                agent.forget()
        if ((t + 1) % eval_every == 0 and t + 1 >= start_steps) or t + 1 == total_steps:
            log["steps"].append(t + 1)
            log["returns"].append(evaluate(agent, eval_env, episodes=eval_episodes, seed=seed + 100))
            cl = float(np.mean(losses)) if losses else float("nan")
            log["critic_loss"].append(cl)
            log["finite"] = bool(log["finite"] and (not losses or math.isfinite(cl)))
            losses = []
            if ckpt is not None:
                st = {"agent": agent.state_dict(), "buffer": buf.state_dict(),
                      "rng": copy.deepcopy(rng.bit_generator.state), "log": copy.deepcopy(log), "t": t + 1,
                      "env": _env_state(env), "obs": np.array(s, copy=True), "ep_steps": ep_steps}
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                tmp = ckpt.with_name(ckpt.name + ".tmp")
                torch.save(st, tmp)
                os.replace(tmp, ckpt)
            if stop_after is not None and t + 1 >= stop_after:
                break
    return log

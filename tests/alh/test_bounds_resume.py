"""Issue 30's alh fixes: bit-exact resume on classic-control envs (or a clear refusal), asymmetric action bounds
(cleanrl's action_scale/action_bias), agent construction without global random side effects, and the detached
previous hypothesis of ``SetMemory.encode``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml24.alh import ALHAgent, MultiNormEnv, SetMemory, TD3Agent, make_env, td3_target, train
from icml24.alh.td3 import Actor, Critic

gym = pytest.importorskip("gymnasium")

PEND = dict(state_dim=3, action_dim=1, hidden=16, seed=0)


def _params(m):
    return [p.detach().clone() for p in m.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


class _Record(gym.Wrapper):
    """Records every action the runner sends to the env."""

    def __init__(self, env):
        super().__init__(env)
        self.actions = []

    def step(self, action):
        self.actions.append(np.array(action, copy=True))
        return self.env.step(action)


# ------------------------------------------------------------------------------------------ resume
def _pendulum(seed=None, steps=200):
    env = gym.make("Pendulum-v1", max_episode_steps=steps)
    if seed is not None:
        env.reset(seed=seed)
    return env


def _pendulum_run(agent, env, **extra):
    return train(agent=agent, env=env, eval_env=_pendulum(100, steps=50), total_steps=360, start_steps=300,
                 batch_size=16, expl_noise=0.1, eval_every=30, eval_episodes=1, seed=0, **extra)


def test_pendulum_resume_is_bit_exact(tmp_path):
    kw = {**PEND, "max_action": 2.0, "hypo_dim": 8, "subset_size": 4, "variant": "a"}
    ref_agent = ALHAgent(**kw)
    ref = _pendulum_run(ref_agent, _pendulum(0, steps=50))
    ckpt = tmp_path / "pend.pt"
    # 50-step episodes, interrupted at step 330: mid-episode (pendulum state, TimeLimit counter), and the episode
    # reset at step 350 draws from the env's generator
    first = _pendulum_run(ALHAgent(**kw), _pendulum(0, steps=50), checkpoint=ckpt, stop_after=330)
    assert first["steps"] == [0, 300, 330]
    # everything must come from the checkpoint: another init seed, an env never reset (OrderEnforcing)
    resumed = ALHAgent(**{**kw, "seed": 5})
    done = _pendulum_run(resumed, _pendulum(None, steps=50), checkpoint=ckpt)
    assert done["steps"] == ref["steps"] == [0, 300, 330, 360]
    assert done["returns"] == ref["returns"]
    np.testing.assert_array_equal(done["critic_loss"], ref["critic_loss"])
    assert done["episodes"] == ref["episodes"] == 7
    assert _same(_params(resumed.critic), _params(ref_agent.critic))
    assert _same(_params(resumed.actor), _params(ref_agent.actor))
    assert _same(_params(resumed.mem), _params(ref_agent.mem))


class _NoSnapshot:
    """A gymnasium-style env with no way to snapshot its state."""

    def __init__(self, seed=0):
        self._env = MultiNormEnv(seed=seed)
        self.observation_space, self.action_space = self._env.observation_space, self._env.action_space

    def reset(self, **kw):
        return self._env.reset(**kw)

    def step(self, a):
        return self._env.step(a)


def test_checkpoint_of_an_env_without_snapshot_is_refused(tmp_path):
    kw = dict(state_dim=1, action_dim=1, max_action=6.0, hidden=8, seed=0)
    with pytest.raises(ValueError, match="cannot checkpoint the env .*_NoSnapshot"):
        train(agent=TD3Agent(**kw), env=_NoSnapshot(), eval_env=MultiNormEnv(), total_steps=20, start_steps=10,
              batch_size=4, checkpoint=tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()
    # without a checkpoint the same env trains
    log = train(agent=TD3Agent(**kw), env=_NoSnapshot(), eval_env=MultiNormEnv(), total_steps=20, start_steps=10,
                batch_size=4, eval_every=10, eval_episodes=1)
    assert log["steps"] == [0, 10, 20]


# ------------------------------------------------------------------------------------------ action bounds
def _unit_box(env):
    """Pendulum's torque [-2, 2] seen as [0, 1] (the user's report)."""
    return gym.wrappers.RescaleAction(env, np.zeros(1, np.float32), np.ones(1, np.float32))


def test_asymmetric_bounds_train_and_stay_inside():
    env = _Record(_unit_box(make_env("Pendulum-v1", seed=0)))
    eval_env = _Record(_unit_box(make_env("Pendulum-v1", seed=100)))
    agent = ALHAgent(**{**PEND, "hypo_dim": 8, "subset_size": 4}, action_low=0.0, action_high=1.0)
    log = train(agent=agent, env=env, eval_env=eval_env, total_steps=260, start_steps=200, batch_size=16,
                expl_noise=0.5, eval_every=20, eval_episodes=1, seed=0)
    assert log["finite"] and log["steps"] == [0, 200, 220, 240, 260]
    for rec in (env, eval_env):
        a = np.concatenate(rec.actions)
        assert a.min() >= 0.0 and a.max() <= 1.0
    a = np.concatenate(env.actions)
    # the warm-up covers the whole box, not [-1, 1] clipped to [0, 1] (which would put half the mass at 0)
    assert np.mean(a[:200] == 0.0) < 0.01 and 0.4 < a[:200].mean() < 0.6 and a[:200].min() < 0.05
    # cleanrl's scaling: π = bias + scale · tanh(·), noise and its clip relative to the scale
    s = torch.randn(64, 3) * 5
    with torch.no_grad():
        out = agent.actor(s, agent.hypothesis())
    torch.testing.assert_close(out, 0.5 + 0.5 * torch.tanh(agent.actor.net(torch.cat(
        [s, agent.hypothesis().expand(64, -1)], -1))))
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    torch.testing.assert_close(agent.policy_noise, torch.tensor([0.1]))
    torch.testing.assert_close(agent.noise_clip, torch.tensor([0.25]))


def test_exploration_noise_is_relative_to_the_action_scale():
    class Spy(TD3Agent):
        def act(self, state):
            self.last = super().act(state)
            return self.last

    class Pair(gym.Wrapper):
        def __init__(self, env, agent):
            super().__init__(env)
            self.agent, self.noise = agent, []

        def step(self, action):
            if hasattr(self.agent, "last"):
                self.noise.append(float(np.asarray(action)[0] - self.agent.last[0]))
            return self.env.step(action)

    agent = Spy(**PEND, action_low=0.0, action_high=1.0)
    env = Pair(_unit_box(_pendulum(0)), agent)
    train(agent=agent, env=env, eval_env=_unit_box(_pendulum(100, steps=20)), total_steps=400, start_steps=200,
          batch_size=16, expl_noise=0.2, eval_every=100, eval_episodes=1, seed=0)
    noise = np.array(env.noise)
    assert noise.size == 400
    noise = noise[200:]  # after the random warm-up
    inside = noise[np.abs(noise) < 0.3]  # clipping at the box's edges only shortens the noise
    # sd = expl_noise · (high − low)/2 = 0.1 (not expl_noise · high = 0.2)
    assert inside.size > 150 and 0.08 < inside.std() < 0.12


def test_td3_target_clips_to_an_asymmetric_box():
    def actor(s, h):
        return s  # ã before noise = s'

    def critic(s, a, h):
        return a, a + 1.0

    s2 = torch.tensor([[-1.0, 0.5], [0.2, 3.0]])
    eps = torch.tensor([[0.0, 0.3], [0.9, -0.1]])
    lo, hi = torch.tensor([0.0, -1.0]), torch.tensor([1.0, 2.0])
    y = td3_target(actor_target=actor, critic_target=critic, s2=s2, r=torch.zeros(2, 1), not_done=torch.ones(2, 1),
                   eps=eps, h=None, gamma=1.0, noise_clip=torch.tensor([0.5, 0.2]), action_low=lo, action_high=hi)
    # row 0: (clip(-1 + 0, 0, 1), clip(0.5 + 0.2, -1, 2)) = (0, 0.7); row 1: (clip(0.2 + 0.5), clip(3 - 0.1)) = (0.7, 2)
    torch.testing.assert_close(y, torch.tensor([[0.0, 0.7], [0.7, 2.0]]))


# values recorded with the code before issue 30's change (commit 4f651f7): a symmetric box
# gives the same numbers as before
_OLD_TD3_MULTINORM = [2.0312890485383517, 2.0312890485383517, -32.931705166773554, -41.36833981460067]
_OLD_TD3_PENDULUM = [-1641.0634904459378, -1641.0634904459378, -1617.7254967449492, -1583.1554398491387]


def test_symmetric_box_gives_the_same_numbers_as_before():
    def multinorm(agent):
        return train(agent=agent, env=MultiNormEnv(seed=0), eval_env=MultiNormEnv(seed=100), total_steps=300,
                     start_steps=200, batch_size=16, expl_noise=0.1, eval_every=50, eval_episodes=2, seed=0,
                     timeout_is_terminal=True)

    kw = dict(state_dim=1, action_dim=1, hidden=16, seed=0)
    a = multinorm(TD3Agent(**kw, max_action=6.0))["returns"]
    b = multinorm(TD3Agent(**kw, action_low=-6.0, action_high=6.0))["returns"]
    assert a == b  # the two ways of giving a symmetric box are one code path
    # (tiny tolerance: BLAS kernels may round differently on another CPU)
    np.testing.assert_allclose(a, _OLD_TD3_MULTINORM, rtol=1e-6)
    p = train(agent=TD3Agent(**PEND, max_action=2.0), env=make_env("Pendulum-v1", seed=0),
              eval_env=make_env("Pendulum-v1", seed=100), total_steps=360, start_steps=300, batch_size=16,
              expl_noise=0.1, eval_every=30, eval_episodes=1, seed=0)["returns"]
    np.testing.assert_allclose(p, _OLD_TD3_PENDULUM, rtol=1e-6)


def test_bad_bounds_raise_before_compute():
    with pytest.raises(ValueError, match="either max_action or action_low"):
        TD3Agent(**PEND, max_action=2.0, action_low=-2.0, action_high=2.0)
    with pytest.raises(ValueError, match="bounds are missing"):
        TD3Agent(**PEND)
    with pytest.raises(ValueError, match="low < high"):
        TD3Agent(**PEND, action_low=1.0, action_high=1.0)
    with pytest.raises(ValueError, match="action_dim=2 entries"):
        TD3Agent(**{**PEND, "action_dim": 2}, action_low=[0.0, 0.0, 0.0], action_high=1.0)
    env = _unit_box(make_env("Pendulum-v1", seed=0))
    with pytest.raises(ValueError, match=r"action bounds .* differ from the agent's"):
        train(agent=TD3Agent(**PEND, max_action=2.0), env=env, eval_env=env, total_steps=10, start_steps=5,
              batch_size=2)


# ------------------------------------------------------------------------------------------ seeding
def test_agent_construction_leaves_the_global_generator_alone():
    state = torch.random.get_rng_state()
    a1 = TD3Agent(**PEND, max_action=2.0)
    g1 = ALHAgent(**PEND, max_action=2.0, hypo_dim=8, subset_size=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    # same seed, same agent, whatever the global generator did in between; another seed, another agent
    torch.manual_seed(123)
    a2 = TD3Agent(**PEND, max_action=2.0)
    g2 = ALHAgent(**PEND, max_action=2.0, hypo_dim=8, subset_size=4)
    assert _same(_params(a1.actor), _params(a2.actor)) and _same(_params(a1.critic), _params(a2.critic))
    assert _same(_params(g1.mem), _params(g2.mem)) and _same(_params(g1.critic), _params(g2.critic))
    assert not _same(_params(a1.actor), _params(TD3Agent(**{**PEND, "seed": 1}, max_action=2.0).actor))
    torch.random.set_rng_state(state)


def test_local_initialisation_equals_the_old_global_seeding():
    # the networks are those the old code built after torch.manual_seed(seed): the committed runs keep their numbers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        actor = Actor(state_dim=3, action_dim=1, max_action=2.0, hidden=16, hypo_dim=8)
        critic = Critic(state_dim=3, action_dim=1, hidden=16, hypo_dim=8)
        mem = SetMemory(state_dim=3, action_dim=1, hidden=16, hypo_dim=8)
    ag = ALHAgent(**{**PEND, "seed": 3}, max_action=2.0, hypo_dim=8, subset_size=4)
    assert _same(_params(actor), _params(ag.actor)) and _same(_params(critic), _params(ag.critic))
    assert _same(_params(mem), _params(ag.mem))
    assert _same(_params(ag.actor), _params(ag.actor_target))


# ------------------------------------------------------------------------------------------ detach
def test_encode_detaches_the_previous_hypothesis():
    mem = SetMemory(state_dim=2, action_dim=1, hidden=8, hypo_dim=4)
    x1, x2 = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)), torch.randn(6, 4)
    prev = torch.randn(4, requires_grad=True)
    h = mem.encode(x2, prev=prev)
    (g,) = torch.autograd.grad(h.sum(), [prev], allow_unused=True)
    assert g is None  # no gradient reaches the previous hypothesis
    # and through the chain h₁ = enc(O₁), h = enc(O₂, h₁): E's gradient from h comes from O₂ only
    h1 = mem.encode(x1)
    h = mem.encode(x2, prev=h1)
    grads = torch.autograd.grad((h * torch.arange(4.0)).sum(), list(mem.encoder.parameters()))
    ref = torch.autograd.grad((mem.encode(x2, prev=mem.encode(x1).detach()) * torch.arange(4.0)).sum(),
                              list(mem.encoder.parameters()))
    for a, b in zip(grads, ref, strict=True):
        torch.testing.assert_close(a, b)

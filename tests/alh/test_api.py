"""ALH and TD3: set-encoder invariants, detached hypotheses, reset rules, TD3's update against a hand computation,
the environment, determinism, checkpoint resume and bad-input errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icml24.alh import (
    ALHAgent,
    MultiNormEnv,
    ReplayBuffer,
    SetMemory,
    TD3Agent,
    evaluate,
    subset_indices,
    td3_target,
    train,
)
from icml24.alh.experiment import Config

KW = dict(state_dim=1, action_dim=1, max_action=6.0, hidden=16, seed=0)


def _alh(**kw):
    return ALHAgent(**{**KW, "hypo_dim": 8, "subset_size": 4, **kw})


def _batch(n=16, seed=0, sd=1, ad=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, sd, generator=g), torch.rand(n, ad, generator=g) * 2 - 1, torch.randn(n, sd, generator=g),
            torch.randn(n, 1, generator=g), (torch.rand(n, 1, generator=g) > 0.2).float())


def _params(m):
    return [p.detach().clone() for p in m.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------ environment
def test_multinorm_env_reward_dynamics_and_bias():
    env = MultiNormEnv(seed=0)
    sig = 20.0
    # at a mode, the reward is c_k times the Gaussian peak (neighbours 120 apart contribute < 1e-7)
    np.testing.assert_allclose(env.reward(480.0), 27.0 / (sig * np.sqrt(2 * np.pi)), rtol=1e-6)
    np.testing.assert_allclose(env.reward(240.0), 3.0 / (sig * np.sqrt(2 * np.pi)), rtol=1e-6)
    s, _ = env.reset(seed=1)
    s2, r, term, trunc, _ = env.step(np.array([2.5]))
    assert s2[0] == pytest.approx(s[0] + 2.5, abs=1e-4) and r == pytest.approx(float(env.reward(s[0] + 2.5)), rel=1e-5)
    # leaving [0, 600] ends the episode; 100 steps truncate it
    env.set_state({"pos": 3.0, "t": 0, "rng": env.rng.bit_generator.state})
    assert env.step(np.array([-6.0]))[2] is True
    env.reset()
    env.set_state({"pos": 300.0, "t": 0, "rng": env.rng.bit_generator.state})
    flags = [env.step(np.array([0.0]))[2:4] for _ in range(100)]
    assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])
    biased = MultiNormEnv(biased=True, seed=0)
    starts = np.array([biased.reset()[0][0] for _ in range(200)])
    assert starts.min() >= 200 and starts.max() <= 260
    assert np.all(biased.random_action(np.random.default_rng(0)) == 0)
    starts = np.array([env.reset()[0][0] for _ in range(200)])
    assert starts.min() < 100 and starts.max() > 500


# ------------------------------------------------------------------------------------------ set memory
@pytest.mark.parametrize("B,m", [(5, 1), (16, 4), (33, 33), (64, 7)])
def test_subset_contains_anchor_row(B, m):
    idx = subset_indices(B, m, generator=torch.Generator().manual_seed(B * m))
    assert idx.shape == (B, m) and idx.min() >= 0 and idx.max() < B
    assert all(i in idx[i].tolist() for i in range(B))


def test_set_encoder_is_permutation_invariant_and_unit_norm():
    torch.manual_seed(0)
    mem = SetMemory(state_dim=3, action_dim=2, hidden=16, hypo_dim=8)
    x = torch.randn(20, 6)
    perm = torch.randperm(20)
    torch.testing.assert_close(mem.encode(x[perm]), mem.encode(x))
    prev = torch.randn(8)
    h = mem.encode(x, prev=prev)
    torch.testing.assert_close(h, mem.encode(x[perm], prev=prev))
    assert h.norm().item() == pytest.approx(1.0, abs=1e-5)
    # the mean of unit codes without a previous hypothesis is not renormalised (norm <= 1)
    assert mem.encode(x).norm() <= 1.0 + 1e-6
    # codes are E(o) / max(‖E(o)‖, ε)
    e = mem.encoder(x)
    torch.testing.assert_close(mem.codes(x), e / e.norm(dim=-1, keepdim=True).clamp_min(0.03))


def test_subset_encode_matches_encoding_every_subset():
    torch.manual_seed(1)
    mem = SetMemory(state_dim=2, action_dim=1, hidden=16, hypo_dim=8)
    x = torch.randn(12, 4)
    fast = mem.subset_encode(x, 5, generator=torch.Generator().manual_seed(3))
    idx = subset_indices(12, 5, generator=torch.Generator().manual_seed(3))
    slow = torch.stack([mem.encode(x[idx[i]]) for i in range(12)])
    torch.testing.assert_close(fast, slow)


def test_dae_loss_broadcasts_one_hypothesis():
    torch.manual_seed(2)
    mem = SetMemory(state_dim=2, action_dim=1, hidden=16, hypo_dim=8)
    x, h = torch.randn(10, 4), torch.randn(8)
    a = mem.dae_loss(x, h, generator=torch.Generator().manual_seed(0))
    b = mem.dae_loss(x, h.expand(10, -1), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a, b)
    # without noise the loss is the decoder's reconstruction error
    mem0 = copy.deepcopy(mem)
    mem0.ae_noise = 0.0
    torch.testing.assert_close(mem0.dae_loss(x, h, generator=torch.Generator()),
                               F.mse_loss(mem.decoder(torch.cat([x, h.expand(10, -1)], -1)), x))


def test_actor_and_critic_broadcast_one_hypothesis():
    ag = _alh()
    s, a = torch.randn(7, 1), torch.rand(7, 1)
    h = torch.randn(8)
    torch.testing.assert_close(ag.actor(s, h), ag.actor(s, h.expand(7, -1)))
    for x, y in zip(ag.critic(s, a, h), ag.critic(s, a, h.expand(7, -1)), strict=True):
        torch.testing.assert_close(x, y)
    with pytest.raises(ValueError, match="hypothesis"):
        ag.actor(s, None)


# ------------------------------------------------------------------------------------------ ALH learning
def test_hypothesis_is_detached_from_rl_losses():
    ag = _alh(mem_every=10**9)  # the memory is never trained here: only RL losses run
    mem0, h00, actor0 = _params(ag.mem), ag.h0.detach().clone(), _params(ag.actor)
    b = _batch()
    h = ag.batch_hypothesis(*b[:2], b[3])
    assert not h.requires_grad and h.grad_fn is None
    for _ in range(4):
        ag.update(b)
    assert _same(mem0, _params(ag.mem)) and torch.equal(h00, ag.h0.detach())
    assert all(p.grad is None for p in ag.mem.parameters()) and ag.h0.grad is None
    assert not _same(actor0, _params(ag.actor))


def test_memory_step_trains_encoder_decoder_and_prior_only():
    ag = _alh(mem_every=1)
    b = _batch(32)
    actor0, critic0, mem0, h00 = _params(ag.actor), _params(ag.critic), _params(ag.mem), ag.h0.detach().clone()
    out = ag.memory_step(ag.mem.transitions(b[0], b[1], b[3]))
    assert _same(actor0, _params(ag.actor)) and _same(critic0, _params(ag.critic))
    assert not _same(mem0, _params(ag.mem)) and not torch.equal(h00, ag.h0.detach())
    assert out["diversity"] <= 0.0 and np.isfinite(out["mem_loss"])


def test_watch_is_a_unit_norm_incremental_update_and_forget_resets_to_prior():
    ag = _alh()
    with torch.no_grad():
        ag.h0.copy_(torch.randn(8))
    torch.testing.assert_close(ag.hypothesis(), ag.h0.detach())
    ag.watch(np.array([3.0]), np.array([1.0]), -0.5)
    x = torch.tensor([[3.0, 1.0, -0.5]])
    expect = F.normalize(ag.mem.codes(x)[0] + ag.h0.detach(), dim=-1, eps=0.03)
    torch.testing.assert_close(ag.hypothesis(), expect)
    for i in range(5):
        ag.watch(np.array([float(i)]), np.array([0.5]), 0.1)
        assert ag.hypothesis().norm().item() == pytest.approx(1.0, abs=1e-5)
    ag.forget()
    torch.testing.assert_close(ag.hypothesis(), ag.h0.detach())


class _Spy(ALHAgent):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def watch(self, *a, **k):
        self.calls.append("w")
        super().watch(*a, **k)

    def forget(self):
        self.calls.append("f")
        super().forget()


def _short(agent, steps=300, start=200, seed=0):
    return train(agent=agent, env=MultiNormEnv(biased=True, seed=seed), eval_env=MultiNormEnv(seed=seed + 100),
                 total_steps=steps, start_steps=start, batch_size=16, expl_noise=0.1, eval_every=50,
                 eval_episodes=2, seed=seed, timeout_is_terminal=True)


def test_reset_rules_of_alh_a_and_alh_g():
    ev_steps = []

    class Count(MultiNormEnv):
        def step(self, a):
            ev_steps.append(1)
            return super().step(a)

    for variant in ("a", "g"):
        ev_steps.clear()
        ag = _Spy(**{**KW, "hypo_dim": 8, "subset_size": 4}, variant=variant)
        env = MultiNormEnv(biased=True, seed=0)
        log = train(agent=ag, env=env, eval_env=Count(seed=100), total_steps=260, start_steps=200, batch_size=16,
                    expl_noise=0.1, eval_every=130, eval_episodes=2, seed=0, timeout_is_terminal=True)
        n_eval = len(log["steps"])
        watches, forgets = ag.calls.count("w"), ag.calls.count("f")
        if variant == "a":  # every training step watched, one forget per episode end and one per evaluation
            assert watches == 260 + len(ev_steps) and forgets == log["episodes"] + n_eval
        else:  # ALH-g: only evaluation touches the hypothesis (one forget per evaluation, not per episode)
            assert watches == len(ev_steps) and forgets == n_eval
    # ALH-g acts during training with the hypothesis left by the last evaluation
    ag = _alh(variant="g")
    _short(ag)
    h_left = ag.hypothesis().clone()
    evaluate(ag, MultiNormEnv(seed=100), episodes=2, seed=100)
    torch.testing.assert_close(ag.hypothesis(), h_left)


def test_evaluation_does_not_reset_the_hypothesis_between_episodes():
    ag = _Spy(**{**KW, "hypo_dim": 8, "subset_size": 4})
    evaluate(ag, MultiNormEnv(seed=5), episodes=3, seed=5)
    assert ag.calls[0] == "f" and ag.calls.count("f") == 1 and ag.calls.count("w") >= 3


# ------------------------------------------------------------------------------------------ TD3
def test_td3_target_smoothing_by_hand():
    s2 = torch.tensor([[1.0], [2.0], [-1.0]])
    r = torch.tensor([[0.5], [-1.0], [2.0]])
    nd = torch.tensor([[1.0], [0.0], [1.0]])
    eps = torch.tensor([[0.3], [-2.0], [5.0]])

    def actor(s, h):
        return 4.0 * s  # 4, 8, -4

    def critic(s, a, h):
        return a + s, 2 * a - s

    y = td3_target(actor_target=actor, critic_target=critic, s2=s2, r=r, not_done=nd, eps=eps, h=None, gamma=0.9,
                   noise_clip=1.0, max_action=6.0)
    # row 0: ã = clip(4 + 0.3) = 4.3; Q = (5.3, 7.6) -> 5.3; y = 0.5 + 0.9·5.3
    # row 1: done -> y = r; row 2: ã = clip(-4 + clip(5, ±1)) = -3; Q = (-4, -5) -> -5; y = 2 - 4.5
    torch.testing.assert_close(y, torch.tensor([[0.5 + 0.9 * 5.3], [-1.0], [2.0 - 0.9 * 5.0]]))
    # row 1 without the done flag: ã = clip(8 - 1) = 6 (action clip); Q = (8, 10) -> 8
    y1 = td3_target(actor_target=actor, critic_target=critic, s2=s2[1:2], r=r[1:2], not_done=torch.ones(1, 1),
                    eps=eps[1:2], h=None, gamma=0.9, noise_clip=1.0, max_action=6.0)
    torch.testing.assert_close(y1, torch.tensor([[-1.0 + 0.9 * 8.0]]))


def test_td3_update_critic_loss_and_delayed_actor_target_updates():
    ag = TD3Agent(**{**KW, "hidden": 8}, tau=0.1, policy_freq=2, policy_noise=0.2, noise_clip=0.5)
    b = _batch()
    s, a, s2, r, nd = b
    gen = ag.gen.get_state()
    actor0, critic0 = _params(ag.actor), _params(ag.critic)
    # step 1: the critic loss is the clipped double-Q loss with the smoothed target, the actor does not move
    eps = torch.randn(a.shape, generator=torch.Generator().manual_seed(0).set_state(gen)) * 0.2 * 6.0
    y = td3_target(actor_target=ag.actor_target, critic_target=ag.critic_target, s2=s2, r=r, not_done=nd, eps=eps,
                   h=None, gamma=0.99, noise_clip=0.5 * 6.0, max_action=6.0)
    q1, q2 = ag.critic(s, a)
    expect = float((F.mse_loss(q1, y) + F.mse_loss(q2, y)).detach())
    out = ag.update(b)
    assert out["critic_loss"] == pytest.approx(expect, rel=1e-6) and "actor_loss" not in out
    assert _same(actor0, _params(ag.actor)) and _same(actor0, _params(ag.actor_target))
    assert _same(critic0, _params(ag.critic_target)) and not _same(critic0, _params(ag.critic))
    # step 2: actor updated, then targets θ' ← τθ + (1 − τ)θ'
    out = ag.update(b)
    assert "actor_loss" in out and not _same(actor0, _params(ag.actor))
    for pt, p, p0 in zip(ag.critic_target.parameters(), ag.critic.parameters(), critic0, strict=True):
        torch.testing.assert_close(pt, 0.1 * p + 0.9 * p0)
    for pt, p, p0 in zip(ag.actor_target.parameters(), ag.actor.parameters(), actor0, strict=True):
        torch.testing.assert_close(pt, 0.1 * p + 0.9 * p0)
    # step 3: only the critic moves again
    ta = _params(ag.actor_target)
    ag.update(b)
    assert _same(ta, _params(ag.actor_target))


# ------------------------------------------------------------------------------------------ runs
@pytest.mark.parametrize("make", [lambda: TD3Agent(**KW), lambda: _alh(variant="a")])
def test_short_run_is_deterministic_under_a_seed_and_finite(make):
    a1, a2 = make(), make()
    l1, l2 = _short(a1), _short(a2)
    assert l1["returns"] == l2["returns"] and l1["finite"] and l1["steps"] == [0, 200, 250, 300]
    assert np.all(np.isfinite(l1["critic_loss"][2:]))
    assert _same(_params(a1.actor), _params(a2.actor))


def test_resume_from_checkpoint_continues_identically(tmp_path):
    full = _alh(variant="a")
    ref = _short(full, steps=390)
    part = _alh(variant="a")
    kw = dict(env=MultiNormEnv(biased=True, seed=0), eval_env=MultiNormEnv(seed=100), total_steps=390,
              start_steps=200, batch_size=16, expl_noise=0.1, eval_every=50, eval_episodes=2, seed=0,
              timeout_is_terminal=True, checkpoint=tmp_path / "c.pt")
    first = train(agent=part, stop_after=250, **kw)
    assert first["steps"] == [0, 200, 250]
    fresh = _alh(variant="a", seed=7)  # different init: everything must come from the checkpoint
    kw["env"] = MultiNormEnv(biased=True, seed=99)
    done = train(agent=fresh, **kw)
    assert done["returns"] == ref["returns"]
    assert _same(_params(fresh.actor), _params(full.actor)) and _same(_params(fresh.mem), _params(full.mem))


def test_replay_buffer_sampling_and_fifo():
    buf = ReplayBuffer(state_dim=1, action_dim=1, capacity=3, seed=0)
    for i in range(5):
        buf.add(np.array([i]), np.array([0.0]), np.array([i + 1]), float(i), 0.0)
    assert len(buf) == 3 and sorted(buf.s[:, 0].tolist()) == [2.0, 3.0, 4.0]
    s, a, s2, r, nd = buf.sample(3)
    torch.testing.assert_close(s2, s + 1)
    torch.testing.assert_close(r, s)
    assert torch.all(nd == 1)


# ------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise_before_compute():
    gym = pytest.importorskip("gymnasium")

    class DiscreteEnv(MultiNormEnv):
        def __init__(self):
            super().__init__()
            self.action_space = gym.spaces.Discrete(3)

    with pytest.raises(TypeError, match="Box"):
        train(agent=TD3Agent(**KW), env=DiscreteEnv(), eval_env=MultiNormEnv(), total_steps=10, start_steps=5,
              batch_size=2)
    with pytest.raises(ValueError, match="expect 3"):
        train(agent=TD3Agent(**{**KW, "state_dim": 3}), env=MultiNormEnv(), eval_env=MultiNormEnv(),
              total_steps=10, start_steps=5, batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        train(agent=TD3Agent(**KW), env=MultiNormEnv(), eval_env=MultiNormEnv(), total_steps=10, start_steps=5,
              batch_size=6)
    with pytest.raises(ValueError, match="expl_noise"):
        train(agent=TD3Agent(**KW), env=MultiNormEnv(), eval_env=MultiNormEnv(), total_steps=10, start_steps=5,
              batch_size=2, expl_noise=-0.1)
    with pytest.raises(ValueError, match="hypo_dim"):
        ALHAgent(**KW, hypo_dim=0)
    with pytest.raises(ValueError, match="policy_noise"):
        TD3Agent(**KW, policy_noise=-0.2)
    with pytest.raises(ValueError, match="ae_noise"):
        ALHAgent(**KW, ae_noise=-1.0)
    with pytest.raises(ValueError, match="variant"):
        ALHAgent(**KW, variant="x")
    with pytest.raises(ValueError, match="4 features"):
        TD3Agent(**{**KW, "state_dim": 3}).act(np.zeros(4))
    with pytest.raises(ValueError, match="larger than the buffer"):
        ReplayBuffer(state_dim=1, action_dim=1, capacity=4).sample(2)


def test_config_validation():
    with pytest.raises(ValueError, match="disjoint"):
        Config(seeds=(0, 1), val_seeds=(1,))
    with pytest.raises(ValueError, match="batch_size"):
        Config(batch_size=512, start_steps=100)
    with pytest.raises(ValueError, match="hypo_dim"):
        Config(hypo_dim=0)
    with pytest.raises(ValueError, match="expl_noise"):
        Config(expl_noise=-1.0)
    assert Config.slow().mujoco_env == "InvertedPendulum-v5"


def test_mujoco_inverted_pendulum_runs_and_resumes_identically(tmp_path):
    pytest.importorskip("mujoco")
    from icml24.alh import make_env

    def go(agent, **extra):
        return train(agent=agent, env=make_env("InvertedPendulum-v5", seed=0),
                     eval_env=make_env("InvertedPendulum-v5", seed=100), total_steps=360, start_steps=300,
                     batch_size=16, expl_noise=0.1, eval_every=30, eval_episodes=1, seed=0, **extra)

    kw = {**KW, "state_dim": 4, "max_action": 3.0, "hypo_dim": 8, "subset_size": 4}
    ref_agent = ALHAgent(**kw)
    ref = go(ref_agent)
    assert ref["steps"] == [0, 300, 330, 360] and ref["finite"] and all(r >= 1 for r in ref["returns"])
    go(ALHAgent(**kw), checkpoint=tmp_path / "ip.pt", stop_after=330)
    resumed = ALHAgent(**{**kw, "seed": 3})
    assert go(resumed, checkpoint=tmp_path / "ip.pt")["returns"] == ref["returns"]
    assert _same(_params(resumed.critic), _params(ref_agent.critic))

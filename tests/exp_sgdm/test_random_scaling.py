"""RandomScaling: exactness vs the paper's Exp-SGDM, lr/snapshot agreement, the stream, schedulers, DDP ranks."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from icml24.exp_sgdm import ExpSGDM, RandomScaling

DT = torch.float64
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).double()


def _train(net, opt, steps=30, sched=None):
    g = torch.Generator().manual_seed(123)
    for _ in range(steps):
        xb, yb = torch.randn(32, 5, generator=g, dtype=DT), torch.randint(0, 3, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xb), yb).backward()
        opt.step()
        if sched is not None:
            sched.step()
    return net


@pytest.mark.parametrize("mode", ["lr", "snapshot"])
def test_wrapped_sgd_momentum_is_the_papers_exp_sgdm(mode):
    eta, beta = 0.3, 0.9
    ref = _net()
    ref_opt = ExpSGDM(ref.parameters(), lr=eta, momentum=beta, generator=torch.Generator().manual_seed(7))
    _train(ref, ref_opt)
    net = _net()
    opt = RandomScaling(torch.optim.SGD(net.parameters(), lr=eta * (1 - beta), momentum=beta, foreach=True),
                        generator=torch.Generator().manual_seed(7), mode=mode)
    _train(net, opt)
    assert opt.last_scale == ref_opt.last_scale and opt.num_steps == 30
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    # the control: the same SGD without scaling ends elsewhere
    plain = _net()
    _train(plain, torch.optim.SGD(plain.parameters(), lr=eta * (1 - beta), momentum=beta))
    assert not torch.allclose(next(plain.parameters()), next(net.parameters()))


@pytest.mark.parametrize("factory", [
    lambda p: torch.optim.Adam(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
], ids=["Adam", "AdamW", "SGD-nesterov", "RMSprop"])
def test_lr_mode_and_snapshot_mode_agree(factory):
    nets, opts = [], []
    for mode in ("lr", "snapshot"):
        net = _net()
        opt = RandomScaling(factory(net.parameters()), generator=torch.Generator().manual_seed(3), mode=mode)
        nets.append(_train(net, opt, steps=20))
        opts.append(opt)
    assert opts[0].mode == "lr" and opts[1].mode == "snapshot"
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    for p0, p1 in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        for k, v0 in opts[0].state[p0].items():
            torch.testing.assert_close(torch.as_tensor(v0), torch.as_tensor(opts[1].state[p1][k]), rtol=1e-8,
                                       atol=1e-10)
    # lr is restored exactly after every step
    assert opts[0].param_groups[0]["lr"] == factory([torch.nn.Parameter(torch.ones(1))]).param_groups[0]["lr"]


def test_snapshot_mode_scales_any_optimizers_update():
    # Rprop's step is not linear in lr: auto picks the snapshot; x_new - x_old = s * (unwrapped update)
    w = torch.nn.Parameter(torch.randn(7, dtype=DT))
    opt = RandomScaling(torch.optim.Rprop([w], lr=0.05), generator=torch.Generator().manual_seed(0))
    assert opt.mode == "snapshot"
    w_ref = torch.nn.Parameter(w.detach().clone())
    ref = torch.optim.Rprop([w_ref], lr=0.05)
    for k in range(5):
        g = torch.randn(7, dtype=DT, generator=torch.Generator().manual_seed(k))
        w.grad, w_ref.grad = g.clone(), g.clone()
        x0 = w.detach().clone()
        w_ref.data.copy_(x0)
        opt.step(), ref.step()
        torch.testing.assert_close(w.detach() - x0, opt.last_scale * (w_ref.detach() - x0), rtol=1e-10, atol=1e-12)
        # the learner's state (step sizes, previous gradient) never sees s
        for key in ("prev", "step_size"):
            torch.testing.assert_close(opt.state[w][key], ref.state[w_ref][key], rtol=0, atol=0)


def test_auto_mode_and_scales_come_from_the_generator():
    class MySGD(torch.optim.SGD):
        pass
    w = torch.nn.Parameter(torch.ones(3, dtype=DT))
    assert RandomScaling(torch.optim.AdamW([w])).mode == "lr"
    assert RandomScaling(MySGD([w], lr=0.1)).mode == "snapshot"  # a subclass may override step
    opt = RandomScaling(torch.optim.SGD([w], lr=0.1), generator=torch.Generator().manual_seed(5))
    assert opt.last_scale is None
    g = torch.Generator().manual_seed(5)
    expected = [float(torch.empty((), dtype=DT).exponential_(1.0, generator=g)) for _ in range(4)]
    got = []
    for _ in range(4):
        w.grad = torch.ones(3, dtype=DT)
        opt.step()
        got.append(opt.last_scale)
    assert got == expected and len(set(got)) == 4


def test_state_dict_carries_the_random_stream():
    net = _net()
    opt = RandomScaling(torch.optim.Adam(net.parameters(), lr=1e-2), generator=torch.Generator().manual_seed(1))
    _train(net, opt, steps=3)
    saved_net, saved = copy.deepcopy(net.state_dict()), copy.deepcopy(opt.state_dict())
    assert "random_scaling" in saved
    _train(net, opt, steps=3)
    net2 = _net(seed=9)
    net2.load_state_dict(saved_net)
    opt2 = RandomScaling(torch.optim.Adam(net2.parameters(), lr=1e-2), generator=torch.Generator().manual_seed(99))
    opt2.load_state_dict(saved)
    assert opt2.num_steps == 3
    _train(net2, opt2, steps=3)
    assert opt2.last_scale == opt.last_scale
    for a, b in zip(net.parameters(), net2.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    twin = copy.deepcopy({"net": net, "opt": opt})  # a copy keeps the wrapped optimizer and the stream
    _train(net, opt, steps=2)
    _train(twin["net"], twin["opt"], steps=2)
    assert twin["opt"].last_scale == opt.last_scale and isinstance(twin["opt"].optimizer, torch.optim.Adam)


def test_schedulers_hooks_and_default_generator():
    net = _net()
    opt = RandomScaling(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    assert isinstance(opt, torch.optim.Optimizer)
    calls = []
    opt.register_step_post_hook(lambda o, a, k: calls.append(1))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    _train(net, opt, steps=4, sched=sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025) and len(calls) == 4

    def scales(seed):
        torch.manual_seed(seed)
        w = torch.nn.Parameter(torch.ones(2))
        o = RandomScaling(torch.optim.SGD([w], lr=0.1))
        out = []
        for _ in range(3):
            w.grad = torch.ones(2)
            o.step()
            out.append(o.last_scale)
        return out
    assert scales(4) == scales(4) and scales(4) != scales(5)


@pytest.mark.parametrize("which, kw, exc, match", [
    ("int", {}, TypeError, "optimizer must be a torch.optim.Optimizer"),
    ("sgd", {"mode": "fast"}, ValueError, "mode must be one of"),
    ("rprop", {"mode": "lr"}, ValueError, "mode 'lr' needs an optimizer whose update is linear in lr"),
    ("sgd", {"generator": 3}, TypeError, "generator must be a torch.Generator"),
    ("wrapped", {}, ValueError, "already wrapped"),
])
def test_bad_arguments(which, kw, exc, match):
    w = torch.nn.Parameter(torch.ones(2))
    opt = {"int": lambda: 3, "sgd": lambda: torch.optim.SGD([w], lr=0.1), "rprop": lambda: torch.optim.Rprop([w]),
           "wrapped": lambda: RandomScaling(torch.optim.SGD([w], lr=0.1))}[which]()
    with pytest.raises(exc, match=match):
        RandomScaling(opt, **kw)


_WORKER = textwrap.dedent("""
    import json, sys, datetime
    import torch, torch.distributed as dist
    from icml24.exp_sgdm import RandomScaling
    rank, out = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(100 + rank)  # a different default stream on each rank
    w = torch.nn.Parameter(torch.ones(4))
    opt = RandomScaling(torch.optim.SGD([w], lr=0.1, momentum=0.9))
    g = torch.Generator()
    g.set_state(opt.generator.get_state())
    local = float(torch.empty((), dtype=torch.float64).exponential_(1.0, generator=g))
    scales = []
    for k in range(5):
        w.grad = torch.full((4,), float(rank + k))
        opt.step()
        scales.append(opt.last_scale)
    json.dump({"local_first": local, "scales": scales}, open(out, "w"))
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_ddp_rank_draws_the_same_scale(tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(r), str(tmp_path / f"r{r}.json")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    try:
        logs = [p.communicate(timeout=240)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), logs
    r0, r1 = (json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2))
    assert r0["local_first"] != r1["local_first"]  # unsynchronised, the ranks would draw different s
    assert r0["scales"] == r1["scales"]
    assert r0["scales"][0] == r0["local_first"]  # rank 0's stream is the one every rank follows

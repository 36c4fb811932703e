"""SpikeZIP-TF: simulation throughput (images/s) at fixed T, against the conventional conversion; SOPs vs MACs.

Three measurements, one thread, best of ``--repeats`` runs each:

1. ViT (tiny ReLU ViT on sklearn digits, trained ``--train-epochs`` epochs, quantizers calibrated): the QANN forward,
   SpikeZIP-TF's simulation at T in ``--T`` (multi-step, the default, and step by step, ``chunk=1``; their outputs
   are checked to be identical), and the conventional rate-coded conversion (``rate_convert``) of the same ANN.
   With ``--baseline-src DIR`` the same SpikeZIP-TF simulation also runs on another checkout's ``src`` (e.g. the
   code before the multi-step simulation) in a subprocess, and its outputs are compared with this one's.
2. MLP (64-256-256-10, the subset SpikingJelly's ``ann2snn`` converts): SpikingJelly's multi-step IF neurons
   (``RateCodingRecipe``, ``step_mode="m"``), this package's rate-coded IF neurons, and SpikeZIP-TF's ST-BIF neurons
   (multi-step) on the same network, at each T.
3. Synaptic operations per image (cumulative, at each T and at quiescence) against the ANN's MACs per image.

    python benchmarks/spikezip_tf_throughput.py [--batch 64] [--T 16 64] [--baseline-src /path/to/old/src]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common.data import digits_images
from icml24.common.nets import MLP, TinyViT
from icml24.spikezip_tf import calibrate, convert, count_macs, quantize, rate_convert, rate_simulate, simulate


def best_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def build_vit(a: argparse.Namespace):
    torch.manual_seed(0)
    data = digits_images(seed=0, test_size=0.2)
    xtr, ytr = (data.x_train - 0.5) / 0.5, data.y_train
    x = ((data.x_test - 0.5) / 0.5)[: a.batch]
    ann = TinyViT(embed_dim=a.embed_dim, depth=a.depth, num_heads=a.heads, act_layer=nn.ReLU,
                  norm_layer=partial(nn.LayerNorm, eps=1e-6))
    opt = torch.optim.AdamW(ann.parameters(), lr=1e-3)
    for _ in range(a.train_epochs):
        for i in range(0, len(ytr), 64):
            loss = F.cross_entropy(ann(xtr[i:i + 64]), ytr[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    ann.eval()
    qann = quantize(ann, level=a.level)
    calibrate(qann, xtr[:256])
    dt = getattr(torch, a.dtype)
    return ann, qann.to(dt).eval(), xtr, x.to(dt)


def baseline_child(a: argparse.Namespace) -> None:
    """Run in a subprocess on another src: SpikeZIP-TF throughput at each T and the outputs (saved)."""
    _, qann, _, x = build_vit(a)
    snn = convert(qann)
    out = {}
    for T in a.T:
        t = best_time(lambda: simulate(snn, x, max_steps=T, until_quiescent=False), a.repeats)
        out[str(T)] = x.shape[0] / t
    torch.save({T: simulate(snn, x, max_steps=T, until_quiescent=False).outputs for T in a.T}, a.child_out)
    print(json.dumps(out))


def vit_section(a: argparse.Namespace) -> dict:
    ann, qann, xtr, x = build_vit(a)
    n = x.shape[0]
    snn = convert(qann)
    rows = {}
    with torch.no_grad():
        rows["QANN forward"] = {"-": n / best_time(lambda: qann(x), a.repeats)}
    rc = rate_convert(ann.to(x.dtype), xtr[:256].to(x.dtype))
    multi, step, rate, outs = {}, {}, {}, {}
    for T in a.T:
        multi[T] = n / best_time(lambda: simulate(snn, x, max_steps=T, until_quiescent=False), a.repeats)
        step[T] = n / best_time(lambda: simulate(snn, x, max_steps=T, until_quiescent=False, chunk=1), a.repeats)
        rate[T] = n / best_time(lambda: rate_simulate(rc, x, max_steps=T), a.repeats)
        r_m = simulate(snn, x, max_steps=T, until_quiescent=False)
        r_s = simulate(snn, x, max_steps=T, until_quiescent=False, chunk=1)
        outs[T] = r_m.outputs
        assert torch.equal(r_m.outputs, r_s.outputs), "multi-step and step-by-step outputs differ"
    rows["SpikeZIP-TF multi-step (default chunk=4)"] = multi
    rows["SpikeZIP-TF step by step (chunk=1)"] = step
    rows["rate-coded IF conversion"] = rate
    q = simulate(snn, x, max_steps=512)
    rows["SpikeZIP-TF until quiescent"] = {f"t_q={q.num_steps}": n / best_time(
        lambda: simulate(snn, x, max_steps=512), a.repeats)}
    if a.baseline_src:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "out.pt")
            argv = [sys.executable, os.path.abspath(__file__), "--_child-out", path, *sys.argv[1:]]
            i = argv.index("--baseline-src")
            del argv[i:i + 2]
            env = dict(os.environ, PYTHONPATH=a.baseline_src)
            res = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            base = {int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}
            old = torch.load(path)
            same = all(torch.equal(old[T], outs[T]) for T in a.T)
        rows[f"SpikeZIP-TF baseline src ({a.baseline_src})"] = base
        rows["  speed-up (multi-step / baseline)"] = {T: multi[T] / base[T] for T in a.T}
        print(f"outputs identical to the baseline src at T = {a.T}: {same}")
    macs = sum(count_macs(qann, x[:1]).values())
    sops = {T: float(simulate(snn, x, max_steps=T, until_quiescent=False).sops_per_step.sum()) / n for T in a.T}
    sops["quiescence"] = float(q.sops_per_step.sum()) / n
    return {"rows": rows, "macs": macs, "sops": sops, "t_q": q.quiescent_step, "acc_agree": None}


def mlp_section(a: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    data = digits_images(seed=0, test_size=0.2)
    xtr = (data.x_train - 0.5) / 0.5
    x = ((data.x_test - 0.5) / 0.5)[: a.batch].flatten(1)
    mlp = MLP(in_features=64, hidden=[256, 256], out_features=10)
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
    for _ in range(a.train_epochs):
        for i in range(0, len(xtr), 64):
            loss = F.cross_entropy(mlp(xtr[i:i + 64].flatten(1)), data.y_train[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    mlp.eval()
    n = x.shape[0]
    rows: dict[str, dict] = {}
    try:
        from spikingjelly.activation_based import ann2snn, functional

        sj = ann2snn.Converter(recipe=ann2snn.RateCodingRecipe(dataloader=[(xtr[:256].flatten(1), None)],
                                                               mode="99.9%"), device="cpu").convert(mlp)
        functional.set_step_mode(sj, "m")

        def run_sj(T: int) -> torch.Tensor:
            functional.reset_net(sj)
            with torch.no_grad():
                return sj(x.unsqueeze(0).expand(T, -1, -1))

        rows["SpikingJelly IFNode multi-step (rate coding)"] = {T: n / best_time(lambda: run_sj(T), a.repeats)
                                                                for T in a.T}
    except ImportError as e:  # pragma: no cover - depends on the environment
        print(f"(spikingjelly not installed: {e})")
    rc = rate_convert(mlp, xtr[:256].flatten(1))
    rows["icml24 rate-coded IF (step by step)"] = {T: n / best_time(lambda: rate_simulate(rc, x, max_steps=T),
                                                                    a.repeats) for T in a.T}
    # SpikeZIP-TF's neuron on the same MLP: bias-once linears and ST-BIF neurons (L = 16, LSQ-init thresholds)
    from icml24.spikezip_tf.snn import SpikeLinear, STBIFNeuron

    layers, h = [], xtr[:256].flatten(1)
    for m in mlp:
        if isinstance(m, nn.Linear):
            layers.append(SpikeLinear(m))
            h = m(h)
        else:
            s = float(2 * h.clamp_min(0).abs().mean() / 15 ** 0.5)
            layers.append(STBIFNeuron(threshold=s, pos_max=15, neg_min=0))
            h = torch.relu(h)
    zip_mlp = nn.Sequential(*layers)

    def run_zip(T: int) -> torch.Tensor:
        for m in zip_mlp:
            m.reset()
            m.steps = T
        with torch.no_grad():
            return zip_mlp(torch.cat([x, x.new_zeros((T - 1) * n, x.shape[1])]))

    rows["SpikeZIP-TF ST-BIF multi-step (analog input at t=0)"] = {T: n / best_time(lambda: run_zip(T), a.repeats)
                                                                    for T in a.T}
    return {"rows": rows}


def table(title: str, rows: dict, Ts: list[int]) -> None:
    print(f"\n{title}\n")
    print("| path | " + " | ".join(f"T = {T}" for T in Ts) + " |")
    print("|---|" + "---|" * len(Ts))
    for name, vals in rows.items():
        if "-" in vals or any(isinstance(k, str) for k in vals):
            k, v = next(iter(vals.items()))
            print(f"| {name} | {v:,.1f} img/s ({k}) |" + " |" * (len(Ts) - 1))
        elif name.strip().startswith("speed-up"):
            print(f"| {name} | " + " | ".join(f"{vals[T]:.2f}x" for T in Ts) + " |")
        else:
            print(f"| {name} | " + " | ".join(f"{vals[T]:,.1f}" for T in Ts) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--T", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--embed-dim", type=int, default=32)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--level", type=int, default=16)
    ap.add_argument("--train-epochs", type=int, default=5, help="ANN epochs before calibration (0 = random)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--baseline-src", default=None, help="another checkout's src/ to time the same simulation on")
    ap.add_argument("--skip-mlp", action="store_true")
    ap.add_argument("--_child-out", dest="child_out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.child_out:
        baseline_child(a)
        return
    print(f"batch={a.batch} d={a.embed_dim} depth={a.depth} L={a.level} dtype={a.dtype} threads={a.threads} "
          f"train_epochs={a.train_epochs} (best of {a.repeats})")
    vit = vit_section(a)
    table("ViT: images/s at T steps (no early stop)", vit["rows"], a.T)
    print(f"\nSOPs per image (cumulative) vs the ANN's {vit['macs']:,.0f} MACs per image "
          f"(SpikeZIP-TF quiescent at step {vit['t_q']}):\n")
    print("| T | SOPs/image | SOPs / MACs |\n|---|---|---|")
    for T, v in vit["sops"].items():
        print(f"| {T} | {v:,.0f} | {v / vit['macs']:.2f} |")
    if not a.skip_mlp:
        table("MLP 64-256-256-10: images/s at T steps", mlp_section(a)["rows"], a.T)


if __name__ == "__main__":
    main()

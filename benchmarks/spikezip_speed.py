"""SpikeZIP-TF: simulation speed on the run's TinyViT, before/after the fused simulation, vs the QANN and SpikingJelly.

Fixed configuration (the experiment's ViT, ``experiment.py``): TinyViT on 8x8 digits, patch 2 (16 tokens + class
token), d = 32, depth 2, 4 heads, FFN ratio 4, ReLU, LayerNorm eps 1e-6; ``quantize(level=16)``, calibrated on 256
training images (the ANN trained ``--train-epochs`` epochs first, 5 by default, so that the network goes quiet at
T ~ 20 as the run's models do; 0 = random init), float64, batch 64 test images, one thread, simulated until
quiescence. Each arm is timed ``--repeats`` times in ``--rounds`` interleaved rounds; the best wall-clock and the
best CPU time (``time.process_time``) are reported (the machine is shared: wall time is noisy, CPU time less so).

Rows: the QANN forward; our ``simulate`` (fused ST-BIF kernel, the default on CPU); the same with the kernel off
(PyTorch loop, ``_fused.ENABLED = False``); earlier code (``--baseline-src DIR``, repeatable: another checkout's
``src``, run in a subprocess with the same configuration); this code in a subprocess with the heap setting off
(``ICML24_SPIKEZIP_HEAP_PAD=0``, see ``_fused.keep_heap``; a subprocess because the setting is process-wide);
SpikingJelly's ``SpikeZIPTFQANNRecipe`` (multi-step) on the same QANN at equal T and at 2 T (its bias is spread
over ``level`` steps, so at equal T it is not yet exact). Subprocess rows also report the system CPU time and the
page faults per simulation.

Asserted in the same run: max |SNN - QANN| <= 1e-12 (float64) for our simulation (kernel on and off, outputs
bitwise identical), for every baseline src and for the heap-off run (whose outputs must equal ours bit for bit); a
violation exits non-zero.

    python benchmarks/spikezip_speed.py [--baseline-src /path/to/old/src ...] [--repeats 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common.data import digits_images
from icml24.common.nets import TinyViT
from icml24.spikezip_tf import calibrate, convert, quantize, simulate

TOL = 1e-12


def build(a: argparse.Namespace) -> tuple[nn.Module, torch.Tensor]:
    """The run's TinyViT, quantized (L = 16) and calibrated, in float64, and a batch of test images."""
    torch.manual_seed(a.seed)
    data = digits_images(seed=a.seed, test_size=0.2)
    xtr, ytr = (data.x_train - 0.5) / 0.5, data.y_train
    x = ((data.x_test - 0.5) / 0.5)[: a.batch].double()
    ann = TinyViT(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=4,
                  mlp_ratio=4.0, act_layer=nn.ReLU, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    opt = torch.optim.AdamW(ann.parameters(), lr=1e-3)
    for _ in range(a.train_epochs):
        for i in range(0, len(ytr), 64):
            loss = F.cross_entropy(ann(xtr[i:i + 64]), ytr[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    ann.eval()
    qann = calibrate(quantize(ann, level=16), xtr[:256]).double().eval()
    return qann, x


def timed(fn, repeats: int) -> tuple[float, float]:
    """Best wall-clock and best CPU seconds of ``repeats`` calls (after one warm-up call)."""
    fn()
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu


def child(a: argparse.Namespace) -> None:
    """Subprocess on ``--baseline-src``: time our ``simulate`` there, save its outputs, print JSON."""
    torch.set_num_threads(1)
    qann, x = build(a)
    with torch.no_grad():
        ref = qann(x)
    snn = convert(qann)
    res = simulate(snn, x, max_steps=a.max_steps)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    wall, cpu = timed(lambda: simulate(snn, x, max_steps=a.max_steps), a.repeats)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    calls = a.repeats + 1
    torch.save(res.outputs, a.child_out)
    print(json.dumps({"wall": wall, "cpu": cpu, "T": res.num_steps, "err": (res.logits - ref).abs().max().item(),
                      "sys_ms": 1000 * (r1.ru_stime - r0.ru_stime) / calls,
                      "faults": (r1.ru_minflt - r0.ru_minflt) / calls}))


def spikingjelly_arm(qann: nn.Module, x: torch.Tensor, T: int):
    """SpikingJelly's SpikeZIP-TF recipe on a copy of the QANN, multi-step, analog input at t = 0; None if absent."""
    try:
        from spikingjelly.activation_based import ann2snn, functional
        from spikingjelly.activation_based.ann2snn.recipes.spikezip_qann import SpikeZIPTFQANNRecipe
    except ImportError as e:  # pragma: no cover - depends on the environment
        print(f"(spikingjelly not installed: {e})")
        return None
    from icml24.spikezip_tf import QAttention

    q = copy.deepcopy(qann)
    for m in q.modules():  # the recipe's ViT attention also expects timm's dropout members
        if isinstance(m, QAttention):
            m.attn_drop, m.proj_drop = nn.Identity(), nn.Identity()
    sj = ann2snn.ModuleConverter(recipe=SpikeZIPTFQANNRecipe(time_steps=T, model_family="vit"),
                                 device="cpu").convert(q)
    n_attn = sum(type(m).__name__ == "SpikeZIPViTSelfAttention" for m in sj.modules())
    if n_attn != 2:
        raise RuntimeError(f"SpikingJelly converted {n_attn} of 2 attention blocks")
    functional.set_step_mode(sj, "m")

    def run(steps: int) -> torch.Tensor:
        functional.reset_net(sj)
        xin = x.new_zeros(steps, *x.shape)
        xin[0] = x
        with torch.no_grad():
            return sj(xin)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--train-epochs", type=int, default=5, help="ANN epochs before quantization (0 = random init)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=512, help="step cap; the simulation stops when quiet")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds over all arms (best of all)")
    ap.add_argument("--baseline-src", action="append", default=[],
                    help="another checkout's src/ (e.g. before this change); repeatable")
    ap.add_argument("--no-heap-off", action="store_true", help="skip the subprocess row with the heap setting off")
    ap.add_argument("--no-spikingjelly", action="store_true")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    ap.add_argument("--_child-out", dest="child_out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_out:
        child(a)
        return
    from icml24.spikezip_tf import _fused  # (not in the baseline src)

    torch.set_num_threads(1)
    qann, x = build(a)
    n = x.shape[0]
    with torch.no_grad():
        ref = qann(x)
    snn = convert(qann)
    res = simulate(snn, x, max_steps=a.max_steps)
    T = res.num_steps
    err = (res.logits - ref).abs().max().item()
    _fused.ENABLED = False
    res_loop = simulate(snn, x, max_steps=a.max_steps)
    _fused.ENABLED = True
    err_loop = (res_loop.logits - ref).abs().max().item()
    same = torch.equal(res.outputs, res_loop.outputs)
    kernel_note = "fused ST-BIF kernel" if _fused.available(x) else f"no kernel: {_fused.reason}"
    print(f"TinyViT d=32 depth=2 heads=4, 16+1 tokens, L=16, float64, batch {n}, 1 thread, trained "
          f"{a.train_epochs} epochs; quiet after T = {T} steps (quiescent_step {res.quiescent_step}); {kernel_note}; "
          f"torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    failures = []
    if not err <= TOL or not err_loop <= TOL:
        failures.append(f"max |SNN - QANN| = {err:.3g} (kernel) / {err_loop:.3g} (loop) > {TOL}")
    if not same:
        failures.append("kernel and PyTorch-loop outputs differ")

    def ours_loop() -> None:
        _fused.ENABLED = False
        try:
            simulate(snn, x, max_steps=a.max_steps)
        finally:
            _fused.ENABLED = True

    arms = {"QANN forward": (lambda: qann(x), 1),
            "SpikeZIP-TF simulate (this code)": (lambda: simulate(snn, x, max_steps=a.max_steps), T),
            "  same, kernel off (PyTorch loop)": (ours_loop, T)}
    errors = {"QANN forward": 0.0, "SpikeZIP-TF simulate (this code)": err, "  same, kernel off (PyTorch loop)": err_loop}
    sj = None if a.no_spikingjelly else spikingjelly_arm(qann, x, T)
    if sj is not None:
        for steps in (T, 2 * T):
            name = f"SpikingJelly SpikeZIPTFQANNRecipe, T = {steps}"
            arms[name] = (partial(sj, steps), steps)
            errors[name] = (sj(steps).sum(0) - ref).abs().max().item()
    best = {k: [float("inf"), float("inf")] for k in arms}
    here = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src"))
    subs = [(f"before (baseline src {src})", os.path.abspath(src), {}) for src in a.baseline_src]
    if not a.no_heap_off:
        subs.append(("  this code, heap setting off (subprocess)", here, {"ICML24_SPIKEZIP_HEAP_PAD": "0"}))
    base: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        for _ in range(a.rounds):
            for name, src, extra in subs:
                out = os.path.join(d, "out.pt")
                argv = [sys.executable, os.path.abspath(__file__), "--_child-out", out, "--batch", str(a.batch),
                        "--train-epochs", str(a.train_epochs), "--seed", str(a.seed), "--max-steps",
                        str(a.max_steps), "--repeats", str(a.repeats)]
                env = dict(os.environ, PYTHONPATH=src, **extra)
                r = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True,
                                              check=True).stdout.strip().splitlines()[-1])
                if name not in base:
                    old = torch.load(out)
                    base[name] = {**r, "identical": torch.equal(old, res.outputs)}
                b = base[name]
                b["wall"], b["cpu"] = min(b["wall"], r["wall"]), min(b["cpu"], r["cpu"])
                b["sys_ms"], b["faults"] = min(b["sys_ms"], r["sys_ms"]), min(b["faults"], r["faults"])
            for k, (fn, _) in arms.items():
                w, c = timed(fn, a.repeats)
                best[k] = [min(best[k][0], w), min(best[k][1], c)]
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(a.repeats):
            simulate(snn, x, max_steps=a.max_steps)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    own_sys = (1000 * (r1.ru_stime - r0.ru_stime) / a.repeats, (r1.ru_minflt - r0.ru_minflt) / a.repeats)
    rows = []
    q_cpu = n / best["QANN forward"][1]
    for k, (_, steps) in arms.items():
        rows.append((k, steps, n / best[k][0], n / best[k][1], errors[k]))
    for i, (name, _, _) in enumerate(subs):
        b = base[name]
        rows.insert(1 + i, (name, b["T"], n / b["wall"], n / b["cpu"], b["err"]))
        if not b["err"] <= TOL:
            failures.append(f"{name}: max |SNN - QANN| = {b['err']:.3g} > {TOL}")
        if "heap" in name and not b["identical"]:
            failures.append("the heap-off run's outputs differ from ours")
    print("\n| path | T | img/s (wall) | img/s (CPU) | QANN / path (CPU) | max abs(SNN - QANN) |")
    print("|---|---|---|---|---|---|")
    for k, steps, w, c, e in rows:
        print(f"| {k} | {steps} | {w:,.1f} | {c:,.1f} | {q_cpu / c:.1f}x | {e:.2g} |")
    after = n / best["SpikeZIP-TF simulate (this code)"][0], n / best["SpikeZIP-TF simulate (this code)"][1]
    print()
    for name, _, _ in subs:
        b = base[name]
        what = "outputs identical to it" if "heap" in name else "outputs identical to the baseline src"
        print(f"this code / {name.strip()}: {after[0] * b['wall'] / n:.2f}x wall, {after[1] * b['cpu'] / n:.2f}x CPU; "
              f"{what}: {b['identical']}; its system CPU {b['sys_ms']:.1f} ms and {b['faults']:.0f} page faults "
              f"per simulation")
    print(f"this code (in this process): system CPU {own_sys[0]:.1f} ms and {own_sys[1]:.0f} page faults per "
          f"simulation; heap setting in place: {_fused.heap_padded}")
    if sj is not None:
        k = f"SpikingJelly SpikeZIPTFQANNRecipe, T = {T}"
        print(f"this code / SpikingJelly at equal T = {T}: {after[0] * best[k][0] / n:.2f}x wall, "
              f"{after[1] * best[k][1] / n:.2f}x CPU")
    print(f"kernel and PyTorch-loop outputs bitwise identical: {same}; max |SNN - QANN| = {err:.2g} (tolerance {TOL})")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"T": T, "rows": [dict(zip(("path", "T", "img_s_wall", "img_s_cpu", "max_err"), r, strict=True))
                                        for r in rows], "subprocess_rows": base, "own_system_ms_faults": own_sys,
                   "heap_padded": _fused.heap_padded, "failures": failures}, f, indent=2)
    if failures:
        sys.exit("FAILED: " + "; ".join(failures))


if __name__ == "__main__":
    main()

"""SpikeZIP-TF: SNN simulation throughput (samples/s) and synaptic operations vs the ANN's MACs.

For a tiny ReLU ViT on sklearn digits (random weights, quantizers calibrated on a batch, or an ANN trained for
``--train-epochs`` epochs first), prints: the QANN forward throughput, the SNN simulation throughput until
quiescence (one ``simulate`` call = all steps), and, at every time step until quiescence, the cumulative
synaptic operations per sample next to the ANN's MACs per sample.

    python benchmarks/spikezip_tf_throughput.py [--batch 128] [--dtype float32|float64] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common.data import digits_images
from icml24.common.nets import TinyViT
from icml24.spikezip_tf import calibrate, convert, count_macs, quantize, simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--embed-dim", type=int, default=32)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--level", type=int, default=16)
    ap.add_argument("--max-steps", type=int, default=512)
    ap.add_argument("--train-epochs", type=int, default=5, help="ANN epochs before calibration (0 = random)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dt = getattr(torch, a.dtype)
    data = digits_images(seed=0, test_size=0.2).to(a.device)
    xtr, ytr = (data.x_train - 0.5) / 0.5, data.y_train
    x = ((data.x_test - 0.5) / 0.5)[: a.batch]
    ann = TinyViT(embed_dim=a.embed_dim, depth=a.depth, num_heads=a.heads, act_layer=nn.ReLU,
                  norm_layer=partial(nn.LayerNorm, eps=1e-6)).to(a.device)
    opt = torch.optim.AdamW(ann.parameters(), lr=1e-3)
    for _ in range(a.train_epochs):
        for i in range(0, len(ytr), 64):
            loss = F.cross_entropy(ann(xtr[i:i + 64]), ytr[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    qann = quantize(ann, level=a.level)
    calibrate(qann, xtr[:256])
    qann = qann.to(dt).eval()
    x = x.to(dt)
    snn = convert(qann)
    n = x.shape[0]
    macs = sum(count_macs(qann, x[:1]).values())

    with torch.no_grad():
        qann(x)
        t0 = time.perf_counter()
        for _ in range(a.repeats):
            qann(x)
        t_q = (time.perf_counter() - t0) / a.repeats
    simulate(snn, x, max_steps=a.max_steps)
    t0 = time.perf_counter()
    for _ in range(a.repeats):
        res = simulate(snn, x, max_steps=a.max_steps)
    t_s = (time.perf_counter() - t0) / a.repeats
    with torch.no_grad():
        err = (res.logits - qann(x)).abs().max().item()

    print(f"device={a.device} dtype={a.dtype} batch={n} d={a.embed_dim} depth={a.depth} L={a.level} "
          f"threads={a.threads} train_epochs={a.train_epochs}")
    print(f"QANN forward : {n / t_q:10.1f} samples/s")
    print(f"SNN simulate : {n / t_s:10.1f} samples/s  ({res.num_steps} steps, quiescent at t={res.quiescent_step}, "
          f"{t_s / res.num_steps * 1e3:.2f} ms/step, max|SNN-QANN| = {err:.2e})")
    print(f"ANN MACs/sample: {macs:,.0f}")
    print("\n| t | spikes/sample (step) | SOPs/sample (cumulative) | SOPs / ANN MACs |")
    print("|---|---|---|---|")
    cum = res.sops_per_step.cumsum(0) / n
    for t in range(res.num_steps):
        print(f"| {t} | {res.spikes_per_step[t].item() / n:,.1f} | {cum[t].item():,.0f} | "
              f"{cum[t].item() / macs:.3f} |")
    print("\nper-layer SOPs/sample:")
    for k, v in res.sops_per_layer.items():
        print(f"  {k:28s} {v / n:12,.0f}")


if __name__ == "__main__":
    main()

"""MoLAConv2d cost: forward + backward of one adapted convolution, ours ("per_sample", "stacked") vs the official.

The official MoLA-Grad layer (``peft/lora_fast.py``, ``MultiLoraConv2dV2``) builds each sample's kernel
``W_i = W + Σ_e g_ie ΔW_e`` and runs the batch as one grouped convolution (batch folded into the groups); that
reference is written here from its formula (not copied). ``MoLAConv2d(impl="per_sample")`` (the default) computes
the same; ``impl="stacked"`` (the default before issue 31) runs the ``E + 1`` kernels stacked along the output
channels (``E + 1`` times the FLOPs). The plain ``nn.Conv2d`` is the floor. Reported per call: process CPU time
(all threads of this process) and wall time, the median over repeats, since the machine is shared.

    python benchmarks/mola_conv.py [--threads 1] [--repeats 15] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from icml24.mola import MoLAConv2d

# (batch, channels in = out, spatial size, experts E): CIFAR-/ResNet-like stages, rank 4, 3×3, padding 1
CASES = [(32, 64, 32, 4), (32, 64, 16, 4), (32, 128, 8, 4), (64, 16, 32, 4), (32, 64, 16, 8)]


def official_per_sample(layer: MoLAConv2d, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The official per-sample grouped convolution, from its formula (groups = 1 as there)."""
    conv, b = layer.base, x.shape[0]
    agg = conv.weight + (layer.delta_weight().unsqueeze(0) * g.view(b, -1, 1, 1, 1, 1)).sum(1)
    out = F.conv2d(x.view(1, -1, *x.shape[-2:]), agg.view(-1, *agg.shape[-3:]), None, conv.stride, conv.padding,
                   conv.dilation, groups=b)
    return out.view(b, -1, *out.shape[-2:]) + conv.bias.view(1, -1, 1, 1)


def _time(fn, repeats: int, sync) -> tuple[float, float]:
    fn()
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        sync()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3


def _case(b: int, c: int, h: int, e: int, rank: int, dev: torch.device, repeats: int, sync):
    torch.manual_seed(0)
    layer = MoLAConv2d(nn.Conv2d(c, c, 3, padding=1), num_experts=e, rank=rank).to(dev)
    nn.init.normal_(layer.lora_B, std=0.1)
    x = torch.randn(b, c, h, h, device=dev, requires_grad=True)
    g = torch.softmax(torch.randn(b, e, device=dev), 1)

    def run(f):
        def step():
            layer.zero_grad(set_to_none=True)
            x.grad = None
            f().sum().backward()
        return step

    def ours(impl):
        def f():
            layer.impl = impl
            return layer(x, gates=g)
        return f

    return (_time(run(lambda: official_per_sample(layer, x, g)), repeats, sync),
            _time(run(ours("per_sample")), repeats, sync), _time(run(ours("stacked")), repeats, sync),
            _time(run(lambda: layer.base(x)), repeats, sync))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"MoLAConv2d forward+backward, 3×3 conv, rank {a.rank}, soft gates, {a.device}, {a.threads} thread(s)")
    print("| B, C, H×W, E | official per-sample ms (CPU / wall) | ours per_sample | ours stacked (old) | "
          "nn.Conv2d | stacked / official (CPU) | per_sample / official (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for b, c, h, e in CASES:
        t_off, t_ps, t_st, t_base = _case(b, c, h, e, a.rank, dev, a.repeats, sync)
        fmt = "{:.1f} / {:.1f}".format
        print(f"| {b}, {c}, {h}×{h}, {e} | {fmt(*t_off)} | {fmt(*t_ps)} | {fmt(*t_st)} | {fmt(*t_base)} | "
              f"{t_st[0] / t_off[0]:.2f}× | {t_ps[0] / t_off[0]:.2f}× |")


if __name__ == "__main__":
    main()

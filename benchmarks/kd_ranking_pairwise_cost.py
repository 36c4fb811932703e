"""Cost of the pairwise ranking-KD loss against KL-KD: time and peak memory of one forward + backward.

Cases (student and teacher logits of ``N`` rows and ``C`` classes, float32, one thread by default):

- ``B = 128, C = 100`` and ``B = 128, C = 1000`` (image classification sizes);
- ``(B, T, V) = (2, 256, 32000)``: token-level distillation of a language model (V = 32k, N = 512 tokens).

Arms: ``KLDistillLoss`` (the reference), ``RankingKDLoss`` (chunked; all pairs, ``top_k = 10`` and the default
``top_k="auto"``, which keeps all classes up to C = 1024 and the teacher's top 16 above), and the former
unchunked implementation (``(N, K, C)`` tensors through autograd; ``--no-old`` skips it, it needs several GB
at V = 32k). Each (case, arm) runs in a fresh subprocess: peak memory = peak RSS (``ru_maxrss``; on CUDA
``max_memory_allocated``) minus the RSS after the inputs exist; time = best of ``--repeats`` runs (more, up to 50, while they
take under 1 s in all; fewer once they take 10 s): a shared machine's load only slows runs down. ``--clock cpu``
(default on CPU) times with the process's CPU time (``time.process_time``), which descheduling on a loaded
machine does not inflate (with one thread it is the compute time); ``--clock wall`` (always on CUDA) wall-clock.

    python benchmarks/kd_ranking_pairwise_cost.py [--threads 1] [--repeats 5] [--device cpu] [--no-old] [--clock cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings

CASES = {"B=128, C=100": (128, 100), "B=128, C=1000": (128, 1000), "(B, T, V)=(2, 256, 32000)": (512, 32000)}
ARMS = ["KL", "pairwise, all pairs", "pairwise, top_k=10", "pairwise, top_k='auto'",
        "old unchunked, all pairs", "old unchunked, top_k=10", "old unchunked, top_k=16"]


def _old_unchunked(s, t, k):  # the implementation before the chunked one (kept here as the "before" arm)
    import torch
    import torch.nn.functional as F
    order = torch.argsort(t, dim=1, descending=True, stable=True)
    if k < s.shape[1]:
        top = order[:, :k]
        s_hi, t_hi = s.gather(1, top), t.gather(1, top)
    else:
        s_hi, t_hi = s, t
    above = t_hi[:, :, None] > t[:, None, :]
    per_pair = torch.where(above, F.softplus(-(s_hi[:, :, None] - s[:, None, :])), torch.zeros((), dtype=s.dtype))
    return (per_pair.sum(dim=(1, 2)) / above.sum(dim=(1, 2)).clamp_min(1).to(s.dtype)).mean()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _one(case: str, arm: str, device: str, threads: int, repeats: int, clock: str = "cpu") -> dict:
    import torch

    from icml24.kd_ranking import KLDistillLoss, RankingKDLoss
    torch.set_num_threads(threads)
    n, c = CASES[case]
    g = torch.Generator().manual_seed(0)
    s0 = torch.randn(n, c, generator=g).to(device)
    t = torch.randn(n, c, generator=g).to(device)
    if arm == "KL":
        fn = KLDistillLoss(tau=4.0)
    elif arm.startswith("pairwise"):
        top_k = {"all pairs": None, "top_k=10": 10, "top_k='auto'": "auto"}[arm.split(", ")[1]]
        loss = RankingKDLoss(top_k=top_k)
        fn = loss
    else:
        k = {"all pairs": c, "top_k=10": 10, "top_k=16": 16}[arm.split(", ")[1]]

        def fn(s, t, k=k):
            return _old_unchunked(s, t, k)
    cuda = device.startswith("cuda")
    now = time.process_time if clock == "cpu" and not cuda else time.perf_counter

    def step() -> float:
        s = s0.clone().requires_grad_(True)
        if cuda:
            torch.cuda.synchronize()
        t0 = now()
        fn(s, t).backward()
        if cuda:
            torch.cuda.synchronize()
        return now() - t0

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the automatic top-k's one warning
        times = [step()]
        peak = (torch.cuda.max_memory_allocated() if cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) - base
        while len(times) < repeats and sum(times) < 10.0 or len(times) < 50 and sum(times) < 1.0:
            times.append(step())
    out = {"case": case, "arm": arm, "ms": 1e3 * min(times), "peak_mb": max(peak, 0) / 2**20, "runs": len(times)}
    if arm == "pairwise, top_k='auto'":
        out["repr"] = repr(loss)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-old", action="store_true", help="skip the former unchunked implementation")
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--_one", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._one:
        print(json.dumps(_one(a._one[0], a._one[1], a.device, a.threads, a.repeats, a.clock)))
        return
    rows = []
    for case in a.cases:
        for arm in ARMS:
            if arm.startswith("old") and a.no_old:
                continue
            if case.startswith("B=128") and arm.endswith("top_k=16"):
                continue  # "auto" keeps all classes at C <= 1024
            if case.startswith("(B, T, V)") and arm.endswith("all pairs"):
                continue  # 512 · 32000² / 2 pair terms: hours
            cmd = [sys.executable, __file__, "--_one", case, arm, "--device", a.device, "--threads",
                   str(a.threads), "--repeats", str(a.repeats), "--clock", a.clock]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                rows.append({"case": case, "arm": arm, "error": (r.stderr.strip().splitlines() or ["killed"])[-1]})
            else:
                rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr)
    clock = "wall-clock" if a.clock == "wall" or a.device.startswith("cuda") else "process CPU"
    print(f"device {a.device}, {a.threads} thread(s), float32, forward + backward, best of >= {a.repeats} runs "
          f"(fewer past 10 s), {clock} time")
    print("| case | arm | ms | × KL | peak MB |")
    print("|---|---|---|---|---|")
    for case in a.cases:
        kl = next((r for r in rows if r["case"] == case and r["arm"] == "KL" and "ms" in r), None)
        for r in (r for r in rows if r["case"] == case):
            if "error" in r:
                print(f"| {case} | {r['arm']} | failed: {r['error'][:60]} | | |")
                continue
            ratio = f"{r['ms'] / kl['ms']:.1f}" if kl else "-"
            print(f"| {case} | {r['arm']} | {r['ms']:.2f} | {ratio} | {r['peak_mb']:.1f} |")
    for r in rows:
        if "repr" in r:
            print(f"{r['case']}: {r['repr']}")


if __name__ == "__main__":
    main()

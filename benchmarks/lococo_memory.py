"""LoCoCo's memory as a user meets it: peak tensor memory of ``model.generate(ids)`` vs the prompt length.

The tiny byte-level ``LlamaForCausalLM`` of the experiment (random weights: memory does not depend on them), one
thread, ``generate(ids, max_new_tokens=--new)`` with a prompt of each ``--contexts`` length, one fresh process per
point (``import kvpress`` patches transformers for the whole process). Caches:

- ``full``: a ``DynamicCache`` with SDPA attention (transformers' default path);
- ``lococo``: a ``LoCoCoCache`` (M = --budget slots, buffer 16, compressors built for --chunk) with the score-returning
  ``"lococo"`` attention; ``generate`` is called on the whole prompt and the cache splits the prefill into chunks
  (the default, ``prefill_chunk_size="auto"``);
- ``lococo_manual``: the same cache fed chunk by chunk by hand, then ``generate`` on the rest (the reference path);
- ``lococo_one_shot``: the same cache with ``prefill_chunk_size=None``: one prefill over the whole prompt (the
  behaviour before the split; O(T²) attention, skipped above --one-shot-max);
- kvpress 0.5.5 presses (``StreamingLLMPress``, ``SnapKVPress``, ``TOVAPress``) on a ``DynamicCache`` keeping M entries
  per layer and head (they compress the prefill once, after computing it whole).

Peak memory: the largest amount of tensor memory allocated during the call above what was live before it, from the
allocation and free events of ``torch.profiler`` (``profile_memory=True``; exact bytes, CPU allocator); the
process's peak RSS growth (``ru_maxrss``) is printed beside it.

    python benchmarks/lococo_memory.py [--contexts 1024 4096 16384] [--budget 128] [--chunk 128] [--new 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

PRESSES = ("StreamingLLMPress", "SnapKVPress", "TOVAPress")
METHODS = ("full", "lococo", "lococo_manual", "lococo_one_shot", *PRESSES)


def _peak_mib(prof) -> float:
    """Max over time of (allocated − freed) bytes inside the profiled region, from kineto's memory events."""
    ev = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    cur = best = 0
    for _, n in ev:
        cur += n
        best = max(best, cur)
    return best / 2**20


def _point(method: str, context: int, a: argparse.Namespace) -> dict:
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    from icml24.lococo import LoCoCoCache, make_compressors, tiny_llama, use_lococo_attention

    torch.set_num_threads(a.threads)
    model = tiny_llama(hidden_size=96, num_layers=3, num_heads=3, intermediate_size=256, seed=0,
                       attn_implementation="sdpa").eval()
    ids = torch.randint(0, 256, (1, context), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=a.new, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)
    press = None
    if method.startswith("lococo"):
        use_lococo_attention(model)
        comps = make_compressors(num_layers=3, head_dim=32, budget=a.budget, chunk_size=a.chunk, seed=0)
        extra = {"prefill_chunk_size": None} if method == "lococo_one_shot" else {}
        cache = LoCoCoCache.from_model(model, policy="lococo", budget=a.budget, compressors=comps, buffer=16, **extra)
    else:
        cache = DynamicCache(config=model.config)
        if method in PRESSES:
            from icml24.lococo.kvpress_baselines import make_press

            press = make_press(method, length=context, budget=a.budget)

    def run():
        with torch.no_grad():
            if method == "lococo_manual":
                end = (context - 1) // a.chunk * a.chunk
                for j in range(0, end, a.chunk):
                    model(input_ids=ids[:, j:j + a.chunk], past_key_values=cache, use_cache=True)
            if press is not None:
                with press(model):
                    return model.generate(ids, past_key_values=cache, **kw)
            return model.generate(ids, past_key_values=cache, **kw)

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run()
    wall = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert out.shape == (1, context + a.new), out.shape
    slots = max(layer.keys.shape[2] for layer in cache.layers)
    return {"method": method, "context": context, "peak_mib": _peak_mib(prof), "rss_growth_mib": (rss1 - rss0) / 1024,
            "slots": slots, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one-shot-max", type=int, default=4096, help="skip lococo_one_shot above this context")
    ap.add_argument("--point", nargs=2, metavar=("METHOD", "CONTEXT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.point:
        print(json.dumps(_point(a.point[0], int(a.point[1]), a)))
        return
    print("| cache | context | slots | peak tensor MiB | peak RSS growth MiB | wall s |")
    print("|---|---|---|---|---|---|")
    for c in a.contexts:
        for m in a.methods:
            if m == "lococo_one_shot" and c > a.one_shot_max:
                continue
            cmd = [sys.executable, __file__, "--point", m, str(c), "--budget", str(a.budget), "--chunk", str(a.chunk),
                   "--new", str(a.new), "--threads", str(a.threads)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode:
                print(f"| {m} | {c} | error: {p.stderr.strip().splitlines()[-1][:120]} | | | |", flush=True)
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"| {m} | {c} | {r['slots']} | {r['peak_mib']:.1f} | {r['rss_growth_mib']:.0f} | {r['wall_s']:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()

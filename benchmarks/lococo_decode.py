"""LoCoCo keeps decode cost flat: per-token decode latency and KV memory vs context, full cache vs LoCoCo (M slots) vs
kvpress presses (M kept entries).

The tiny byte-level ``LlamaForCausalLM`` of the experiment (random weights: cost does not depend on them). Each
context is prefilled (full cache: SDPA over a ``DynamicCache``, chunk by chunk; LoCoCo: the score-returning
``"lococo"`` attention over a ``LoCoCoCache``, chunk by chunk; kvpress 0.5.5 ``StreamingLLMPress`` / ``SnapKVPress`` /
``TOVAPress``: one prefill pass through the press, which prunes the ``DynamicCache`` to M entries per head), then
``--decode`` tokens are generated one at a time and timed (min and median: the machine is shared).
Memory: the bytes of the KV tensors held after the decode steps (exact) and the process's peak RSS growth during the run
of that context (``resource.ru_maxrss``, run in a fresh subprocess per point: ``import kvpress`` patches
transformers for the whole process).

    python benchmarks/lococo_decode.py [--contexts 1024 4096 16384] [--budget 128] [--chunk 512] [--buffer 16]
        [--policies full lococo StreamingLLMPress SnapKVPress TOVAPress]
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


def _point(policy: str, context: int, a: argparse.Namespace) -> dict:
    from transformers import DynamicCache

    from icml24.lococo import LoCoCoCache, make_compressors, tiny_llama, use_lococo_attention

    torch.set_num_threads(a.threads)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = tiny_llama(hidden_size=96, num_layers=3, num_heads=3, intermediate_size=256, seed=0,
                       attn_implementation="sdpa").eval()
    if policy == "lococo":
        use_lococo_attention(model)
        comps = make_compressors(num_layers=3, head_dim=32, budget=a.budget, chunk_size=a.chunk, seed=0)
        cache = LoCoCoCache.from_model(model, policy="lococo", budget=a.budget, compressors=comps, buffer=a.buffer)
    else:
        cache = DynamicCache(config=model.config)
    ids = torch.randint(0, 256, (1, context), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        t0 = time.perf_counter()
        if policy in PRESSES:
            from icml24.lococo.kvpress_baselines import make_press, press_prefill

            cache, logits = press_prefill(model, ids, make_press(policy, length=context, budget=a.budget))
        else:
            for j in range(0, context, a.chunk):
                logits = model(input_ids=ids[:, j:j + a.chunk], past_key_values=cache, use_cache=True).logits
        prefill_s = time.perf_counter() - t0
        tok = logits[:, -1:].argmax(-1)
        times = []
        for i in range(a.decode):
            # a pruned DynamicCache reports its physical length, not the tokens seen: explicit positions
            pos = {"position_ids": torch.tensor([[context + i]]), "cache_position": torch.tensor([context + i])} \
                if policy in PRESSES else {}
            t0 = time.perf_counter()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True, **pos)
            times.append(time.perf_counter() - t0)
            tok = out.logits[:, -1:].argmax(-1)
        kv_bytes = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers)
        slots = cache.layers[0].keys.shape[2]
    times.sort()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"policy": policy, "context": context, "prefill_s": prefill_s, "decode_ms_median": 1e3 * times[len(times) // 2],
            "decode_ms_min": 1e3 * times[0],
            "kv_mib": kv_bytes / 2**20, "slots": slots, "peak_rss_growth_mib": (rss1 - rss0) / 1024,
            "compression_ratio": context / slots}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--buffer", type=int, default=16, help="compress when the cache exceeds M + buffer (repo: 16)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--policies", nargs="+", default=["full", "lococo", *PRESSES],
                    choices=["full", "lococo", *PRESSES])
    ap.add_argument("--point", nargs=2, metavar=("POLICY", "CONTEXT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.point:
        print(json.dumps(_point(a.point[0], int(a.point[1]), a)))
        return
    rows = []
    print("| cache | context | slots | KV MiB | peak RSS growth MiB | decode ms/token (min / median) | prefill s |")
    print("|---|---|---|---|---|---|---|")
    for c in a.contexts:
        for policy in a.policies:
            cmd = [sys.executable, __file__, "--point", policy, str(c), "--budget", str(a.budget), "--chunk",
                   str(a.chunk), "--decode", str(a.decode), "--buffer", str(a.buffer), "--threads", str(a.threads)]
            r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"| {policy} | {c} | {r['slots']} | {r['kv_mib']:.2f} | {r['peak_rss_growth_mib']:.0f} "
                  f"| {r['decode_ms_min']:.2f} / {r['decode_ms_median']:.2f} | {r['prefill_s']:.1f} |", flush=True)
    lo = [r for r in rows if r["policy"] == "lococo"]
    if lo:
        print(f"\nLoCoCo: {lo[-1]['context']} tokens into {lo[-1]['slots']} slots "
              f"(ratio {lo[-1]['compression_ratio']:.0f}x); min decode ms/token from {lo[0]['decode_ms_min']:.2f} "
              f"to {lo[-1]['decode_ms_min']:.2f}")


if __name__ == "__main__":
    main()

"""bayes_mcts pilot (issue 30): the full run's protocol on instances the full run does not use.

Test seeds 3000-3019, validation seeds 2000-2009 (the full run: 1000-1019 and 500-509). Prints the wall time, the
success / SPL table and the checks; writes runs/pilot/bayes_mcts/.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from icml24.bayes_mcts.experiment import Config, run

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    cfg = Config(seeds=tuple(range(n)), test_base=3000, val_base=2000, n_sweep=min(10, n))
    t0 = time.perf_counter()
    res = run(cfg, Path("runs/pilot/bayes_mcts"))
    print(f"wall {time.perf_counter() - t0:.0f} s (workers={cfg.workers})")
    for k, x in sorted(res.extra["success_rates"].items()):
        print(f"{k:32s} success {x:.2f}  spl {res.extra['spl'][k]:.2f}")
    print("tuned", res.extra["tuned"])
    for c in res.claim_checks:
        print(f"[{c.kind}] {'PASS' if c.passed else 'FAIL'} {c.measured:.3g} [{c.ci_low}, {c.ci_high}] {c.name}")
    print(res.verdict)

"""Timed probe for the full run's budget (issue 27): seed 99 (outside 0-19), one teacher zoo and the CE student
only; no KD arm is run (the KD losses are timed alone on random logits). Run: python benchmarks/kd_ranking_full_run_probe.py"""
import time, torch
from icml24.common.data import load_mnist1d
from icml24.kd_ranking.experiment import Config, train_teacher, train_student
from icml24.kd_ranking import KLDistillLoss, RankingKDLoss
torch.set_num_threads(1)
cfg = Config().replace(seeds=(99, 98))
split = load_mnist1d(seed=99)
t0 = time.process_time(); w0 = time.time()
for ci, ch in enumerate(cfg.teacher_channels):
    train_teacher(cfg, split, channels=ch, seed=100 * 99 + ci)
tt = time.process_time() - t0; print(f"teachers (4): cpu {tt:.1f}s wall {time.time()-w0:.1f}s", flush=True)
t0 = time.process_time(); w0 = time.time()
r = train_student(cfg, split, seed=99, teacher_train_logits=None, loss=None)
ts = time.process_time() - t0
print(f"CE student: cpu {ts:.2f}s wall {time.time()-w0:.2f}s best_epoch {r['best_epoch']} epochs_run {r['epochs_run']} "
      f"val {r['val_acc']:.2f} test {r['test_acc']:.2f}", flush=True)
cfg60 = cfg.replace(student_patience=60)
t0 = time.process_time()
r60 = train_student(cfg60, split, seed=99, teacher_train_logits=None, loss=None)
t60 = time.process_time() - t0
print(f"CE student, all 60 epochs: cpu {t60:.2f}s best_epoch {r60['best_epoch']} test {r60['test_acc']:.2f}", flush=True)
# loss cost alone on random logits at the students' batch shape (no KD student is trained)
s = torch.randn(256, 10, requires_grad=True); tl = torch.randn(256, 10)
for name, L in (("kl", KLDistillLoss(tau=1.0)), ("pairwise", RankingKDLoss())):
    t0 = time.process_time()
    for _ in range(200):
        L(s, tl).backward()
    print(f"loss {name} fwd+bwd at (256, 10): {1e3*(time.process_time()-t0)/200:.3f} ms", flush=True)

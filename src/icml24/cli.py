"""Command line: ``icml24 list | show <slug> | run <slug>...|all | report [results/]``."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from icml24 import registry


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        sys.stderr.write(f"icml24: error: {message}\n")
        raise SystemExit(2)


def _fail(message: str) -> int:
    sys.stderr.write(f"icml24: error: {message}\n")
    return 2


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="icml24", description="ICML 2024 methods: list, inspect, reproduce and report.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="all papers with their status")
    s = sub.add_parser("show", help="paper, claim and how to run it")
    s.add_argument("slug")
    r = sub.add_parser("run", help="run experiments (slugs or 'all')")
    r.add_argument("slugs", nargs="+", metavar="slug")
    r.add_argument("--quick", action="store_true", help="the small variant (tests/CI); never writes results/")
    r.add_argument("--seeds", nargs="+", type=int, help="override the config's seeds")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a Config field (converted by its type); repeatable")
    r.add_argument("--device", help="torch device, e.g. cpu or cuda")
    r.add_argument("--out", type=Path, help="output base folder (default: results/ for full runs, runs/quick/ for quick)")
    r.add_argument("--strict", action="store_true", help="exit 1 unless every verdict is 'holds' with no claim void (a claim fails or a sanity check voids one)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    rep = sub.add_parser("report", help="(re)write RESULTS.md from results/<slug>/results.json")
    rep.add_argument("results_dir", nargs="?", type=Path, default=Path("results"))
    rep.add_argument("--output", type=Path, default=None, help="default: RESULTS.md beside results_dir")
    return p


def _cmd_list() -> int:
    rows = [(p.slug, p.status, p.arxiv or "—", p.code or "—", p.title) for p in registry.PAPERS.values()]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    print(f"{'slug':<{w[0]}}  {'status':<{w[1]}}  {'arxiv':<{w[2]}}  {'code':<{w[3]}}  title")
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:<{w[3]}}  {r[4]}")
    n = sum(p.implemented for p in registry.PAPERS.values())
    print(f"\n{len(rows)} papers, {n} implemented")
    return 0


def _cmd_show(slug: str) -> int:
    if slug not in registry.PAPERS:
        return _fail(f"unknown paper {slug!r}; valid: {', '.join(registry.PAPERS)}")
    p = registry.PAPERS[slug]
    print(f"{p.title}\n  slug: {p.slug}\n  arXiv: {p.arxiv or '—'}\n  official code: {p.code or 'none'}\n"
          f"  status: {p.status}\n  claim: {p.claim}")
    if p.implemented:
        print(f"  run: icml24 run {slug} --quick   (full: icml24 run {slug})\n"
              f"  docs: src/icml24/{slug}/README.md")
    return 0


def _parse_overrides(items: list[str]) -> dict[str, str] | str:
    out = {}
    for item in items:
        if "=" not in item:
            return f"--set expects KEY=VALUE, got {item!r}"
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _cmd_run(args: argparse.Namespace) -> int:
    from icml24.common.progress import set_quiet
    from icml24.common.results import verdict_line

    set_quiet(args.quiet)
    slugs = list(registry.PAPERS) if args.slugs == ["all"] else args.slugs
    if args.slugs != ["all"]:
        unknown = [s for s in slugs if s not in registry.PAPERS]
        if unknown:
            return _fail(f"unknown paper {unknown[0]!r}; valid: all, {', '.join(registry.PAPERS)}")
        planned = [s for s in slugs if not registry.PAPERS[s].implemented]
        if planned:
            implemented = [s for s, p in registry.PAPERS.items() if p.implemented]
            return _fail(f"{planned[0]} is planned, not implemented; implemented: {', '.join(implemented)}")
    else:
        slugs = [s for s in slugs if registry.PAPERS[s].implemented]
    overrides = _parse_overrides(args.overrides)
    if isinstance(overrides, str):
        return _fail(overrides)
    base = args.out or (Path("runs/quick") if args.quick else Path("results"))
    if args.quick and base.resolve() == Path("results").resolve():
        return _fail("quick runs never write into results/; choose another --out")

    configs = {}
    for slug in slugs:  # validate every config before running anything
        mod = registry.experiment(slug)
        cfg = mod.Config.quick() if args.quick else mod.Config()
        try:
            cfg = cfg.with_overrides(overrides)
            if args.seeds:
                cfg = cfg.replace(seeds=tuple(args.seeds))
            if args.device:
                cfg = cfg.replace(device=args.device)
        except KeyError as e:
            return _fail(f"{slug}: {e.args[0]}")
        except (ValueError, TypeError) as e:
            return _fail(f"{slug}: {e}")
        configs[slug] = (mod, cfg)

    rows, crashed, failed_claims = [], 0, 0
    for slug, (mod, cfg) in configs.items():
        t0 = time.perf_counter()
        out_dir = base / slug
        print(f"== {slug}: {'quick' if args.quick else 'full'} run -> {out_dir}", file=sys.stderr, flush=True)
        try:
            res = mod.run(cfg, out_dir)
        except Exception as e:  # keep going: report it, exit 1 at the end
            crashed += 1
            traceback.print_exc(file=sys.stderr)
            rows.append((slug, f"CRASHED: {type(e).__name__}: {e}".splitlines()[0][:80], time.perf_counter() - t0))
            continue
        v = res.verdict
        failed_claims += not res.passed
        rows.append((slug, verdict_line(v), time.perf_counter() - t0))
        for c in res.claim_checks:
            mark = "VOID" if c.void_by else "holds" if c.passed else "DOES NOT HOLD"
            ci = f" [{c.ci_low:.4g}, {c.ci_high:.4g}]" if c.ci_low is not None else ""
            print(f"  [{c.kind}: {mark}] {c.name}: measured {c.measured:.4g}{ci} {c.direction} {c.threshold:.4g}")
        print(f"  report: {out_dir / 'report.md'}")
    print("\n| slug | verdict | wall s |\n|---|---|---|")
    for slug, verdict, wall in rows:
        print(f"| {slug} | {verdict} | {wall:.1f} |")
    if crashed:
        return 1
    return 1 if (args.strict and failed_claims) else 0


def _cmd_report(results_dir: Path, output: Path | None) -> int:
    from icml24.report import write_results_md

    if not results_dir.is_dir():
        return _fail(f"no results folder at {results_dir}")
    out = output or results_dir.resolve().parent / "RESULTS.md"
    write_results_md(results_dir, out)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        return _cmd_list()
    if args.command == "show":
        return _cmd_show(args.slug)
    if args.command == "run":
        return _cmd_run(args)
    return _cmd_report(args.results_dir, args.output)


if __name__ == "__main__":
    raise SystemExit(main())

"""Interleaved A/B of the bench/ suites: two revisions built side by side, every suite run alternately.

    .venv/bin/python bench/ab.py --a d8f72d6 --b HEAD --reps 2 --out /tmp/ab.json
    .venv/bin/python bench/ab.py --a d8f72d6 --b . --suites bench_codec,bench_registry -k "not twin"

Each revision is exported (``git archive``; ``.`` is this working tree as it is) into ``--work``/<name>, built in
place with this interpreter (``setup.py build_ext --inplace``), and run with ``PYTHONPATH`` set to its tree, so its
``engine`` (and ``engine.bindings``) is the one imported, which each run checks first. Within a repetition every
suite runs A then B, the next repetition B then A, so a change in the machine's load hits both alike. Per
benchmark the table gives the min over repetitions of each side's min (and median) and the ratio B / A; numeric
``extra_info`` figures a suite records (CPU per heartbeat, lines per CPU-second...) are compared too. A benchmark
present on one side only is listed as such. Only pytest-benchmark suites are run: a bench/ file without pytest tests
(bench_pcap, bench_grpc, bench_grpc_handler, and bench_brokerlog before it had tests) is a script with its own
command line, left out of the default selection and reported as such when named in ``--suites``. A ratio within
the spread of the two sides' repetitions is noise: the table shows the spread so the reader can tell.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def export(ref: str, work: Path) -> Path:
    """The tree of ``ref`` (a commit, or '.' for the working tree) under ``work``, built in place."""
    if ref == ".":
        return ROOT
    sha = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", ref], text=True).strip()
    tree = work / sha
    if not (tree / ".built").exists():
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=tree, check=True,
                       capture_output=True)
        # the installed package maps engine.bindings to <checkout>/bindings; a tree on PYTHONPATH needs it inside
        if not (tree / "engine" / "bindings").exists():
            (tree / "engine" / "bindings").symlink_to(tree / "bindings", target_is_directory=True)
        (tree / ".built").write_text(sha)
    return tree


def tree_env(tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.setdefault("ENGINE_SHARED_DIR", str(ROOT.parent / "shared"))
    return env


def check_imports(tree: Path) -> None:
    out = subprocess.check_output([sys.executable, "-c", "import engine, engine.bindings; "
                                   "print(engine.__file__); print(engine.bindings.__file__)"],
                                  cwd=tree, env=tree_env(tree), text=True).split()
    for path in out:
        if not Path(path).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"{tree}: imports {path}, not its own tree")


def run_suite(tree: Path, suite: str, k: str | None, out_json: Path, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", f"bench/{suite}.py", "--benchmark-only", "-q", "-p", "no:cacheprovider",
           f"--benchmark-json={out_json}"] + (["-k", k] if k else [])
    try:
        proc = subprocess.run(cmd, cwd=tree, env=tree_env(tree), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return {"error": f"timed out after {timeout:.0f} s: " + str(e.stdout or "")[-1500:]}
    if not out_json.exists():
        if proc.returncode == 5 and not is_pytest_suite(tree / "bench" / f"{suite}.py"):
            return {"error": f"bench/{suite}.py has no pytest tests in this revision: it is a standalone script "
                             f"(python bench/{suite}.py), which ab.py does not run"}
        return {"error": (proc.stdout + proc.stderr)[-2000:]}
    result = run_json(out_json)
    if proc.returncode not in (0, 5):
        result["__failed__"] = {"tail": (proc.stdout + proc.stderr)[-1500:]}
    return result


def is_pytest_suite(path: Path) -> bool:
    """Whether a bench/ file holds pytest-benchmark tests (bench_pcap, bench_grpc, bench_grpc_handler are scripts
    with their own command line: pytest collects nothing from them and writes no JSON)."""
    return path.exists() and "\ndef test_" in path.read_text()


def run_json(path: Path) -> dict:
    """benchmark name -> {min, median, extra: numeric extra_info} of one pytest-benchmark JSON file."""
    data = json.loads(path.read_text())
    result = {}
    for b in data.get("benchmarks", []):
        extra = {key: v for key, v in (b.get("extra_info") or {}).items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
        result[b["fullname"].split("::", 1)[-1]] = {"min": b["stats"]["min"], "median": b["stats"]["median"],
                                                    "extra": extra}
    return result


def combine(runs: list[dict]) -> dict:
    """name -> {min, median, spread of mins, extra: key -> (lowest, highest)} over the repetitions."""
    out: dict = {}
    for run in runs:
        for name, r in run.items():
            if name.startswith("__") or name == "error":
                continue
            o = out.setdefault(name, {"mins": [], "medians": [], "extra": {}})
            o["mins"].append(r["min"])
            o["medians"].append(r["median"])
            for key, v in r["extra"].items():
                o["extra"].setdefault(key, []).append(v)
    return out


def fmt_time(s: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def table(suite: str, a: dict, b: dict) -> list[str]:
    lines = [f"### {suite}", "", "| benchmark | A min | B min | B/A (min) | A spread | B spread | B/A (median) |",
             "|---|---|---|---|---|---|---|"]
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            lines.append(f"| {name} | {'-' if name not in a else fmt_time(min(a[name]['mins']))} | "
                         f"{'-' if name not in b else fmt_time(min(b[name]['mins']))} | one side only | | | |")
            continue
        am, bm = min(a[name]["mins"]), min(b[name]["mins"])
        amed, bmed = min(a[name]["medians"]), min(b[name]["medians"])

        def spread(x):
            return f"{(max(x) / min(x) - 1) * 100:.0f}%" if len(x) > 1 and min(x) > 0 else "-"

        lines.append(f"| {name} | {fmt_time(am)} | {fmt_time(bm)} | {bm / am:.2f} | {spread(a[name]['mins'])} | "
                     f"{spread(b[name]['mins'])} | {bmed / amed:.2f} |")
        for key in sorted(set(a[name]["extra"]) & set(b[name]["extra"])):
            xa, xb = a[name]["extra"][key], b[name]["extra"][key]
            if min(xa) > 0 and min(xb) > 0:
                lines.append(f"| {name} `{key}` | {min(xa):.4g}..{max(xa):.4g} | {min(xb):.4g}..{max(xb):.4g} | "
                             f"{min(xb) / min(xa):.2f} (lowest) | | | |")
    return lines + [""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="the 'before' revision (commit, or . for the working tree)")
    p.add_argument("--b", default=".", help="the 'after' revision (default: the working tree)")
    p.add_argument("--suites", default=None,
                   help="comma-separated bench/ suites (default: every bench_*.py both revisions have)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("-k", default=None, help="pytest -k expression passed to every suite")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one suite run may take")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rmqhb-ab")
    p.add_argument("--out", type=Path, default=None, help="write the raw runs and the table as JSON")
    p.add_argument("--tables-from", type=Path, default=None,
                   help="only print the tables of the per-run JSON files an earlier (e.g. interrupted) run left "
                        "in this directory (<A|B>-<suite>-<rep>.json, named on stderr as it runs)")
    args = p.parse_args(argv)
    if args.tables_from:
        suites = sorted({f.stem.split("-", 1)[1].rsplit("-", 1)[0] for f in args.tables_from.glob("[AB]-*.json")})
        lines = [f"A = {args.a}, B = {args.b}, runs from {args.tables_from}", ""]
        for suite in suites:
            sides = {side: [run_json(f) for f in sorted(args.tables_from.glob(f"{side}-{suite}-*.json"))]
                     for side in "AB"}
            if sides["A"] and sides["B"]:
                lines += table(suite, combine(sides["A"]), combine(sides["B"]))
            else:
                lines += [f"### {suite}", "", "only one side has a result", ""]
        print("\n".join(lines))
        return 0
    trees = {"A": export(args.a, args.work), "B": export(args.b, args.work)}
    for tree in trees.values():
        check_imports(tree)
    if args.suites:
        suites = [s for s in args.suites.split(",") if s]
    else:
        have = [{f.stem for f in (t / "bench").glob("bench_*.py") if is_pytest_suite(f)} for t in trees.values()]
        suites = sorted(have[0] & have[1])
        if have[0] ^ have[1]:
            print(f"suites in one revision only (not compared): {sorted(have[0] ^ have[1])}", file=sys.stderr)
        scripts = sorted({f.stem for t in trees.values() for f in (t / "bench").glob("bench_*.py")} - have[0] - have[1])
        if scripts:
            print(f"standalone scripts, no pytest tests (not run; run them per tree): {scripts}", file=sys.stderr)
    runs: dict = {side: {s: [] for s in suites} for side in trees}
    failures = []
    scratch = Path(tempfile.mkdtemp(prefix="ab-json-"))
    print(f"per-run JSON in {scratch}", file=sys.stderr, flush=True)
    for rep in range(args.reps):
        order = ("A", "B") if rep % 2 == 0 else ("B", "A")
        for suite in suites:
            for side in order:
                out = scratch / f"{side}-{suite}-{rep}.json"
                print(f"rep {rep + 1}/{args.reps} {suite} {side} ({trees[side]})", file=sys.stderr, flush=True)
                r = run_suite(trees[side], suite, args.k, out, args.timeout)
                if "error" in r or "__failed__" in r:
                    failures.append((side, suite, rep, r.get("error") or r["__failed__"]["tail"]))
                runs[side][suite].append(r)
    lines = [f"A = {args.a}, B = {args.b}, {args.reps} repetitions, interleaved", ""]
    for suite in suites:
        lines += table(suite, combine(runs["A"][suite]), combine(runs["B"][suite]))
    for side, suite, rep, tail in failures:
        lines += [f"FAILED: {side} {suite} rep {rep + 1}:", "```", tail.strip()[-800:], "```", ""]
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"a": args.a, "b": args.b, "runs": runs, "table": lines}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

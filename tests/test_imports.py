"""engine's modules import each other without cycles (issue 15: server <-> ioworker was one), and each one imports
on its own in a fresh interpreter. The same for ``bindings/`` (installed as ``engine.bindings``; issue 29: its scan
entry imported the readers, which imported the session back from it), checked together with engine's.

The graph is read with ast from every ``engine/**/*.py``: every import statement counts, at module level or inside a
function (a lazy import hides a cycle from the interpreter, not from the reader). The packages' ``__init__`` are left
out of the cycle check: Python runs one before any of its submodules, so a submodule taking a name from its package
(``from . import FrameDecoder``) cannot deadlock, and ``__init__`` importing its submodules is what a facade does.
"""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import engine
from conftest import ROOT

ENGINE = Path(ROOT) / "engine"
#: bindings/ is the package engine.bindings (pyproject's package-dir)
BINDINGS = Path(ROOT) / "bindings"


def _module_name(path: Path, root: Path, package: str | None = None) -> str:
    """``path``'s dotted name; ``package``: the name ``root`` is installed as (default: its directory name)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package or root.name] + parts)


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]  # a module's own package
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def import_graph(root: Path = ENGINE, *more: tuple[Path, str]) -> dict[str, set[str]]:
    """engine module -> the engine modules it imports (the package itself as 'engine'); ``more``: further
    (directory, package name) trees read into the same graph (bindings/ as engine.bindings)."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    for tree, package in more:
        files.update({_module_name(p, tree, package): p for p in tree.rglob("*.py")})
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                # `from pkg import x`: the submodule pkg.x if there is one, else a name of pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:  # engine.a.b where only engine.a is a file: the nearest module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]], skip=frozenset()) -> list[str] | None:
    """One cycle of the graph (its nodes in import order, the first repeated at the end), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(n):
        color[n] = GREY
        stack.append(n)
        for m in sorted(graph[n]):
            if m in skip or m not in graph:
                continue
            if color[m] == GREY:
                return stack[stack.index(m):] + [m]
            if color[m] == WHITE:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = BLACK
        return None

    for n in sorted(graph):
        if n not in skip and color[n] == WHITE:
            found = visit(n)
            if found:
                return found
    return None


def test_the_engine_import_graph_is_acyclic():
    graph = import_graph()
    assert "engine.broker.server" in graph and "engine.broker.ioworker" in graph and "engine.registry.client_registry" in graph
    assert "engine.broker.ioworker" in graph["engine.broker.server"]  # the edge that stays: the server starts the pool
    assert "engine.broker.server" not in graph["engine.broker.ioworker"]
    packages = {n for n in graph if (ENGINE.parent / n.replace(".", "/") / "__init__.py").exists()}
    assert {"engine", "engine.codec", "engine.registry", "engine.broker", "engine.recording"} <= packages
    cycle = find_cycle(graph, skip=packages)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_bindings_import_graph_is_acyclic():
    """bindings/ with engine, every import counted (inside functions too): `rmqhb scan` enters at
    engine.bindings.cli, which dispatches to the readers (recordings through analyses, brokerlog, pcap, merge);
    they share engine.bindings.session and scan_engine, and none imports the entry or the facade back."""
    graph = import_graph(ENGINE, (BINDINGS, "engine.bindings"))
    b = {n: {d for d in deps if d.startswith("engine.bindings.")} for n, deps in graph.items()
         if n.startswith("engine.bindings.")}
    # the graph was read: the entry's dispatch, a reader's lazy import of the analyses, an absolute import
    assert {"engine.bindings.merge", "engine.bindings.brokerlog", "engine.bindings.pcap",
            "engine.bindings.inputs"} <= b["engine.bindings.cli"]
    assert "engine.bindings.analyses" in b["engine.bindings.pcap"]
    assert "engine.bindings.gzinput" in b["engine.bindings.brokerlog"]
    assert b["engine.bindings.session"] == set()  # the shared session imports no other binding
    assert b["engine.bindings.spark"] == {"engine.bindings.analyses", "engine.bindings.cli"}
    above = {"engine.bindings.cli", "engine.bindings.spark"}  # the entry and the short import for notebooks
    back = sorted((a, d) for a, deps in b.items() if a != "engine.bindings.spark" for d in deps & above)
    assert back == []
    packages = {n for n in graph if n in ("engine", "engine.bindings")
                or (ENGINE.parent / n.replace(".", "/") / "__init__.py").exists()}
    cycles = [c for c in map(lambda n: cycle_through(graph, n, skip=packages), sorted(b)) if c]
    assert cycles == [], "import cycle: " + " -> ".join(cycles[0])  # (engine's own: the test above)


SCAN_LOADS = """
import json, sys
from engine.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "loaded": sorted(m for m in ("pyspark", "py4j", "pyarrow", "pandas", "matplotlib")
                                                     if m in sys.modules)}))
"""


@pytest.mark.parametrize("kind", ["broker log", "capture", "recording"])
def test_a_small_scan_in_this_process_loads_no_spark(tmp_path, kind):
    """`rmqhb scan` of a small input, as a user runs it (plots on), runs in this process (--engine auto) and loads
    what that needs only: never pyspark, py4j, pandas or matplotlib (the report draws its SVG plots itself); for a
    capture or a recording not pyarrow either (a broker log's line parser gives Arrow batches; the local path builds
    and reads them without the pyarrow calls that load pandas). The entry, the input checks, the engine choice and
    the recording's plan import none of them (docs/scan.md: the times this saves). The Python twin of the line
    parser (ENGINE_NO_EXTENSIONS=1) builds its batches with pa.array, which loads pandas: allowed there only."""
    from conftest import require_module

    require_module("pyspark")  # `rmqhb scan` wants the spark extra installed, even when it does not start Spark
    if kind == "broker log":
        from engine.bindings import brokerlog as bl

        path = tmp_path / "logs"
        bl.generate_broker_log(path / "broker.log", groups=2, members=3, seed=3)
        args, unwanted = [path, "--log-tz", "UTC"], {"pyspark", "py4j", "matplotlib"}
        if engine.native_modules().get("_brokerlog"):  # the compiled line parser (the twin loads pandas)
            unwanted.add("pandas")
    elif kind == "capture":
        args, unwanted = [Path(ROOT) / "tests" / "data" / "pcap" / "lo-eth-ipv4.pcap"], {"pyspark", "py4j", "pyarrow",
                                                                                           "pandas", "matplotlib"}
    else:
        from engine.recording.synth import FleetConfig, FleetGenerator

        FleetGenerator(FleetConfig(clients=6, groups=2, days=0.02, seed=4)).write(tmp_path / "rec")
        args, unwanted = [tmp_path / "rec"], {"pyspark", "py4j", "pyarrow", "pandas", "matplotlib"}
    r = subprocess.run([sys.executable, "-c", SCAN_LOADS, "scan", *map(str, args), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "RMQHB_DEBUG"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    got = json.loads(lines[-1])
    assert got["status"] == 0 and lines[-2].startswith("engine: local ("), r.stdout
    assert unwanted.isdisjoint(got["loaded"]), got["loaded"]


def cycle_through(graph: dict[str, set[str]], start: str, skip=frozenset()) -> list[str] | None:
    """A cycle of the graph through ``start`` (start, ..., start), or None."""
    parent = {start: None}
    todo = [start]
    while todo:
        n = todo.pop()
        for m in sorted(graph.get(n, ())):
            if m in skip:
                continue
            if m == start:
                path = [n]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return path[::-1] + [start]
            if m not in parent:
                parent[m] = n
                todo.append(m)
    return None


def test_the_cycle_finder_sees_lazy_imports(tmp_path):
    """The check can fail: a function-level import back is a cycle, relative and absolute forms alike."""
    pkg = tmp_path / "engine"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text("import os\nfrom .sub import b\nA = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import A\n    return A\n")
    (pkg / "c.py").write_text("from engine import a\nfrom . import A\n")
    graph = import_graph(pkg)
    assert graph["engine.a"] == {"engine.sub.b"}
    assert graph["engine.sub.b"] == {"engine.a"}
    assert graph["engine.c"] == {"engine.a", "engine"}
    assert find_cycle(graph, skip={"engine"}) == ["engine.a", "engine.sub.b", "engine.a"]
    assert cycle_through(graph, "engine.sub.b", skip={"engine"}) == ["engine.sub.b", "engine.a", "engine.sub.b"]
    assert cycle_through(graph, "engine.c", skip={"engine"}) is None
    (pkg / "sub" / "b.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(pkg), skip={"engine"}) is None


@pytest.mark.parametrize("no_extensions", ["0", "1"])
def test_every_engine_module_imports_alone_in_a_fresh_interpreter(no_extensions):
    """Each module first in its own interpreter (an import-order dependency shows as an ImportError there)."""
    names = sorted(n for n in import_graph() if not n.endswith("__main__"))
    env = {**os.environ}
    if no_extensions == "1":
        env["ENGINE_NO_EXTENSIONS"] = "1"
    else:
        env.pop("ENGINE_NO_EXTENSIONS", None)
    procs = {n: subprocess.Popen([sys.executable, "-c", f"import {n}"], cwd=ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for n in names}
    failed = {}
    for n, p in procs.items():
        _, err = p.communicate(timeout=120)
        if p.returncode:
            failed[n] = err.decode(errors="replace").strip().splitlines()[-1:]
    assert not failed, failed


#: engine's layers, lowest first: a module imports only from its own layer or a lower one (README: Layout)
LAYERS = {"codec": 0, "registry": 1, "recording": 1, "http2": 1, "broker": 2}


def test_the_layers_import_downwards_only():
    graph = import_graph()
    # the package's __init__ re-exports from every layer (a facade, run before any submodule: see the cycle check);
    # the shared rate-limited logger and shared timers sit below every layer; top-level tools (cli, demo, loadgen)
    # above them all
    def rank(module):
        if module in ("engine.logutil", "engine.alarms"):
            return -1
        return LAYERS.get(module.split(".")[1], 3)

    upward = sorted((a, b) for a, deps in graph.items() if a != "engine" for b in deps if b != "engine"
                    if rank(b) > rank(a) or (rank(b) == rank(a) == 1 and a.split(".")[1] != b.split(".")[1]))
    assert upward == []

"""The README and docs/ stay true: the configuration table is the one engine/broker/config.py describes
(scripts/config_table.py), and every command block of README.md and docs/*.md runs.

A fenced block in bash, sh or console (its ``$ `` lines) runs in bash -e -o pipefail, a python block in this
Python, each in a fresh directory holding links to the checkout's top-level entries (so ``python scripts/...``
works as in the checkout; a ``scripts/dev.sh`` block runs in the checkout itself, whose .venv it sets up) with the
venv's bin first on the PATH, as the README's reader has it. A block that cannot run here carries a visible marker on the line above its fence,
``<!-- not run: why -->``; one that starts Spark or takes minutes ``<!-- slow: why -->`` (run with -m slow).
"""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGUAGES = {"bash", "sh", "console", "python"}
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*(not run|slow):\s*(\S.*?)\s*-->$")
#: blocks left out of the run stay few: each is a command that needs what a test machine lacks (a cluster, root)
MAX_NOT_RUN = 10
BLOCK_TIMEOUT_S = 900


def fenced_blocks():
    """(page, line of the fence, language, text, marker kind, marker reason) of every fenced block."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            above = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            mark = MARKER.match(above)
            out.append((page, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                        mark.group(1) if mark else None, mark.group(2) if mark else None))
            i = end + 1
    return out


BLOCKS = fenced_blocks()


def _param(block):
    page, line, lang, text, kind, reason = block
    marks = [pytest.mark.slow] if kind == "slow" else []
    return pytest.param(block, id=f"{page.relative_to(ROOT)}:{line}", marks=marks)


RUNNABLE = [b for b in BLOCKS if b[2] in RUN_LANGUAGES and b[4] != "not run"]


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (work / entry.name).symlink_to(entry)
    return work


@pytest.mark.parametrize("block", [_param(b) for b in RUNNABLE])
def test_command_block_runs(block, tmp_path):
    page, line, lang, text, _, _ = block
    # scripts/dev.sh sets up the checkout's own .venv and builds in place: it runs there, as its reader runs it
    # (through links it would install and build into the checkout under another path); the rest in a fresh directory
    work = ROOT if "scripts/dev.sh" in text else _workdir(tmp_path)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if lang == "python":
        argv = [sys.executable, "-c", text]
    else:
        if lang == "console":
            text = "\n".join(ln[2:] for ln in text.splitlines() if ln.startswith("$ ")) + "\n"
        argv = ["bash", "-e", "-o", "pipefail", "-c", text]
    # a session of its own: what a block starts in the background (a broker) is stopped with it, even on failure
    p = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=BLOCK_TIMEOUT_S)
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if p.returncode is None:
            p.kill()
            out, err = p.communicate()
    assert p.returncode == 0, (f"{page.relative_to(ROOT)}:{line} exited {p.returncode}\n--- block\n{text}"
                               f"--- stdout\n{out[-3000:]}--- stderr\n{err[-3000:]}")


def test_every_block_names_its_language_and_few_are_left_out():
    """A block without a language could hold commands no test runs; the blocks left out stay few, each with why."""
    unnamed = [f"{b[0].relative_to(ROOT)}:{b[1]}" for b in BLOCKS if not b[2]]
    assert unnamed == []
    not_run = [f"{b[0].relative_to(ROOT)}:{b[1]} ({b[5]})" for b in BLOCKS if b[4] == "not run"]
    assert len(not_run) <= MAX_NOT_RUN, not_run
    assert any(b[2] in ("bash", "sh") and not b[4] for b in BLOCKS), "no command block runs at all"


def test_pages_name_only_what_a_user_has():
    """The README and docs name no file or history a user of the package lacks."""
    banned = re.compile(r"\.\./shared|\b(PROTOCOL|DESIGN|INTEROP|SPARK)\.md|\bissues? \d+|\bseeds?'|\bthe seeds\b")
    found = [(p.relative_to(ROOT).as_posix(), m.group()) for p in PAGES for m in banned.finditer(p.read_text())]
    assert found == []
    for page in PAGES:  # every relative link points at a file of the checkout
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}"
    # and so does every path of the checkout a page names (globs and the directories tests make, .v5 etc., aside)
    named = re.compile(r"(?<![\w./-])((?:engine|bindings|tests|scripts|pyx|fuzz|bench|docs)/[\w./-]*\w)")
    missing = [(page.relative_to(ROOT).as_posix(), path) for page in PAGES for path in named.findall(page.read_text())
               if "/." not in path and not (ROOT / path).exists()]
    assert missing == []


def test_every_docs_page_is_linked_once_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert readme.count(f"](docs/{page.name})") == 1, page.name


def test_config_table_is_current():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_table.py"), "--check"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr


def test_every_property_is_documented():
    sys.path.insert(0, str(ROOT / "scripts"))
    import config_table

    undocumented = [row for row in config_table.table().splitlines()[2:] if row.endswith("|  |")]
    assert undocumented == []

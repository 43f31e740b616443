"""The load generator moved into the package: `rmqhb loadgen` (engine/loadgen.py). This file keeps the
`python bench/loadgen.py ...` commands recorded in BENCHMARKS.md working and re-exports the module."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.loadgen import *  # noqa: E402,F401,F403
from engine.loadgen import SimClient, main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())

"""The real-client frame captures in ../shared/vectors (see its README): used by the demo, tests and benches."""
import json
import os
from pathlib import Path


def shared_dir() -> Path:
    """ENGINE_SHARED_DIR, or the `shared` folder beside the checkout (where CI and developers have it)."""
    env = os.environ.get("ENGINE_SHARED_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared"


def load_vectors(vectors_dir=None):
    """Every captured frame, in capture order: a list of (client, index entry, whole frame bytes)."""
    root = Path(vectors_dir) if vectors_dir else shared_dir() / "vectors"
    out = []
    for index_path in sorted(root.glob("*/index.json")):
        index = json.loads(index_path.read_text())
        for entry in index["frames"]:
            out.append((index["client"], entry, (index_path.parent / entry["file"]).read_bytes()))
    return out

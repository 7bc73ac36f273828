"""
Builds target_repo/data/corpus.txt.xz, the bundled target's default corpus.

    python tools/build_corpus.py   # needs CPython 3.11.7's standard library on disk

Provenance: the top-level modules (Lib/*.py) of the CPython 3.11.7 standard library, sorted
by file name, each introduced by a `# ==== NAME ====` line and separated by a blank line.
Machine-specific or joke modules are left out (see SKIP). Licence: Python Software Foundation
License v2 (see https://docs.python.org/3/license.html); the corpus is redistributed under it.
The output is pinned by SHA-256 in target_repo/prepare.py, so this script only matters for
provenance: every machine reads the same committed bytes.
"""
import lzma
import sys
import sysconfig
from pathlib import Path

EXPECTED_VERSION = (3, 11, 7)
SKIP = {"antigravity.py", "this.py", "__hello__.py"}  # jokes and a hello-world
OUT = Path(__file__).resolve().parents[1] / "target_repo" / "data" / "corpus.txt.xz"


def build_text(lib_dir: Path) -> str:
    parts = []
    for path in sorted(lib_dir.glob("*.py")):
        if path.name in SKIP or path.name.startswith("_sysconfigdata"):
            continue
        parts.append(f"# ==== {path.name} ====\n{path.read_text(encoding='utf-8')}\n")
    return "\n".join(parts)


if __name__ == "__main__":
    if sys.version_info[:3] != EXPECTED_VERSION:
        sys.exit(f"needs CPython {EXPECTED_VERSION}, running {sys.version_info[:3]}")
    text = build_text(Path(sysconfig.get_paths()["stdlib"]))
    OUT.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {OUT} ({len(text.encode()):,} bytes of text)")

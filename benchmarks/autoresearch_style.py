"""An autoresearch-style research repo made from the bundled target, to adopt as a new user
would: train.py writes no GITRESEARCH_METRICS points, redraws its progress lines with `\\r`
and end="" (as autoresearch's train.py does), reports an MFU from a peak-FLOPs constant, and
spells its batch size as a power of two. Real training on the CPU; early stop can only use
the printed training loss.

    python benchmarks/autoresearch_style.py /tmp/ar-demo
    cd /tmp/ar-demo && gitresearch loop --policy random --seed 0 --budget 20 --max-experiments 12
    gitresearch status; gitresearch log

Prints the repo's path. The edits are exact string replacements: a changed target fails loudly.
"""
import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gitresearch.gitstore import commit_all  # noqa: E402
from gitresearch.init import init_repo  # noqa: E402

EDITS = [
    ('BATCH_SIZE = 32 if CUDA else 16  # sequences per step',
     'BATCH_SIZE = 2**5 if CUDA else 2**4  # sequences per step'),
    ('LOG_EVERY_S = 1.0  # seconds of training between progress lines',
     'LOG_EVERY_S = 1.0  # seconds of training between progress lines\n'
     'H100_BF16_PEAK_FLOPS = 989.5e12  # only for the printed MFU, as in autoresearch'),
    ('    metrics = open(metrics_path, "a") if metrics_path else None',
     '    metrics = None  # autoresearch-style: no metric points, only printed progress'),
    ('''                  f"tok/sec: {tok_per_s:,.0f} | remaining: {max(0.0, budget - train_seconds):.0f}s",
                  flush=True)''',
     '''                  f"tok/sec: {tok_per_s:,.0f} | mfu: {100 * 6 * num_params * tok_per_s / H100_BF16_PEAK_FLOPS:.4f}% "
                  f"| remaining: {max(0.0, budget - train_seconds):.0f}s    ", end="", flush=True)'''),
    ('            print(f"step {step:05d}', '            print(f"\\rstep {step:05d}'),
    ('    print("---")\n    print(f"dev_bpb:', '    print()\n    print("---")\n    print(f"dev_bpb:'),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    for line in init_repo(args.directory, "nanochat"):
        print(line, file=sys.stderr)
    train = args.directory / "train.py"
    source = train.read_text()
    for old, new in EDITS:
        if source.count(old) != 1:
            raise SystemExit(f"the bundled train.py changed: {old!r} is not there exactly once")
        source = source.replace(old, new)
    train.write_text(source)
    commit_all(args.directory, "autoresearch-style train.py: no metric points, \\r progress lines")
    subprocess.run(["git", "update-ref", "refs/heads/best", "HEAD"], cwd=args.directory, check=True)
    print(args.directory.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())

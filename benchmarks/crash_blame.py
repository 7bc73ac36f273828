#!/usr/bin/env python
"""How many constants the policies leave alone (history.crashed_constants) after 50, 100, ...
experiments of each loop of `gitresearch bench research --workdir DIR` runs, by the rule of the
gitresearch checkout on PYTHONPATH: run it once with an older checkout to compare rules on the
same loops. Prints JSON: "DIR/LOOP" -> counts, one per 50 experiments.

    PYTHONPATH=CHECKOUT python benchmarks/crash_blame.py DIR [DIR...]
"""
import json
import sys
from pathlib import Path

from gitresearch.gitstore import Store
from gitresearch.history import crashed_constants

out = {}
for root in sys.argv[1:]:
    for repo in sorted(Path(root).iterdir()):
        store = Store(repo)
        exps = [e for e in reversed(store.experiments()) if (e.record or {}).get("status")]  # baseline first
        out[f"{root}/{repo.name}"] = [len(crashed_constants(store, exps[i:0:-1])) for i in range(50, len(exps), 50)]
print(json.dumps(out, indent=1))

#!/usr/bin/env python
"""The valid shares of a saved policy LM's replies in a research repo, judged as the loop judges
them (git apply, then the stale-line repair): the three checks `gitresearch pretrain-policy`
runs after training (first tries, after failed tries, on a moved best; 40 prompts each, seed
0), without training. Prints JSON: per check samples, valid, repaired (valid only after the
repair), no_diff, does_not_apply, does_not_parse, no_constant_changed, valid_share,
distinct_valid, changes_per_valid; and seconds.

    python benchmarks/check_policy_lm.py REPO MODEL_DIR
"""
import json
import sys
import time

from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.policies.pretrain import PretrainConfig, check_repo

repo, model = sys.argv[1], sys.argv[2]
started = time.time()
stats = check_repo(Store(repo), load(repo), model, PretrainConfig())
stats["seconds"] = round(time.time() - started, 1)
print(json.dumps(stats, indent=1))

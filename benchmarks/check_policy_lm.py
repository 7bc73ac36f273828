#!/usr/bin/env python
"""The valid shares of a saved policy LM's replies in a research repo, judged as the loop judges
them (git apply, then the stale-line repair): the three checks `gitresearch pretrain-policy`
runs after training (first tries, after failed tries, on a moved best; 40 prompts each, seed
0), without training. Prints JSON: per check samples, valid, repaired (valid only after the
repair), no_diff, does_not_apply, does_not_parse, no_constant_changed, valid_share,
distinct_valid, changes_per_valid, median_abs_log_move and beyond_factor_3 (how far the valid
replies move the positive numbers they change, against the factor 3 of the imitation data);
and seconds. The reply form (diff or moves) is the one MODEL_DIR/pretrain.json says the model
imitated. TEMPERATURE (default 0.7, as the loop samples) and SAMPLES (default 40) are
optional.

    python benchmarks/check_policy_lm.py REPO MODEL_DIR [TEMPERATURE [SAMPLES]]
"""
import json
import sys
import time
from pathlib import Path

from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.policies.pretrain import PretrainConfig, check_repo

repo, model = sys.argv[1], sys.argv[2]
started = time.time()
temperature = float(sys.argv[3]) if len(sys.argv) > 3 else PretrainConfig.temperature
samples = int(sys.argv[4]) if len(sys.argv) > 4 else PretrainConfig.eval_samples
trained = json.loads((Path(model) / "pretrain.json").read_text()).get("config", {})
form = trained.get("reply", "diff")
stats = check_repo(Store(repo), load(repo), model,
                   PretrainConfig(temperature=temperature, eval_samples=samples, reply=form))
stats["seconds"] = round(time.time() - started, 1)
print(json.dumps({"temperature": temperature, "reply": form, **stats}, indent=1))

"""`--set SECTION.NAME=VALUE`: any setting of gitresearch.toml from the command line, typed as
the file would type it, with the named flags winning."""
import pytest

from gitresearch.cli import _load
from gitresearch.config import ConfigError, load, parse_settings


def test_set_values_are_read_as_toml_and_checked_against_the_settings_types(tmp_path):
    overrides = parse_settings(["rl.ent_coef=0", "reward.novelty_epsilon = 0.25", "early_stop.enabled=false",
                                "llm.model=./lm", 'llm.base_url="http://x:1/v1"', "files.editable=['a.py', 'b.py']"])
    assert overrides == {"rl.ent_coef": 0, "reward.novelty_epsilon": 0.25, "early_stop.enabled": False,
                         "llm.model": "./lm", "llm.base_url": "http://x:1/v1", "files.editable": ("a.py", "b.py")}
    config = load(tmp_path, overrides)
    assert (config.rl.ent_coef, config.reward.novelty_epsilon, config.early_stop.enabled) == (0, 0.25, False)
    assert config.llm.model == "./lm" and config.files.editable == ("a.py", "b.py")
    with pytest.raises(ConfigError, match="--set rl.ent_coef = 'high': expected float"):
        parse_settings(["rl.ent_coef=high"])


@pytest.mark.parametrize("item", ["rl.entropy=0", "nosuch.x=1", "ent_coef=0", "rl.ent_coef", "search.DEPTH=1"])
def test_a_set_item_that_names_no_setting_is_an_error_naming_the_item(item):
    with pytest.raises(ConfigError, match=f"--set {item}: expected SECTION.NAME=VALUE"):
        parse_settings([item])


def test_the_named_flags_win_over_set_and_set_wins_over_the_file(tmp_path):
    (tmp_path / "gitresearch.toml").write_text("[run]\nbudget_s = 10\ngrace_s = 5\n")
    config = _load(tmp_path, parse_settings(["run.budget_s=20", "run.grace_s=7"]), **{"run.budget_s": 30.0,
                                                                                       "run.grace_s": None})
    assert (config.run.budget_s, config.run.grace_s) == (30.0, 7)


@pytest.mark.parametrize("overrides, match", [
    ({"rl.kl_coef_min": 2.0}, "kl_coef_min = 2.0: expected between 0 and kl_coef_max"),
    ({"rl.kl_coef_min": -0.1}, "kl_coef_min = -0.1"),
    ({"rl.kl_mode": "both"}, "kl_mode = 'both': expected one of loss, reward"),
    ({"rl.token_share": 0.0}, r"token_share = 0.0: expected a share in \(0, 1\]"),
    ({"rl.token_share": 1.5}, "token_share = 1.5"),
    ({"rl.prior_share": 1.5}, r"prior_share = 1.5: expected a share in \[0, 1\]"),
    ({"rl.prior_share": -0.1}, "prior_share = -0.1"),
    ({"rl.grammar": True}, r"\[rl\] grammar = true samples the Moves reply's grammar: it needs \[llm\] reply = \"moves\", not 'diff'"),
    ({"policy.max_move_factor": 1.0}, r"max_move_factor = 1.0: expected a factor above 1, or 0 \(off\)"),
    ({"policy.max_move_factor": -3.0}, "max_move_factor = -3.0"),
    ({"policy.min_move_factor": 0.9}, r"min_move_factor = 0.9: expected a factor above 1"),
    ({"policy.min_move_factor": 3.0, "policy.max_move_factor": 3.0}, r"below max_move_factor \(3.0"),
    ({"llm.reply": "steps"}, r"\[llm\] reply = 'steps': expected one of diff, moves"),
    ({"llm.prompt": "short"}, r"\[llm\] prompt = 'short': expected one of full, compact"),
])
def test_rl_settings_out_of_range_are_refused_with_the_setting(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        load(tmp_path, overrides)
    assert load(tmp_path, {"rl.kl_coef_min": 0.05}).rl.kl_coef_min == 0.05

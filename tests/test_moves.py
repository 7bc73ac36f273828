"""The moves reply form ([llm] reply = "moves"): a Moves line's steps become the literals the
harness writes, rounded as the random policy rounds and with the divisor relations kept; a
bad step is an invalid reply that says why; through the loop, the diff goes through the same
validation and the note names the values written."""
import random
import re
from pathlib import Path

import pytest

from chat_server import ChatServer, reply
from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.policies import InvalidReply
from gitresearch.policies.constants import find_sites, rewrite
from gitresearch.policies.imitation import examples
from gitresearch.policies.moves import step_for
from gitresearch.policies.prompt import MOVES_TASK
from gitresearch.policies.reply import parse_reply
from helpers import cli
from test_imitation import commit_start, empty_repo
from test_llm_policy import LLM_CONFIG, SECRET, llm_repo, notes

TARGET = Path(__file__).parents[1] / "target_repo"
SOURCE = ("LR = 0.005  # learning rate\nTEMP = 1.5\nDEPTH = 4\nWIDTH = 128\nHEAD_DIM = 64\nBETAS = (0.8, 0.95)\n"
          "USE_BIAS = False\nTOKENS = 2**10\n"
          "value = LR * DEPTH * (WIDTH // HEAD_DIM) + sum(BETAS) + USE_BIAS + TOKENS + TEMP\nprint('val_bpb', value)\n")


def values(text: str, tmp_path) -> tuple[dict, str]:
    """(name -> value after the Moves line `text` is applied to SOURCE with git, description)."""
    repo, store = empty_repo(tmp_path)
    commit_start(repo, SOURCE)
    description, diff = parse_reply(text, {"train.py": SOURCE}, store.make_diff)
    tree, _ = store.apply_diff(store.resolve("HEAD"), diff)
    after = store.tree_file(tree, "train.py")
    return {s.name: s.value for s in find_sites(after)}, description


@pytest.mark.parametrize("line, expected", [
    ("Moves: LR x2.1", {"LR": 0.0104}),  # a float in (0, 1): its odds x2.1, 3 significant digits
    ("Moves: LR /3", {"LR": 0.00167}),
    ("moves: LR * 2", {"LR": 0.00995}),
    ("Moves: DEPTH +2; LR x0.5", {"DEPTH": 6, "LR": 0.00251}),
    ("Moves: BETAS[1] x2", {"BETAS[1]": 0.974}),  # odds 19 -> 38: a beta stays below 1
    ("Moves: BETAS[1] x100", {"BETAS[1]": 0.999}),
    ("Moves: BETAS[1] x1e6", {"BETAS[1]": 0.9999999}),  # not 1.0: the digits that keep it below 1
    ("Moves: BETAS[0] /4", {"BETAS[0]": 0.5}),
    ("Moves: TEMP x2", {"TEMP": 3.0}),  # above 1: the value itself
    ("Moves: DEPTH -3", {"DEPTH": 1}),
    ("Moves: DEPTH x1.6", {"DEPTH": 6}),  # an int rounds to an int
    ("Moves: BETAS[1] = 0.99", {"BETAS[1]": 0.99}),
    ("Moves: USE_BIAS = True", {"USE_BIAS": True}),
    ("Moves: TOKENS +1", {"TOKENS": 11}),  # an exponent steps
    ("Moves: WIDTH x1.4", {"WIDTH": 192}),  # 179: a multiple of its alignment 32 and of HEAD_DIM 64
    ("Moves: HEAD_DIM /2", {"HEAD_DIM": 32}),
    ("Moves: HEAD_DIM x1.5", {"HEAD_DIM": 128}),  # a divisor stays a divisor of WIDTH 128
])
def test_steps_become_the_values_written(tmp_path, line, expected):
    before = {s.name: s.value for s in find_sites(SOURCE)}
    after, description = values("Some text first\n" + line, tmp_path)
    assert {k: v for k, v in after.items() if before[k] != v} == expected
    assert description == "; ".join(f"{k} {v!r} -> {after[k]!r}" for k, v in before.items() if after[k] != v)
    assert all(type(after[k]) is type(before[k]) for k in after)  # an int stays an int


@pytest.mark.parametrize("line, error", [
    ("Moves:", "the Moves line is empty"),
    ("Moves: LR x", "cannot read the step `LR x`"),
    ("Moves: LR xtwo", "needs a number after its operator"),
    ("Moves: LR x0", "needs a factor above 0"),
    ("Moves: LR xnan", "not a finite number"),
    ("Moves: TEMP x1.5e308", "takes TEMP beyond any finite number"),  # 2.25e308 overflows
    ("Moves: BETAS[1] x1e308", "takes BETAS[1] beyond any finite number"),  # odds: inf / inf
    ("Moves: DEPTH = 1e999", "takes DEPTH beyond any finite number"),
    ("Moves: lr x2", "names lr, which is not a constant shown; the constants: BETAS[0], BETAS[1], DEPTH, "
                     "HEAD_DIM, LR, TEMP, TOKENS, USE_BIAS, WIDTH"),
    ("Moves: TOKENS x2", "TOKENS is an exponent: step it with +K or -K"),
    ("Moves: USE_BIAS x2", "USE_BIAS is a bool"),
    ("Moves: USE_BIAS = 3", "it takes True or False"),
    ("Moves: DEPTH +0.5", "DEPTH is an int: add a whole number"),
    ("Moves: DEPTH = 'deep'", "sets DEPTH to \"'deep'\"; it takes a number"),
    ("Moves: DEPTH = deep", "sets a value that is not a number or bool"),
    ("Moves: WIDTH x1.2", "leave every value where it was"),  # 154 rounds to 160, then to 128 by HEAD_DIM
    ("Moves: LR x2; LR /2", "moved twice"),
    ("Moves: DEPTH x1.1", "leave every value where it was"),  # 4.4 rounds to 4
])
def test_a_bad_step_is_an_invalid_reply_that_says_why(line, error):
    with pytest.raises(InvalidReply, match=re.escape(error)):
        parse_reply(line, {"train.py": SOURCE}, lambda *a: "")


def test_steps_over_two_files_are_refused():
    files = {"train.py": SOURCE, "other.py": "GAMMA = 0.5\nloss = GAMMA * 2\nprint('val_bpb', loss)\n"}
    with pytest.raises(InvalidReply, match="change 2 files"):
        parse_reply("Moves: LR x2; GAMMA x1.5", files, lambda *a: "")


def test_only_the_constants_shown_may_be_named():
    shown = {"train.py": [s for s in find_sites(SOURCE) if s.name != "LR"]}
    with pytest.raises(InvalidReply, match="names LR, which is not a constant shown"):
        parse_reply("Moves: LR x2", {"train.py": SOURCE}, lambda *a: "", shown)


@pytest.mark.parametrize("old_new", [(0.005, 0.0105), (0.005, 0.00167), (128, 384), (4, 7), (4, 1),
                                     (0.95, 0.979), (0.95, 0.5), (2.5, 0.4), (False, True), (0.5, -0.5)])
def test_step_for_states_a_change_the_harness_writes_back(old_new):
    from gitresearch.policies.constants import Site
    from gitresearch.policies.moves import new_value, STEP

    old, new = old_new
    site = Site("X", 1, 4, 5, old)
    step = step_for(site, new)
    name, op, arg = STEP.match(step).group("name", "op", "arg")
    assert name == "X" and new_value(site, op, arg, step) == pytest.approx(new, rel=2e-3)


def test_imitation_replies_in_the_moves_form_parse_and_apply_to_what_the_example_shows(tmp_path):
    config, source = load(TARGET), (TARGET / "train.py").read_text()
    repo, store = empty_repo(tmp_path)
    pairs = examples({"train.py": source}, random.Random(0), store.make_diff, n=25,
                     skip=config.policy.skip_constants, max_changes=3, reply="moves")
    for ex in pairs:
        assert ex.reply.startswith("Moves: ") and ex.reply.count("\n") == 1
        assert ex.prompt.endswith(MOVES_TASK)
        commit_start(repo, ex.before)
        shown = {"train.py": find_sites(ex.before, config.policy.skip_constants)}
        _, diff = parse_reply(ex.reply, {"train.py": ex.before}, store.make_diff, shown)
        tree, _ = store.apply_diff(store.resolve("HEAD"), diff)
        assert store.tree_file(tree, "train.py") == ex.after != ex.before
        for asked in ex.retries[1::2]:  # the loop's own errors, and the moves form's request
            assert asked["content"].startswith("Rejected: ") and asked["content"].endswith("Reply again: one Moves line.")


def test_the_loop_writes_the_steps_and_feeds_a_bad_one_back(tmp_path):
    config = LLM_CONFIG + 'prompt = "compact"\nreply = "moves"\n'
    repo = llm_repo(tmp_path, config)
    script = [reply("Moves: learning_rate /2"), reply("Moves: LR /2; DEPTH +2")]
    with ChatServer(script) as server:
        cli("loop", "--max-experiments", "1", "--no-early-stop", "--base-url", server.url,
            cwd=repo, env={"OPENAI_API_KEY": SECRET})
    rec = notes(repo)[1]
    assert rec["status"] in ("keep", "discard") and rec["description"] == "LR 0.1 -> 0.0526; DEPTH 4 -> 6"
    assert rec["attempts"][0]["error"].startswith("the step `learning_rate /2` names learning_rate, which is not")
    first = server.requests[0]["body"]["messages"]
    assert first[-1]["content"].endswith(MOVES_TASK)  # the compact prompt asks for moves
    assert server.requests[-1]["body"]["messages"][-1]["content"].endswith("Reply again: one Moves line.")
    commit = next(e.commit for e in Store(repo).experiments() if e.number == 1)
    written = Store(repo).read_file(commit, "train.py")
    assert "LR = 0.0526  #" in written and "DEPTH = 6  #" in written


def test_a_past_experiments_steps_restate_its_described_change_as_the_harness_writes_it():
    """steps_of reads `NAME OLD -> NEW` back into the steps that write NEW from OLD; it gives
    None for a description in words (an agent's), which the prompt then shows unannotated."""
    from gitresearch.policies.constants import described, relations
    from gitresearch.policies.moves import moved, steps_of
    from gitresearch.policies.random_search import random_changes

    config, source = load(TARGET), (TARGET / "train.py").read_text()
    sites = {"train.py": find_sites(source, config.policy.skip_constants)}
    rng = random.Random(3)
    for _ in range(40):
        changes = random_changes(sites["train.py"], rng, relations(source))
        steps = steps_of(described(changes), sites)
        assert steps == "; ".join(step_for(s, new) for s, new in changes)
        # applied to the file the change started from, the steps write what the change wrote
        # (to the 3 digits of the factor and of the value written: 14.8 may come back as 14.9)
        wrote = {s.name: new for s, new in moved(steps, {"train.py": source}, sites)[1]}
        assert wrote.keys() == {s.name for s, _ in changes}
        for site, new in changes:
            assert wrote[site.name] == pytest.approx(new, rel=1e-2)
    assert steps_of("halve the learning rate", sites) is None
    assert steps_of("LR 0.1 -> 0.05; tweak the rest", sites) is None


def test_the_loops_compact_prompt_shows_each_past_experiments_steps_in_the_moves_form_only():
    from dataclasses import replace

    from gitresearch.config import Config
    from gitresearch.history import Entry
    from gitresearch.policies import State
    from gitresearch.policies.prompt import build_compact_prompt

    entries = [Entry(2, "c" * 40, "p" * 40, "LR 0.1 -> 0.05; DEPTH 4 -> 6", "keep", 1.5, -0.01, "", "", 1.0, None, ""),
               Entry(1, "d" * 40, "p" * 40, "try a cosine schedule", "discard", 1.6, 0.1, "", "", 1.0, None, "")]
    words = lambda text: len(text.split())  # noqa: E731
    for form in ("moves", "diff"):
        config = Config()
        config = replace(config, llm=replace(config.llm, reply=form))
        state = State("0" * 40, {"train.py": SOURCE}, entries, [], config)
        user = build_compact_prompt(state, words, 100_000, 100).messages[0]["content"]
        past = user.split("newest first)\n")[1].split("\n\n")[0].splitlines()
        # LR in (0, 1) moves in odds: 0.1 -> 0.05 is /2.11 (moves.py)
        annotated = "#2 keep 1.500000 (-0.010000): LR 0.1 -> 0.05; DEPTH 4 -> 6 | Moves: LR /2.11; DEPTH +2"
        assert past == [annotated if form == "moves" else annotated.split(" | ")[0],
                        "#1 discard 1.600000 (+0.100000): try a cosine schedule"]


def test_a_momentum_teacher_answers_a_kept_newest_line_with_again(tmp_path):
    """With momentum, an example whose newest past experiment is a keep answers `Moves: again`,
    which the harness reads as that keep's steps (the rest answer as the random policy); the
    kept steps are what moved best to the files shown; every reply still applies to them."""
    from gitresearch.policies.moves import find_moves, moved

    config, source = load(TARGET), (TARGET / "train.py").read_text()
    skip = config.policy.skip_constants
    repo, store = empty_repo(tmp_path)
    pairs = examples({"train.py": source}, random.Random(5), store.make_diff, n=40, skip=skip,
                     max_changes=3, reply="moves", momentum=0.5)
    repeats = 0
    for ex in pairs:
        past = ex.prompt.split("newest first)\n")[1].split("\n\n")[0].splitlines()
        newest_keep = next((line for line in past if " keep " in line), None)
        assert ex.kept == (newest_keep.split(" | Moves: ")[1] if newest_keep else None)
        if " keep " not in past[0]:
            assert ex.repeats is None and "again" not in ex.reply
            continue
        kept = past[0].split(" | Moves: ")[1]
        shown = {"train.py": find_sites(ex.before, skip)}
        try:
            rewrite_moved(ex.before, kept, shown, moved)
        except InvalidReply:  # the steps round to no change from here: a fresh move instead
            assert "again" not in ex.reply and ex.repeats is None
            continue
        repeats += 1
        assert ex.reply == "Moves: again\n" and ex.repeats == kept
        # undo the keep: the values before it, moved by its steps, give the file shown
        for change in past[0].split(": ", 1)[1].split(" | ")[0].split("; "):
            name, old, new = re.fullmatch(r"(\S+) (\S+) -> (\S+)", change).groups()
            assert {s.name: repr(s.value) for s in find_sites(ex.before, skip)}[name] == new
        # `again` writes what the kept steps written out write
        assert rewrite_moved(ex.before, kept, shown, moved) == ex.after != ex.before
        assert rewrite(ex.before, moved(find_moves(ex.reply), {"train.py": ex.before}, shown, kept)[1]) == ex.after
        commit_start(repo, ex.before)
        _, diff = parse_reply(ex.reply, {"train.py": ex.before}, store.make_diff, shown, ex.kept)
        assert store.tree_file(store.apply_diff(store.resolve("HEAD"), diff)[0], "train.py") == ex.after
    assert 12 <= repeats <= 28  # about half of 40
    plain = examples({"train.py": source}, random.Random(5), store.make_diff, n=40, skip=skip, max_changes=3,
                     reply="moves")
    assert sum(" | Moves: " in ex.prompt for ex in plain) >= 20  # the steps are shown without a teacher too
    assert not any("again" in ex.reply for ex in plain)


@pytest.mark.parametrize("line, kept, expected", [
    ("Moves: again", "LR x2.1; DEPTH +1", {"LR": 0.0104, "DEPTH": 5}),
    ("Moves: AGAIN", "LR x2.1", {"LR": 0.0104}),
    ("Moves: again; TEMP x2", "LR /2", {"LR": 0.00251, "TEMP": 3.0}),
])
def test_again_repeats_the_steps_that_made_best(tmp_path, line, kept, expected):
    repo, store = empty_repo(tmp_path)
    commit_start(repo, SOURCE)
    _, diff = parse_reply(line, {"train.py": SOURCE}, store.make_diff, None, kept)
    after = store.tree_file(store.apply_diff(store.resolve("HEAD"), diff)[0], "train.py")
    assert {s.name: s.value for s in find_sites(after) if s.name in expected} == expected


@pytest.mark.parametrize("kept, error", [
    (None, "best has none to repeat"),
    ("LR x2; DEPTH +1", ""),  # fine alone; with LR named again below, moved twice
])
def test_again_without_a_kept_change_or_beside_its_own_names_is_refused(kept, error):
    with pytest.raises(InvalidReply, match=error or "moved twice"):
        parse_reply("Moves: again" + ("" if error else "; LR /2"), {"train.py": SOURCE}, lambda *a: "", None, kept)


def test_best_steps_are_the_newest_keeps_steps_and_none_at_the_baseline():
    from gitresearch.policies.moves import best_steps

    sites = {"train.py": find_sites(SOURCE)}
    base = {"status": "baseline", "description": "baseline"}
    keep = {"status": "keep", "description": "LR 0.005 -> 0.0104; DEPTH 4 -> 5"}
    assert best_steps([base], sites) is None and best_steps([], sites) is None
    assert best_steps([base, keep], sites) == "LR x2.09; DEPTH +1"  # LR in (0, 1): its odds
    assert best_steps([base, {"status": "keep", "description": "a cosine schedule"}], sites) is None


def test_the_loop_reads_again_as_the_steps_that_made_best(tmp_path):
    """Through the loop: a keep, then `Moves: again` writes the kept steps once more on the
    new best; on the baseline `again` is refused and fed back."""
    config = LLM_CONFIG + 'prompt = "compact"\nreply = "moves"\n'
    repo = llm_repo(tmp_path, config)
    script = [reply("Moves: again"), reply("Moves: DEPTH +2"), reply("Moves: again")]
    with ChatServer(script) as server:
        cli("loop", "--max-experiments", "2", "--no-early-stop", "--base-url", server.url,
            cwd=repo, env={"OPENAI_API_KEY": SECRET})
    recs = notes(repo)
    assert recs[1]["attempts"][0]["error"].startswith("`again` repeats the steps of the change that made the current best")
    assert recs[1]["description"] == "DEPTH 4 -> 6"
    if recs[1]["status"] != "keep":
        pytest.skip("the fake target did not keep DEPTH +2")
    assert recs[2]["description"] == "DEPTH 6 -> 8"


def rewrite_moved(text: str, steps: str, shown: dict, moved) -> str:
    from gitresearch.policies.constants import rewrite

    return rewrite(text, moved(steps, {"train.py": text}, shown)[1])


def test_step_names_are_the_constants_of_the_steps_that_read():
    from gitresearch.policies.moves import step_names
    assert step_names("MATRIX_LR x2; DEPTH +1, ADAM_BETAS[1] = 0.9") == {"MATRIX_LR", "DEPTH", "ADAM_BETAS[1]"}
    assert step_names("MATRIX_LR twice; ADAM_BETAS[0 x2; ; HEAD_DIM /2") == {"HEAD_DIM"}
    assert step_names("") == set()

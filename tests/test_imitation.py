"""Imitation data for a small policy LM: every reply parses and applies with git to the file
its prompt showed, edits only live constants, and shows the model every line it must copy."""
import random
import re
from pathlib import Path

import pytest

from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.policies import PolicyError
from gitresearch.policies.constants import Site, find_sites
from gitresearch.policies.imitation import examples
from gitresearch.policies.prompt import compact_view
from gitresearch.policies.reply import parse_reply
from helpers import sh

TARGET = Path(__file__).parents[1] / "target_repo"


def empty_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    return repo, Store(repo)


def commit_start(repo, text: str) -> None:
    """HEAD holds `text` as train.py: the file an example's prompt showed."""
    (repo / "train.py").write_text(text)
    sh("git", "add", "train.py", cwd=repo)
    sh("git", "commit", "-qm", "start", "--allow-empty", cwd=repo)


def test_compact_view_keeps_the_lines_around_each_constant_and_numbers_its_runs():
    source = "import os\n\n\nA = 1\nx = 2\n\n\n\n\n\n\nB = 0.5\ny = A * B\n"
    view = compact_view(source, [Site("A", 4, 4, 5, 1), Site("B", 12, 4, 7, 0.5)], context=1)
    assert view == "# lines 3-5\n\nA = 1\nx = 2\n# lines 11-13\n\nB = 0.5\ny = A * B"


@pytest.mark.parametrize("max_changes", [1, 3])
def test_every_reply_parses_and_applies_to_the_file_its_prompt_showed(tmp_path, max_changes):
    """One constant per reply by default; with max_changes 3, one to three as the random
    policy (more only where a divisor relation moves a multiple with its divisor)."""
    config, source = load(TARGET), (TARGET / "train.py").read_text()
    repo, store = empty_repo(tmp_path)
    pairs = examples({"train.py": source}, random.Random(0), store.make_diff, n=25,
                     skip=config.policy.skip_constants, max_changes=max_changes)
    counts = []
    assert len({ex.before for ex in pairs}) >= 15  # starts moved off the baseline, not one file
    live = {s.name for s in find_sites(source, config.policy.skip_constants)}
    for ex in pairs:
        commit_start(repo, ex.before)
        description, diff = parse_reply(ex.reply, {"train.py": ex.before}, store.make_diff)
        assert diff.startswith("--- a/train.py\n+++ b/train.py\n@@ ") and all(
            line.endswith(" @@") for line in diff.splitlines() if line.startswith("@@"))
        tree, changed = store.apply_diff(store.resolve("HEAD"), diff)
        assert changed == ["train.py"] and store.tree_file(tree, "train.py") == ex.after
        before = {s.name: s.value for s in find_sites(ex.before, config.policy.skip_constants)}
        after = {s.name: s.value for s in find_sites(ex.after, config.policy.skip_constants)}
        moved = {name for name in before if before[name] != after[name]}
        removed = [line for line in diff.splitlines()[2:] if line.startswith("-")]
        assert moved <= live and 1 <= len(removed) <= len(moved)  # a line per constant (ADAM_BETAS: 2 on 1)
        counts.append(len(moved))
        assert description == ex.reply.splitlines()[0].removeprefix("Description: ")
        for name in moved:
            assert f"{name} {before[name]!r} -> {after[name]!r}" in description
        # what the model must copy (context and removed lines) is in its prompt
        for line in diff.splitlines()[2:]:
            if line[:1] in (" ", "-"):
                assert line[1:] in ex.prompt.splitlines(), line
    if max_changes == 1:
        assert set(counts) == {1}
    else:  # every count from 1 to 3 occurs; a fourth only through a relation (WIDTH with HEAD_DIM)
        assert {1, 2, 3} <= set(counts) and max(counts) <= 4


def test_min_changes_sets_the_fewest_constants_a_fresh_or_repeated_reply_moves():
    """With min_changes 2 a reply moves two or three constants (the target's constants at 0,
    which no factor moves, give their place to others), and so do the kept steps the momentum
    teacher repeats (but where a divisor relation folds a move back); the default draws one to three, and min above max is refused."""
    config, source = load(TARGET), (TARGET / "train.py").read_text()
    skip, files = config.policy.skip_constants, {"train.py": source}
    values = lambda text: {s.name: s.value for s in find_sites(text, skip)}  # noqa: E731

    def counts(**kwargs):
        pairs = examples(files, random.Random(3), None, 30, skip, max_changes=3, reply="moves", **kwargs)
        moved = [(values(ex.before), values(ex.after)) for ex in pairs]
        return [sum(v != after[k] for k, v in before.items()) for before, after in moved], pairs

    wide, _ = counts(min_changes=2)
    plain, _ = counts()
    assert min(wide) >= 2 and {2, 3} <= set(wide)
    assert sum(n == 1 for n in plain) >= 0.2 * len(plain)
    _, pairs = counts(min_changes=2, momentum=0.5)
    repeated = [ex.repeats for ex in pairs if ex.repeats]
    # one step only where keeping a divisor relation folded a move back (keep_relations)
    assert len(repeated) >= 8 and sum(steps.count("; ") >= 1 for steps in repeated) >= 0.9 * len(repeated)
    with pytest.raises(ValueError, match="min_changes 4"):
        examples(files, random.Random(3), None, 5, skip, max_changes=3, min_changes=4)


def test_min_factor_teaches_only_moves_at_least_that_far_fresh_or_repeated():
    """With min_factor 1.5 every float constant a reply moves (a fresh move, or the kept steps
    `again` repeats) moves by x1.5 to x3 or /1.5 to /3 (shares by their odds), as the harness
    writes the Moves line (its rounding); without it about a fifth are under x1.25; a
    floor at the largest factor or under 1 is refused."""
    import math
    config, source = load(TARGET), (TARGET / "train.py").read_text()
    skip, files = config.policy.skip_constants, {"train.py": source}
    values = lambda text: {s.name: s.value for s in find_sites(text, skip)}  # noqa: E731
    odds = lambda v: v / (1 - v) if 0 < v < 1 else v  # noqa: E731

    def sizes(**kwargs):
        pairs = examples(files, random.Random(5), None, 40, skip, max_changes=3, reply="moves", momentum=0.5, **kwargs)
        out = []
        for ex in pairs:
            before, after = values(ex.before), values(ex.after)
            out += [(abs(math.log(odds(after[k]) / odds(v))), ex.repeats is not None) for k, v in before.items()
                    if isinstance(v, float) and v > 0 and after[k] != v]
        return out

    floored, plain = sizes(min_factor=1.5), sizes()
    assert {True, False} <= {repeated for _, repeated in floored}  # fresh moves and `again` both judged
    assert all(size >= math.log(1.5) - 0.02 and size <= math.log(3) + 0.02 for size, _ in floored)
    assert sum(size < math.log(1.25) for size, _ in plain) >= 0.08 * len(plain)
    for bad in (3.0, 0.5):
        with pytest.raises(ValueError, match="min_factor"):
            examples(files, random.Random(3), None, 5, skip, max_changes=3, min_factor=bad)


def test_failed_tries_before_a_reply_are_fed_back_as_the_loop_feeds_back_its_own(tmp_path):
    """Each made-up failed try fails the loop's real checks with the error it shows, and the
    messages are those build_compact_prompt makes for a state holding those tries."""
    import re

    from gitresearch.config import Config
    from gitresearch.gitstore import InvalidDiff
    from gitresearch.policies import InvalidReply, State
    from gitresearch.policies.base import Attempt
    from gitresearch.policies.prompt import build_compact_prompt

    config, source = load(TARGET), (TARGET / "train.py").read_text()
    repo, store = empty_repo(tmp_path)
    pairs = examples({"train.py": source}, random.Random(1), store.make_diff, n=40,
                     skip=config.policy.skip_constants, tries=(1, 2))
    kinds = set()
    for ex in pairs:
        assert len(ex.retries) in (2, 4) and ex.messages[1:] == list(ex.retries)
        commit_start(repo, ex.before)
        head = store.resolve("HEAD")
        attempts = []
        for said, told in zip(ex.retries[::2], ex.retries[1::2]):
            assert said["role"] == "assistant" and told["role"] == "user"
            reply = "" if said["content"] == "(empty reply)" else said["content"]
            error = told["content"].removeprefix("Rejected: ").split("\nReply again:")[0]
            try:
                _, diff = parse_reply(reply, {"train.py": ex.before}, store.make_diff)
            except InvalidReply as err:
                assert str(err) == error
                kinds.add("empty" if not reply else "no_diff")
                attempts.append(Attempt(reply, "", error))
                continue
            try:
                store.apply_diff(head, diff)
            except InvalidDiff as err:  # git's own words, at this repo's commit
                assert str(err) == re.sub(r"to [0-9a-f]{12}:", f"to {head[:12]}:", error)
                kinds.add("stale")
            else:
                assert re.fullmatch(r"this exact change was already tried as experiment #\d+; "
                                    r"propose something different", error)
                kinds.add("already_tried")
            attempts.append(Attempt(reply, diff, error))
        state = State(head, {"train.py": ex.before}, [], [], Config(), attempts=tuple(attempts))
        fed_back = build_compact_prompt(state, lambda text: len(text.split()), 100_000, 100).messages[1:]
        assert fed_back == list(ex.retries)
    assert kinds == {"empty", "no_diff", "stale", "already_tried"}


def test_with_the_loops_max_move_factor_failed_tries_include_its_commonest_failures(tmp_path):
    """In the moves form with max_factor, the made-up failed tries include a step past the
    factor, rejected with the loop's own validation error (proposal.validate), and a constant
    moved twice; the messages are those build_compact_prompt makes for a state holding them.
    (lmK answered such an error with an empty reply 30 times in 30: docs/gym.md.)"""
    from dataclasses import replace

    from gitresearch.policies import InvalidReply, State
    from gitresearch.policies.base import Attempt
    from gitresearch.policies.prompt import build_compact_prompt
    from gitresearch.proposal import InvalidProposal, validate

    config, source = load(TARGET), (TARGET / "train.py").read_text()
    config = replace(config, policy=replace(config.policy, max_move_factor=3.0),
                     llm=replace(config.llm, reply="moves", prompt="compact"))
    skip = config.policy.skip_constants
    repo, store = empty_repo(tmp_path)
    pairs = examples({"train.py": source}, random.Random(2), store.make_diff, n=30, skip=skip, tries=(2,),
                     reply="moves", max_factor=3.0)
    kinds = []
    for ex in pairs:
        commit_start(repo, ex.before)
        head = store.resolve("HEAD")
        sites = {"train.py": find_sites(ex.before, skip)}
        attempts = []
        for said, told in zip(ex.retries[::2], ex.retries[1::2]):
            reply = "" if said["content"] == "(empty reply)" else said["content"]
            error = told["content"].removeprefix("Rejected: ").split("\nReply again:")[0]
            try:
                _, diff = parse_reply(reply, {"train.py": ex.before}, store.make_diff, sites)
            except InvalidReply as err:
                assert str(err) == error
                kinds.append("twice" if "moved twice" in error else "other")
                attempts.append(Attempt(reply, "", error))
                continue
            try:
                validate(store, config, head, diff)
            except InvalidProposal as err:
                assert str(err) == error
                kinds.append("too_far" if "max_move_factor" in error else "other")
            else:  # the one failure that passes validation: a change already tried
                assert error.startswith("this exact change was already tried"), error
            attempts.append(Attempt(reply, diff, error))
        state = State(head, {"train.py": ex.before}, [], [], config, attempts=tuple(attempts))
        fed_back = build_compact_prompt(state, lambda text: len(text.split()), 100_000, 100).messages[1:]
        assert fed_back == list(ex.retries)
    assert kinds.count("too_far") >= 5 and kinds.count("twice") >= 5, kinds
    # without the factor, the failed tries are the four made-up kinds as before
    plain = examples({"train.py": source}, random.Random(2), store.make_diff, n=30, skip=skip, tries=(2,),
                     reply="moves")
    shown = "".join(m["content"] for ex in plain for m in ex.retries)
    assert "max_move_factor" not in shown and "moved twice" not in shown


def test_a_pretrained_policy_lm_learns_the_reply_format_and_is_judged_on_real_applies(tmp_path):
    from gitresearch.init import init_repo
    from gitresearch.policies.ppo import PPOLearner
    from gitresearch.policies.pretrain import PretrainConfig, pretrain_repo

    repo = tmp_path / "research"
    list(init_repo(repo, "nanochat"))
    store, config = Store(repo), load(repo)
    # a window that about half the examples' prompts and replies overflow (their median is
    # about 670 tokens): those are left out of training, and the checks draw prompts that fit
    settings = PretrainConfig(examples=300, layers=1, width=48, heads=2, steps=120, batch_size=4,
                              eval_samples=4, lr=3e-3, positions=672)
    stats = pretrain_repo(store, config, tmp_path / "lm", settings, log=lambda line: None)
    assert 0 < stats["examples"] < 300
    assert stats["final_loss"] < 0.5 * stats["first_loss"], stats  # it learnt the replies' tokens
    sampled = stats["sampled"]
    for check in ("sampled", "sampled_after_failure", "sampled_moved"):
        sampled = stats[check]
        assert sampled["samples"] == 4 and sum(sampled[k] for k in (
            "valid", "no_diff", "does_not_apply", "does_not_parse", "no_constant_changed", "too_far")) == 4
        assert 0 <= sampled["repaired"] <= sampled["valid"]
    # --init goes on training it: its own tokenizer, starting where it stopped
    from dataclasses import replace

    from gitresearch.policies.pretrain import pretrain
    files = {"train.py": store.read_file(store.resolve("HEAD"), "train.py")}
    more = pretrain(files, tmp_path / "lm2", store.make_diff, replace(
        settings, init=str(tmp_path / "lm"), examples=40, steps=5, lr=1e-4), config.policy.skip_constants,
        log=lambda line: None)
    assert more["first_loss"] < 0.7 * stats["first_loss"], (more, stats)
    # with the loop's reply budget its prompts are cut to fit beside it, as the loop cuts them
    cut = pretrain(files, tmp_path / "lm3", store.make_diff, replace(
        settings, init=str(tmp_path / "lm"), examples=40, steps=1, lr=1e-4, history=30, reply_tokens=160),
        config.policy.skip_constants, log=lambda line: None)
    headers = len("USER:\n\n\nASSISTANT:\n")  # the chat template's tokens: at most one per character
    assert cut["longest_prompt"] <= 672 - 160 - 16 + headers < more["longest_prompt"], (cut, more)
    assert (tmp_path / "lm2" / "tokenizer.json").read_text() == (tmp_path / "lm" / "tokenizer.json").read_text()
    # it loads as the rl policy's model, and the compact prompt of the repo's state fits it
    learner = PPOLearner(str(tmp_path / "lm"), config.rl, config.llm)
    assert learner.context_tokens == settings.positions and learner.render(
        [{"role": "user", "content": "x"}]) == "USER:\nx\n\nASSISTANT:\n"
    # loop_fit counts a prompt's tokens as the loop's compact prompt does, to the token
    from types import SimpleNamespace

    from gitresearch.policies import State
    from gitresearch.policies.pretrain import loop_fit
    from gitresearch.policies.prompt import build_compact_prompt
    history = [SimpleNamespace(experiment=n, status="discard", val_bpb=2.0, delta=0.01,
                               description=f"MATRIX_LR 0.005 -> 0.00{n}") for n in range(9, 0, -1)]
    window = learner.context_tokens
    prompt = build_compact_prompt(State("0" * 40, files, history, [], config), learner.count_tokens, window, 64)
    room = window - 16 - prompt.tokens  # the largest reply budget beside this prompt
    assert room >= 64 and loop_fit(learner.tokenizer, window, room)(prompt.messages)
    assert not loop_fit(learner.tokenizer, window, room + 1)(prompt.messages)
    assert loop_fit(learner.tokenizer, window, 0) is None


def test_the_compact_prompt_drops_the_oldest_history_to_fit_and_never_the_constants():
    from types import SimpleNamespace

    from gitresearch.config import Config
    from gitresearch.policies import State
    from gitresearch.policies.base import Attempt
    from gitresearch.policies.prompt import build_compact_prompt

    source = (TARGET / "train.py").read_text()
    history = [SimpleNamespace(experiment=n, status="discard", val_bpb=2.0 + n / 100, delta=0.01,
                               description=f"MATRIX_LR 0.005 -> 0.00{n}") for n in range(40, 0, -1)]
    state = State("0" * 40, {"train.py": source}, history, [], Config())
    words = lambda text: len(text.split())  # noqa: E731  (a token counter)
    full = build_compact_prompt(state, words, 100_000, 100)
    assert full.history_shown == 40 and "#1 discard" in full.messages[0]["content"]
    fitted = build_compact_prompt(state, words, full.tokens - 30 + 100, 100)
    assert 0 < fitted.history_shown < 40 and fitted.history_dropped == 40 - fitted.history_shown
    assert "#40 discard" in fitted.messages[0]["content"] and "#1 discard" not in fitted.messages[0]["content"]
    assert "MATRIX_LR = 0.005" in fitted.messages[0]["content"] and fitted.tokens <= full.tokens - 30
    with pytest.raises(PolicyError, match="compact prompt needs"):
        build_compact_prompt(state, words, 50, 10)
    # fed-back tries go after the history, oldest first, before the loop would have to stop
    tries = [Attempt(f"reply {n} " + "word " * 50, "", f"error {n}") for n in (1, 2)]
    retried = State("0" * 40, {"train.py": source}, history, [], Config(), attempts=tuple(tries))
    bare = build_compact_prompt(State("0" * 40, {"train.py": source}, [], [], Config()), words, 100_000, 100)
    both = build_compact_prompt(retried, words, 100_000, 100)
    assert [m["role"] for m in both.messages] == ["user", "assistant", "user", "assistant", "user"]
    one = build_compact_prompt(retried, words, bare.tokens + 16 + 100 + 70, 100)  # room for one try
    assert one.history_shown == 0 and [m["content"][:7] for m in one.messages[1:]] == ["reply 2", "Rejecte"]
    none = build_compact_prompt(retried, words, bare.tokens + 16 + 100, 100)
    assert none.history_shown == 0 and len(none.messages) == 1 and "MATRIX_LR = 0.005" in none.messages[0]["content"]


def history_of(prompt: str) -> list[str]:
    """The past-experiment lines of a compact prompt, newest first."""
    block = prompt.split("newest first)\n", 1)[1].split("\n\n# Your task", 1)[0]
    return [] if block == "(none yet)" else block.split("\n")


def test_imitation_prompts_cut_to_the_loops_reply_budget_give_way_as_the_loops_do():
    """With `fits`, each example's prompt keeps its newest history lines: the first count in
    the loop's sequence (a quarter of the shown lines dropped at a time) whose messages fit,
    the count before it not fitting; a repeated keep is always still shown; the same draws
    uncut overflow the budget (else the test would show nothing)."""
    config, source = load(TARGET), (TARGET / "train.py").read_text()
    skip, files = config.policy.skip_constants, {"train.py": source}
    words = lambda messages: sum(len(m["content"].split()) for m in messages)  # noqa: E731
    budget = 330
    fits = lambda messages: words(messages) <= budget  # noqa: E731
    cut_ever = 0
    for seed in range(12):
        common = dict(max_changes=3, reply="moves", momentum=0.5, history=30)
        whole = examples(files, random.Random(seed), None, 1, skip, **common)[0]
        cut = examples(files, random.Random(seed), None, 1, skip, fits=fits, **common)[0]
        assert fits(cut.messages)
        if cut.reply != whole.reply:  # drawn again after a cut that lost its kept line
            assert cut.repeats is None or history_of(cut.prompt)[0].split()[1] == "keep"
            continue
        lines, shown = history_of(whole.prompt), history_of(cut.prompt)
        assert shown == lines[:len(shown)]
        counts = [len(lines)]
        while counts[-1] > 0:
            counts.append(counts[-1] - max(1, counts[-1] // 4))
        assert len(shown) in counts
        if len(shown) < len(lines):  # the count before it in the sequence did not fit
            cut_ever += 1
            bigger = counts[counts.index(len(shown)) - 1]
            longer = cut.prompt.replace("\n".join(shown) or "(none yet)", "\n".join(lines[:bigger]))
            assert not fits([{"role": "user", "content": longer}, *cut.retries])
        if cut.repeats:
            assert shown[0].split()[1] == "keep"
    assert cut_ever >= 4
    with pytest.raises(ValueError, match="view of the constants alone overflows"):
        examples(files, random.Random(0), None, 1, skip, reply="moves", fits=lambda messages: False)


def test_a_view_that_hides_constants_as_crash_blame_does_is_never_named_by_the_reply():
    """With hide 1 every view leaves out the lines of one or two of the file's constants (never
    those of the keep `again` repeats), the made-up history names them in some examples, the
    reply never does (its Moves line and the file it writes); with hide 0 every view shows them
    all. The loop's compact prompt leaves a constant blamed for crashes out the same way."""
    from gitresearch.policies.moves import step_names
    config, source = load(TARGET), (TARGET / "train.py").read_text()
    skip, files = config.policy.skip_constants, {"train.py": source}
    every = {s.name for s in find_sites(source, skip)}
    values = lambda text: {s.name: s.value for s in find_sites(text, skip)}  # noqa: E731
    shown = lambda prompt: {n for n in every if re.search(rf"^{re.escape(n.split('[')[0])}\b", prompt, re.M)}  # noqa: E731
    pairs = examples(files, random.Random(4), None, 40, skip, max_changes=3, reply="moves", momentum=0.5, hide=1.0)
    named_hidden = again = 0
    for ex in pairs:
        view = ex.prompt.split("# Past experiments")[0]
        hidden = {n.split("[")[0] for n in every} - {n.split("[")[0] for n in shown(view)}
        assert 1 <= len(hidden) <= 2, hidden
        named_hidden += any(h in line for line in history_of(ex.prompt) for h in hidden)
        written = step_names(ex.kept) if ex.repeats else step_names(ex.reply.split(":", 1)[1])
        again += ex.repeats is not None
        assert not {n.split("[")[0] for n in written} & hidden, (written, hidden)
        before, after = values(ex.before), values(ex.after)
        assert not {k.split("[")[0] for k, v in before.items() if after[k] != v} & hidden
    assert named_hidden >= 10 and again >= 10
    plain = examples(files, random.Random(4), None, 10, skip, max_changes=3, reply="moves")
    assert all(shown(ex.prompt.split("# Past experiments")[0]) == every for ex in plain)
    from gitresearch.policies import State
    from gitresearch.policies.prompt import build_compact_prompt
    blamed = State("0" * 40, files, [], [], config, diagnostics={"crashed_constants": {"HEAD_DIM": [3, 5]}})
    words = lambda text: len(text.split())  # noqa: E731  (a token counter)
    view = build_compact_prompt(blamed, words, 100_000, 100).messages[0]["content"]
    assert shown(view) == every - {"HEAD_DIM"} and "MLP_RATIO = " in view


def test_the_pretraining_loss_on_right_padded_batches_equals_the_masked_loss():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from gitresearch.policies.pretrain import reply_loss

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    pairs = [([5, 6, 7, 8, 9, 10, 11], [-100, -100, -100, 8, 9, 10, 11]), ([12, 13, 14], [-100, 13, 14])]
    batch = [(i, lab, [0.0 if x == -100 else 1.0 for x in lab]) for i, lab in pairs]
    width, pad = 7, 3
    ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in pairs])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in pairs])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in pairs])
    masked = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert torch.allclose(reply_loss(model, batch, pad), masked, atol=1e-6)
    # and the padding is really ignored: another pad id gives the same loss
    assert torch.allclose(reply_loss(model, batch, 0), masked, atol=1e-6)
    # a weighted token counts as that many copies of its own loss
    losses = torch.nn.functional.cross_entropy(model(input_ids=ids, attention_mask=mask).logits[:, :-1].transpose(1, 2),
                                               labels[:, 1:], reduction="none")
    weighted = [(i, lab, [0.0 if x == -100 else (4.0 if x == 9 else 1.0) for x in lab]) for i, lab in pairs]
    expected = (losses.sum() + 3 * losses[0, 4 - 1]) / (6 + 3)  # 6 labelled tokens, one of them 4x
    assert torch.allclose(reply_loss(model, weighted, pad), expected, atol=1e-6)


def test_the_copy_weight_falls_on_the_old_values_and_the_removed_line_only(tmp_path):
    from gitresearch.policies.pretrain import encode, train_tokenizer

    _, store = empty_repo(tmp_path)
    source = (TARGET / "train.py").read_text()
    pairs = examples({"train.py": source}, random.Random(3), store.make_diff, 30, ("CURVE_POINTS",), tries=(0, 1))
    tokenizer = train_tokenizer([e.prompt + e.reply for e in pairs], 400)
    for e in pairs:
        ids, labels, weights = encode(tokenizer, e, 4096, copy_weight=5.0)
        assert len(ids) == len(labels) == len(weights)
        reply = [(i, w) for i, lab, w in zip(ids, labels, weights) if lab != -100]
        assert all(w == 0.0 for lab, w in zip(labels, weights) if lab == -100)
        weighted = tokenizer.decode([i for i, w in reply if w == 5.0])
        plain = tokenizer.decode([i for i, w in reply if w == 1.0])
        removed = next(line[1:] for line in e.reply.splitlines() if line.startswith("-") and not line.startswith("---"))
        added = next(line[1:] for line in e.reply.splitlines() if line.startswith("+") and not line.startswith("+++"))
        old = re.match(r"Description: \S+ (.+?) -> ", e.reply).group(1)
        assert removed in weighted and weighted.replace(removed, "", 1).strip() == old
        assert added in plain and "Description:" in plain and "@@" in plain


def test_in_the_moves_form_the_copy_weight_falls_on_the_constant_names_only(tmp_path):
    from gitresearch.policies.pretrain import encode, train_tokenizer

    _, store = empty_repo(tmp_path)
    source = (TARGET / "train.py").read_text()
    pairs = examples({"train.py": source}, random.Random(4), store.make_diff, 30, ("CURVE_POINTS",), max_changes=3,
                     reply="moves", tries=(0,))
    tokenizer = train_tokenizer([e.prompt + e.reply for e in pairs], 400, digits=True)
    for e in pairs:
        ids, labels, weights = encode(tokenizer, e, 4096, copy_weight=5.0)
        reply = [(i, w) for i, lab, w in zip(ids, labels, weights) if lab != -100]
        weighted = tokenizer.decode([i for i, w in reply if w == 5.0])
        names = [step.split()[0] for step in e.reply.removeprefix("Moves: ").strip().split("; ")]
        # the names, nothing else (a name's first token carries the space before it)
        assert weighted.replace(" ", "") == "".join(names), (weighted, e.reply)


def test_a_digit_tokenizer_gives_every_digit_its_own_token_and_decodes_exactly(tmp_path):
    from gitresearch.policies.pretrain import train_tokenizer

    _, store = empty_repo(tmp_path)
    source = (TARGET / "train.py").read_text()
    pairs = examples({"train.py": source}, random.Random(5), store.make_diff, 30, ("CURVE_POINTS",), tries=(0, 1))
    texts = [e.prompt + e.reply for e in pairs]
    merged, split = train_tokenizer(texts, 400), train_tokenizer(texts, 400, digits=True)
    # BPE alone merges some digit run of the imitation data into one token
    assert any(sum(c.isdigit() for c in token) > 1 for token in merged.get_vocab())
    assert not any(sum(c.isdigit() for c in token) > 1 for token in split.get_vocab())
    for text in texts:
        ids = split(text, add_special_tokens=False)["input_ids"]
        assert split.decode(ids) == text
        assert sum(any(c.isdigit() for c in split.convert_ids_to_tokens(i)) for i in ids) == sum(c.isdigit() for c in text)



def test_a_digit_tokenizer_cannot_be_asked_of_a_model_that_goes_on_training(tmp_path):
    from gitresearch.policies.pretrain import PretrainConfig, pretrain

    _, store = empty_repo(tmp_path)
    with pytest.raises(ValueError, match="digits"):
        pretrain({"train.py": (TARGET / "train.py").read_text()}, tmp_path / "lm", store.make_diff,
                 PretrainConfig(init=str(tmp_path), digits=True, examples=10, steps=1), log=lambda line: None)
    assert not (tmp_path / "lm").exists()

"""The LLM policy: reply parsing, the prompt built from git, the chat-completions client
against a real local server, and the loop end to end with scripted replies."""
import difflib

import pytest

from chat_server import ChatServer, reply, slow, status
from gitresearch.config import ConfirmConfig, LLMConfig, NoiseConfig, load
from gitresearch.confirm import floor
from gitresearch.diffs import diff_sha
from gitresearch.gitstore import Store
from gitresearch.history import build_state
from gitresearch.policies import BackendError, InvalidReply, PolicyError
from gitresearch.policies.backends import OpenAIBackend
from gitresearch.policies.prompt import build_prompt, render_diagnostics
from gitresearch.policies.reply import parse_reply
from helpers import FAKES, cli, make_repo, sh

SECRET = "sk-test-secret-4242"
FAKE = (FAKES / "curve.py").read_text()


def edit(source: str, old: str, new: str, path="train.py") -> tuple[str, str]:
    """(new source, the unified diff a model would write for it, 3 lines of context)."""
    changed = source.replace(old, new)
    assert changed != source, old
    lines = difflib.unified_diff(source.splitlines(True), changed.splitlines(True), f"a/{path}", f"b/{path}")
    return changed, "".join(lines)


# -- reply -> diff ----------------------------------------------------------------------------

FILES = {"train.py": "A = 1\nB = 2\nC = 3\nD = 4\n"}
DIFF = "--- a/train.py\n+++ b/train.py\n@@ -1,3 +1,3 @@\n A = 1\n-B = 2\n+B = 5\n C = 3\n"


def fake_make_diff(path, old, new):
    return f"whole file {path}\n{new}"


@pytest.mark.parametrize("text", [
    f"Description: raise B\n```diff\n{DIFF}```\nThat should help.",
    f"Description: raise B\n\n{DIFF}\nI hope this helps!",
    f"**Description**: raise B\n~~~patch\n{DIFF}~~~\n",
    f"Description: raise B\n```diff\n{DIFF}",  # cut off by max_tokens before the closing fence
])
def test_reply_with_a_diff(text):
    description, found = parse_reply(text, FILES, fake_make_diff)
    assert description == "raise B"
    assert found == DIFF


def test_reply_with_the_whole_file():
    text = "Description: B to 7\n```python\nA = 1\nB = 7\nC = 3\nD = 4\n```"
    assert parse_reply(text, FILES, fake_make_diff) == ("B to 7", "whole file train.py\nA = 1\nB = 7\nC = 3\nD = 4\n")
    with pytest.raises(InvalidReply, match="no unified diff"):  # a snippet never replaces the file
        parse_reply("Description: x\n```python\nB = 7\n```", FILES, fake_make_diff)


@pytest.mark.parametrize("text", ["", "   ", "I would raise the learning rate.", "```\nB = = 7\n```"])
def test_reply_without_a_diff(text):
    with pytest.raises(InvalidReply) as err:
        parse_reply(text, FILES, fake_make_diff)
    assert err.value.reply == text


# -- the client -----------------------------------------------------------------------------

def backend(url, **settings) -> OpenAIBackend:
    config = LLMConfig(model="scripted-coder", base_url=url, timeout_s=1.0, backoff_s=0.01, **settings)
    return OpenAIBackend(config, environ={"OPENAI_API_KEY": SECRET}, sleep=lambda s: None)


def test_client_retries_429_5xx_and_timeouts():
    with ChatServer([status(429, retry_after="0"), status(503), slow(3.0, "late"), reply("hello")]) as server:
        completion = backend(server.url, retries=3).complete([{"role": "user", "content": "hi"}])
    assert completion.text == "hello" and completion.usage["total_tokens"] == 15
    assert len(server.requests) == 4
    for request in server.requests:
        assert request["path"] == "/v1/chat/completions"
        assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
        assert request["body"]["model"] == "scripted-coder" and request["body"]["messages"][0]["content"] == "hi"


def test_client_gives_up_with_the_reason():
    with ChatServer([status(429), status(429)]) as server:
        with pytest.raises(BackendError, match=r"HTTP 429.*after 2 attempts"):
            backend(server.url, retries=1).complete([{"role": "user", "content": "hi"}])
    with ChatServer([slow(3.0, "late")]) as server:
        with pytest.raises(BackendError, match="timed out"):
            backend(server.url, retries=0).complete([{"role": "user", "content": "hi"}])
    with ChatServer([status(401), reply("never asked")]) as server:  # a 4xx is not retried
        with pytest.raises(BackendError, match="HTTP 401"):
            backend(server.url, retries=3).complete([{"role": "user", "content": "hi"}])
        assert len(server.requests) == 1
    with pytest.raises(BackendError, match="connection error"):  # nothing listens there
        backend("http://127.0.0.1:9/v1", retries=1).complete([{"role": "user", "content": "hi"}])


def test_base_url_and_key_from_the_environment():
    config = LLMConfig(model="m", api_key_env="MY_KEY")
    client = OpenAIBackend(config, environ={"OPENAI_BASE_URL": "http://h:1/v1/", "MY_KEY": "k"})
    assert client.base_url == "http://h:1/v1" and client.client.headers["Authorization"] == "Bearer k"
    assert OpenAIBackend(LLMConfig(model="m"), environ={}).base_url == "https://api.openai.com/v1"
    with pytest.raises(BackendError, match="model is not set"):
        OpenAIBackend(LLMConfig(), environ={})


# -- end to end ------------------------------------------------------------------------------

LLM_CONFIG = ('[policy]\nname = "llm"\nmax_tries = 2\nagenda = "AGENDA.md"\n'
              '[llm]\nmodel = "scripted-coder"\ntimeout_s = 1.0\nretries = 1\nbackoff_s = 0.05\n')


PREPARE = "DATA = 'data.bin'  # frozen: the data and the metric\n"


def llm_repo(tmp_path, config=LLM_CONFIG):
    repo = make_repo(tmp_path / "repo", config=config)
    (repo / "AGENDA.md").write_text("Find a better depth and learning rate.\n"
                                    "You may also edit prepare.py and gitresearch.toml.\n")
    (repo / "prepare.py").write_text(PREPARE)
    sh("git", "add", "AGENDA.md", "prepare.py", cwd=repo)
    sh("git", "commit", "-qm", "agenda", cwd=repo)
    cli("init", cwd=repo)
    return repo


def notes(repo) -> dict[int, dict]:
    store = Store(repo)
    return {e.number: e.record for e in store.experiments()}


def test_loop_with_scripted_replies(tmp_path):
    repo = llm_repo(tmp_path)
    fenced = lambda text, body: f"Description: {text}\n```diff\n{body}```\n"
    deeper, deeper_diff = edit(FAKE, "DEPTH = 4", "DEPTH = 6")
    lr_05, lr_05_diff = edit(deeper, "LR = 0.1", "LR = 0.05")
    lr_03, lr_03_diff = edit(lr_05, "LR = 0.05", "LR = 0.03")
    script = [
        # 1: a valid plain diff -> keep (depth 6 is the fake's optimum)
        reply("Description: deeper model\n" + deeper_diff),
        # 2: a fenced diff -> discard (a worse learning rate)
        reply(fenced("higher lr", edit(deeper, "LR = 0.1", "LR = 0.2")[1])),
        # 3: a diff of prepare.py (the agenda says it may: it may not), then of the config -> invalid
        reply(fenced("easier data", edit(PREPARE, "data.bin", "easy.bin", path="prepare.py")[1])),
        reply(fenced("widen", edit((repo / "gitresearch.toml").read_text(), '"train.py"',
                                   '"train.py", "prepare.py"', path="gitresearch.toml")[1])),
        # 4: a diff that does not apply (a context line says depth 4, best has 6), then a
        # syntax error -> invalid
        reply(fenced("stale", edit(FAKE, "STEP_S = 0.0", "STEP_S = 0.01")[1])),
        reply(fenced("broken", edit(deeper, "LR = 0.1", "LR = = 0.1")[1])),
        # 5: a 429, then a valid diff -> keep
        status(429, retry_after="0"),
        reply(fenced("lower lr", lr_05_diff)),
        # 6: a timeout, then (the client's retry) a valid diff -> keep
        slow(3.0, "too late"),
        reply(fenced("lower lr again", lr_03_diff)),
        # 7: prose without a diff, then (fed the error) a valid diff -> discard
        reply("I think a shallower model would generalise better."),
        reply(fenced("shallower", edit(lr_03, "DEPTH = 6", "DEPTH = 5")[1])),
    ]
    with ChatServer(script) as server:
        out = cli("loop", "--max-experiments", "7", "--no-early-stop", "--base-url", server.url,
                  cwd=repo, env={"OPENAI_API_KEY": SECRET}).stdout
    assert "stopped: reached 7 experiments" in out
    rec = notes(repo)
    assert [rec[n]["status"] for n in range(1, 8)] == ["keep", "discard", "invalid", "invalid",
                                                       "keep", "keep", "discard"], out
    assert rec[1]["description"] == "deeper model" and rec[1]["val_bpb"] == pytest.approx(2.1)
    assert [a["error"] for a in rec[3]["attempts"]] == [
        "the diff touches prepare.py; only train.py may change",
        "the diff touches gitresearch.toml; only train.py may change"]
    assert rec[3]["reason"].endswith(rec[3]["attempts"][1]["error"])
    assert "does not apply" in rec[4]["attempts"][0]["error"]
    assert "does not parse after the diff" in rec[4]["attempts"][1]["error"] and rec[4]["reward"]["penalty"] == 12.0 and rec[4]["reward"]["total"] == -12.0
    assert rec[4]["rejected_diff"] == rec[4]["attempts"][1]["diff"] and "LR = = 0.1" in rec[4]["rejected_diff"]
    assert rec[6]["val_bpb"] < rec[5]["val_bpb"] < rec[1]["val_bpb"]
    assert all(set(rec[n]["reward"]) == {"total", "improvement", "efficiency", "novelty", "penalty"}
               for n in range(1, 8))
    assert rec[1]["reward"]["improvement"] > 0 > rec[2]["reward"]["improvement"]
    assert rec[1]["novelty"] == 1.0  # nothing before it
    assert rec[7]["attempts"][0]["reply"].startswith("I think") and "no unified diff" in rec[7]["attempts"][0]["error"]
    # the failed reply and its exact error went back to the model
    retry_messages = server.requests[-1]["body"]["messages"]
    assert retry_messages[-2] == {"role": "assistant", "content": "I think a shallower model would generalise better."}
    assert "rejected: no unified diff found" in retry_messages[-1]["content"]
    assert len(server.requests) == len(script)
    assert all(r["headers"]["Authorization"] == f"Bearer {SECRET}" for r in server.requests)
    # every attempt is in git: a ref and a note per experiment, the chain of keeps on best
    store = Store(repo)
    assert store.note_count() == 8 and len(store.experiments()) == 8
    assert sh("git", "log", "--format=%s", "best", cwd=repo).stdout.split("\n")[:3] == \
        ["lower lr again", "lower lr", "deeper model"]
    # the key never reached train.py
    for log in (repo / ".git" / "gitresearch" / "runs").rglob("log.txt"):
        text = log.read_text()
        assert "environment:" in text and "OPENAI_API_KEY" not in text and SECRET not in text


def test_a_stale_removed_line_is_repaired_and_recorded(tmp_path):
    repo = llm_repo(tmp_path)
    deeper, deeper_diff = edit(FAKE, "DEPTH = 4", "DEPTH = 6")
    stale = edit(FAKE, "DEPTH = 4", "DEPTH = 5")[1]  # written against the baseline: best has 6
    with ChatServer([reply("Description: deeper\n" + deeper_diff),
                     reply("Description: depth 5\n" + stale)]) as server:
        cli("loop", "--max-experiments", "2", "--no-early-stop", "--base-url", server.url,
            cwd=repo, env={"OPENAI_API_KEY": SECRET})
    rec = notes(repo)
    assert rec[1]["status"] == "keep" and rec[2]["status"] in ("keep", "discard")
    assert rec[2]["repaired_lines"] == ["DEPTH = 4  # layers -> DEPTH = 6  # layers"]
    assert rec[2]["attempts"] == [] and "repaired_lines" not in rec[1]
    store = Store(repo)
    commit = next(e.commit for e in store.experiments() if e.number == 2)
    applied = store.diff_of(commit)  # the change committed is best's depth 6 -> 5
    assert "-DEPTH = 6  # layers\n+DEPTH = 5  # layers" in applied
    assert store.read_file(commit, "train.py") == deeper.replace("DEPTH = 6", "DEPTH = 5")
    assert rec[2]["diff_sha"] == diff_sha(applied) != diff_sha(stale)


def test_loop_stops_when_the_endpoint_is_down(tmp_path):
    repo = llm_repo(tmp_path, LLM_CONFIG.replace("retries = 1", "retries = 0") + "max_backend_failures = 2\n")
    with ChatServer([status(500)] * 10) as server:
        out = cli("loop", "--max-experiments", "5", "--base-url", server.url, cwd=repo).stdout
    assert "policy backend failed for 2 experiments in a row" in out
    rec = notes(repo)
    assert [rec[n]["status"] for n in (1, 2)] == ["invalid", "invalid"] and 3 not in rec
    assert rec[1]["reward"]["penalty"] == 0.0 and rec[1]["backend_only"] and "backend: " in rec[1]["reason"] and "HTTP 500" in rec[1]["reason"]


# -- the prompt ------------------------------------------------------------------------------

def count_chars(text: str) -> int:
    return len(text)


def test_prompt_history_matches_the_notes(tmp_path):
    repo = make_repo(tmp_path / "repo", config="[early_stop]\nenabled = false\n")
    (repo / "AGENDA.md").write_text("Lower val_bpb.\n")
    sh("git", "add", "AGENDA.md", cwd=repo)
    sh("git", "commit", "-qm", "agenda", cwd=repo)
    cli("init", cwd=repo)
    cli("loop", "--max-experiments", "6", "--seed", "3", cwd=repo)
    store = Store(repo)
    config = load(repo)
    state, _ = build_state(store, config, store.experiments())
    prompt = build_prompt(state, count_chars, 100_000, 1000)
    user = prompt.messages[1]["content"]
    assert "Lower val_bpb." in user and store.read_file(store.best(), "train.py").strip() in user
    section = user.split("# Recent experiments (newest first)\n", 1)[1].split("\n# Diagnostics", 1)[0]
    entries = [block for block in section.split("### #")[1:]]
    finished = [e for e in store.experiments() if e.number > 0]
    assert len(entries) == len(finished) == 6
    for block, exp in zip(entries, finished):  # newest first, entry by entry
        rec = exp.record
        head, description = block.split("\n")[:2]
        memory = f"{rec['peak_memory_mb']:.0f} MB" if rec.get("peak_memory_mb") is not None else "- MB"
        val = f"{rec['val_bpb']:.6f}" if rec.get("val_bpb") is not None else "-"
        delta = f"{rec['delta']:+.6f}" if rec.get("delta") is not None else "-"
        assert head == f"{exp.number} {rec['status']} | val_bpb {val} | delta {delta} | {rec['seconds']:.1f} s | {memory}"
        assert description == f"description: {rec['description']}"
        assert store.diff_of(exp.commit).split("\n@@")[1][:40] in block  # the diff, from git
    chain = user.split("# How the best got here (best chain, oldest first)\n", 1)[1].split("\n# ", 1)[0]
    links = [store.read_note(c) for c in reversed(store.best_chain())]
    assert len(chain.strip().splitlines()) == len(links) >= 2
    for line, link in zip(chain.strip().splitlines(), links):
        assert f"val_bpb {link['val_bpb']:.6f}" in line
        assert line.startswith("- baseline" if link["experiment"] == 0 else f"- #{link['experiment']} ")
    assert "- experiments so far: 6" in user


def test_prompt_fits_the_context_by_dropping_old_history(tmp_path):
    repo = make_repo(tmp_path / "repo", config="[early_stop]\nenabled = false\n")
    cli("init", cwd=repo)
    cli("loop", "--max-experiments", "5", "--seed", "4", cwd=repo)
    store = Store(repo)
    state, _ = build_state(store, load(repo), store.experiments())
    full = build_prompt(state, count_chars, 100_000, 1000)
    assert full.history_shown == 5 and full.history_dropped == 0
    tight = build_prompt(state, count_chars, full.tokens - 200 + 1000, 1000)
    assert 0 < tight.history_shown < 5 and tight.tokens <= full.tokens - 200
    newest = [f"### #{e.experiment} " for e in state.history]
    user = tight.messages[1]["content"]
    assert newest[0] in user and newest[-1] not in user  # the oldest went first
    assert state.files["train.py"].strip() in user  # never the code
    assert f"[{tight.history_dropped} older experiments not shown" in user
    with pytest.raises(PolicyError, match="over the"):
        build_prompt(state, count_chars, 1500, 1000)


def test_binary_nul_and_non_utf8_diffs_are_invalid_and_the_loop_goes_on(tmp_path):
    repo = llm_repo(tmp_path, LLM_CONFIG.replace("max_tries = 2", "max_tries = 1"))
    fenced = lambda text, body: f"Description: {text}\n```diff\n{body}```\n"
    binary = ("diff --git a/train.py b/train.py\nindex 1111111..2222222 100644\nGIT binary patch\n"
              "literal 4\nLcmZ?l00001\n\nliteral 0\nHcmV?d00001\n")
    script = [reply(fenced("nul", edit(FAKE, "DEPTH = 4", "DEPTH = 4\x00")[1])),
              reply(fenced("surrogate", edit(FAKE, "DEPTH = 4", "DEPTH = 4  # \udc80")[1])),
              reply(fenced("binary", binary)),
              reply(fenced("deeper", edit(FAKE, "DEPTH = 4", "DEPTH = 6")[1]))]
    with ChatServer(script) as server:
        out = cli("loop", "--max-experiments", "4", "--no-early-stop", "--base-url", server.url,
                  cwd=repo).stdout
    assert "stopped: reached 4 experiments" in out
    rec = notes(repo)
    assert [rec[n]["status"] for n in range(1, 5)] == ["invalid", "invalid", "invalid", "keep"]
    assert "NUL bytes" in rec[1]["reason"]
    assert "not valid UTF-8" in rec[2]["reason"]
    assert "binary patch" in rec[3]["reason"]


def test_prompt_shows_the_baseline_and_the_noise_floor(tmp_path):
    """The state as the loop builds it (its experiment list leaves the baseline out) still
    gives the prompt the baseline, the noise std with its sample size and the threshold."""
    repo = llm_repo(tmp_path)
    script = [reply("Description: deeper model\n" + edit(FAKE, "DEPTH = 4", "DEPTH = 6")[1])]
    with ChatServer(script) as server:
        cli("loop", "--max-experiments", "1", "--no-early-stop", "--base-url", server.url, cwd=repo)
    baseline = notes(repo)[0]
    prompt = server.requests[0]["body"]["messages"][-1]["content"]
    assert (f"baseline val_bpb {baseline['val_bpb']:.6f}, noise std {baseline['noise_std']:.6f} "
            f"(from 2 repeated runs); a change must beat the best by more than "
            f"{baseline['min_delta']:.6f} (lower is better), and is re-run against best before it "
            f"is kept") in prompt


def test_prompt_shows_the_pooled_floor_and_drift(tmp_path):
    """Once confirmations and re-runs of best add repeats, the prompt shows the pooled std,
    its sample size and upper bound, the threshold they set, and drift on best."""
    repo = llm_repo(tmp_path)
    cli("loop", "--max-experiments", "0", cwd=repo)
    store = Store(repo)
    base = store.best()
    record = store.read_note(base)
    record["noise_runs"] = [2.0, 2.02]
    record["remeasured"] = [{"value": 2.01, "after": 1}, {"value": 2.3, "after": 2, "drift": True,
                                                         "reason": "steps/s -40% from best's runs"}]
    store.write_note(base, record)
    level = floor([record], [], NoiseConfig(), ConfirmConfig())
    state, _ = build_state(store, load(repo), [])
    text = render_diagnostics(state)
    assert (f"noise std {level.noise.std:.6f} (from 2 repeated runs; upper bound {level.noise.upper:.6f}); "
            f"a change must beat the best by more than {level.min_delta:.6f}") in text
    assert "the machine changed (a re-run of best drifted: steps/s -40% from best's runs)" in text


def test_the_llm_sees_the_optimiser_and_the_note_says_whether_it_followed(tmp_path):
    from gitresearch.policies.optuna_search import OptunaSearch

    repo = llm_repo(tmp_path, LLM_CONFIG.replace("max_tries = 2\n", 'max_tries = 2\nsuggest = "tpe"\nseed = 3\n'))
    cli("loop", "--max-experiments", "0", cwd=repo)  # the baseline
    store, config = Store(repo), load(repo)
    state, _ = build_state(store, config, store.experiments())
    # the suggestion the policy will be shown: the same seed and the same notes give the same one
    params, diff, description, _, _ = OptunaSearch(config, store).suggest(state)
    tail = FAKE.splitlines(True)[-3:]
    comment = "".join(difflib.unified_diff(tail, tail + ["# a comment, no constant changed\n"],
                                           "a/train.py", "b/train.py"))
    comment = comment.replace(f"@@ -1,3 +1,4 @@", f"@@ -{len(FAKE.splitlines()) - 2},3 +{len(FAKE.splitlines()) - 2},4 @@")
    script = [reply(f"Description: take the sampler's suggestion\n```diff\n{diff}```\n"),
              reply(f"Description: my own idea\n```diff\n{comment}```\n")]
    with ChatServer(script) as server:
        cli("loop", "--max-experiments", "2", "--no-early-stop", "--base-url", server.url, cwd=repo,
            env={"OPENAI_API_KEY": SECRET})
    shown = server.requests[0]["body"]["messages"][1]["content"]
    assert "# The optimiser's view" in shown and description in shown and "Top configurations so far" in shown
    rec = notes(repo)
    first, second = rec[1]["policy_data"]["suggestion"], rec[2]["policy_data"]["suggestion"]
    assert first["description"] == description and first["followed"] == "yes" and first["matched"] == first["of"] >= 1
    assert second["followed"] == "no" and second["matched"] == 0 and rec[2]["status"] != "invalid"

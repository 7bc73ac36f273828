"""[policy] max_move_factor: the validation every proposal passes (proposal.validate) refuses
a diff that moves a positive constant further than the factor, on a real repo; through the
loop, the model gets the reason back and its next try runs. [policy] min_move_factor: it
refuses a diff whose largest move of a positive constant is smaller than that factor."""
import pytest

from chat_server import ChatServer, reply
from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.proposal import InvalidProposal, check_moves, validate
from helpers import cli, make_repo, sh
from test_llm_policy import FAKE, LLM_CONFIG, SECRET, edit, llm_repo, notes


@pytest.fixture()
def repo(tmp_path):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    return repo


@pytest.mark.parametrize("old, new, allowed", [
    ("LR = 0.1", "LR = 0.3", True),  # exactly x3
    ("LR = 0.1", "LR = 0.0334", True),  # /2.99
    ("LR = 0.1", "LR = 0.31", False),  # x3.1
    ("LR = 0.1", "LR = 0.001", False),  # /100
    ("DEPTH = 4", "DEPTH = 12", True),
    ("DEPTH = 4", "DEPTH = 1", False),  # /4: an int counts as its value
    ("DEPTH = 4", "DEPTH = -4", True),  # a sign change is no factor: left to the run
])
def test_a_move_beyond_the_factor_is_refused_with_the_constant_and_its_values(repo, old, new, allowed):
    store = Store(repo)
    base = store.best()
    diff = edit(store.read_file(base, "train.py"), old, new)[1]
    capped = load(repo, overrides={"policy.max_move_factor": 3.0})
    assert validate(store, load(repo), base, diff)[1] == diff  # off by default: any move is valid
    if allowed:
        assert validate(store, capped, base, diff)[1] == diff
        return
    name, before, after = old.split()[0], old.split()[-1], new.split()[-1]
    with pytest.raises(InvalidProposal, match=rf"moves {name} from {before} to {after} \([x/][0-9.]+\); "
                                              rf"one experiment may move a constant at most x3 or /3"):
        validate(store, capped, base, diff)
    assert sh("git", "status", "--porcelain", cwd=repo).stdout == "?? notes.md\n"  # nothing written


def test_the_cap_judges_the_search_space_only(repo):
    """Literals outside the search space (a power's exponent, a skipped name such as a seed)
    may move freely: the cap judges the values policies search, as they see them."""
    source = Store(repo).read_file(Store(repo).best(), "train.py")
    before = source.replace("STEP_S = 0.0", "TOKENS = 2**10\nSEED = 1\nSTEP_S = 0.0")
    capped = load(repo, overrides={"policy.max_move_factor": 3.0})
    check_moves(capped, "train.py", before, before.replace("2**10", "2**14").replace("SEED = 1", "SEED = 100"))
    with pytest.raises(InvalidProposal, match="moves LR from 0.1 to 0.5"):
        check_moves(capped, "train.py", before, before.replace("LR = 0.1", "LR = 0.5"))


@pytest.mark.parametrize("old, new, allowed", [
    ("LR = 0.1", "LR = 0.125", True),  # exactly x1.25
    ("LR = 0.1", "LR = 0.08", True),  # /1.25
    ("LR = 0.1", "LR = 0.11", False),  # x1.1
    ("LR = 0.1", "LR = 0.09", False),  # /1.11
    ("DEPTH = 4", "DEPTH = 5", True),
    ("DEPTH = 4", "DEPTH = -4", True),  # a sign change is no factor: left to the run
])
def test_a_move_under_the_least_factor_is_refused_with_the_constant_and_its_values(repo, old, new, allowed):
    store = Store(repo)
    base = store.best()
    diff = edit(store.read_file(base, "train.py"), old, new)[1]
    floored = load(repo, overrides={"policy.min_move_factor": 1.25})
    assert validate(store, load(repo), base, diff)[1] == diff  # off by default
    if allowed:
        assert validate(store, floored, base, diff)[1] == diff
        return
    name, before, after = old.split()[0], old.split()[-1], new.split()[-1]
    with pytest.raises(InvalidProposal, match=rf"moves {name} from {before} to {after} \([x/][0-9.]+\) and no "
                                              rf"constant further; an experiment moves at least one constant x1.25"):
        validate(store, floored, base, diff)


def test_the_least_factor_judges_the_largest_move_of_the_edit(repo):
    """A small move beside a large one passes; two small moves fail, naming the larger."""
    source = Store(repo).read_file(Store(repo).best(), "train.py")
    floored = load(repo, overrides={"policy.min_move_factor": 1.25, "policy.max_move_factor": 3.0})
    before = source.replace("STEP_S = 0.0", "WD = 0.5\nSTEP_S = 0.0")
    check_moves(floored, "train.py", before, before.replace("LR = 0.1", "LR = 0.2").replace("WD = 0.5", "WD = 0.52"))
    with pytest.raises(InvalidProposal, match=r"moves WD from 0.5 to 0.55 \(x1.1\) and no constant further"):
        check_moves(floored, "train.py", before, before.replace("LR = 0.1", "LR = 0.104").replace("WD = 0.5", "WD = 0.55"))
    with pytest.raises(InvalidProposal, match="at most x3"):  # both bounds at once
        check_moves(floored, "train.py", before, before.replace("LR = 0.1", "LR = 0.5"))


def test_the_model_gets_the_reason_back_and_its_smaller_step_runs(tmp_path):
    repo = llm_repo(tmp_path, LLM_CONFIG.replace("max_tries = 2\n", "max_tries = 2\nmax_move_factor = 3.0\n"))
    fenced = lambda text, body: f"Description: {text}\n```diff\n{body}```\n"
    script = [reply(fenced("much lower lr", edit(FAKE, "LR = 0.1", "LR = 0.001")[1])),
              reply(fenced("lower lr", edit(FAKE, "LR = 0.1", "LR = 0.05")[1]))]
    with ChatServer(script) as server:
        cli("loop", "--max-experiments", "1", "--no-early-stop", "--base-url", server.url,
            cwd=repo, env={"OPENAI_API_KEY": SECRET})
    rec = notes(repo)[1]
    assert rec["status"] in ("keep", "discard") and rec["description"] == "lower lr"
    assert [a["error"] for a in rec["attempts"]] == [
        "the diff moves LR from 0.1 to 0.001 (/100); one experiment may move a constant at most "
        "x3 or /3 ([policy] max_move_factor): take a smaller step"]
    assert "move a constant at most x3" in server.requests[-1]["body"]["messages"][-1]["content"]
    commit = next(e.commit for e in Store(repo).experiments() if e.number == 1)
    assert "LR = 0.05" in Store(repo).read_file(commit, "train.py")

#!/usr/bin/env python
"""How a policy LM answers the loop's retry prompts: at the end state of a finished loop
(`gitresearch bench research --workdir DIR` leaves DIR/rl-seedN), sample N replies to the
compact prompt with no failed try, then with one or two fed back of the loop's commonest kinds
(a step past [policy] max_move_factor, a constant moved twice; each with the loop's own
error for it) and of a kind the imitation data always had (an empty reply), and judge each as
the loop does (read_reply, then proposal.validate). Prints JSON: case -> {prompt_tokens,
history_shown, fed_back (first lines of the fed-back messages), empty, invalid_reply,
invalid_proposal, valid}.

    python benchmarks/retry_replies.py LOOP_REPO MODEL [N]    # in the gym repo; ~1 min for N = 30
"""
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from gitresearch.config import load, parse_settings
from gitresearch.gitstore import Store
from gitresearch.history import build_state
from gitresearch.policies import InvalidReply
from gitresearch.policies.base import Attempt
from gitresearch.policies.ppo import PPOLearner
from gitresearch.policies.prompt import prompt_for, read_reply, shown_sites
from gitresearch.proposal import InvalidProposal, validate

# the failed replies fed back, by case; each one's error is the loop's own for it (judge below)
CASES = {
    "first_try": (),
    "after_too_far": ("Moves: DEPTH +{deep}\n",),
    "after_two_too_far": ("Moves: BATCH_SIZE x9\n", "Moves: DEPTH +{deep}\n"),
    "after_twice_and_too_far": ("Moves: WIDTH x2; WIDTH /2\n", "Moves: DEPTH +{deep}\n"),
    "after_two_empty": ("", ""),
}


def judge(text: str, state, store, config) -> tuple[str, str]:
    """(outcome, the loop's error) of the reply `text` to the prompt of `state`: outcome is
    empty, invalid_reply (read_reply), invalid_proposal (proposal.validate) or valid ("")."""
    if not text.strip():
        return "empty", "the reply is empty"
    try:
        validate(store, config, state.best_commit, read_reply(text, state, store.make_diff)[1])
    except InvalidReply as err:
        return "invalid_reply", str(err)
    except InvalidProposal as err:
        return "invalid_proposal", str(err)
    return "valid", ""


def main(repo: Path, model: str, n: int) -> dict:
    settings = ["llm.max_tokens=128", "policy.max_move_factor=3", "llm.reply=moves", "llm.temperature=1.0",
                "llm.prompt=compact", f"llm.model={model}"]
    config = load(repo, parse_settings(settings))
    store = Store(repo)
    state, _ = build_state(store, config, [e for e in store.experiments() if e.number > 0])
    learner = PPOLearner(model, config.rl, config.llm, Path(tempfile.mkdtemp()))
    depth = next(site.value for site in shown_sites(state)["train.py"] if site.name == "DEPTH")
    out = {}
    for case, replies in CASES.items():
        asked = state
        for reply in replies:
            reply = reply.format(deep=3 * depth + 1)  # past x3 from any DEPTH
            outcome, error = judge(reply, asked, store, config)
            assert outcome != "valid", reply
            asked = asked.retry(Attempt(reply, "", error))
        prompt = prompt_for(asked, learner.count_tokens, learner.context_tokens, learner.reply_tokens)
        counts = Counter(empty=0, invalid_reply=0, invalid_proposal=0, valid=0)
        for seed in range(n):
            text, episode = learner.generate(prompt.messages, seed=seed)
            counts[judge(text, asked, store, config)[0]] += 1
        out[case] = {"prompt_tokens": len(episode.prompt_ids), "history_shown": prompt.history_shown,
                     "fed_back": [m["content"].split("\n")[0] for m in prompt.messages[1:]], **counts}
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 30), indent=1))

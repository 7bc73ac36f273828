"""Any coding-agent CLI as the proposer (docs/policies.md): the harness makes a scratch git repo
of best, writes the prompt there (and gives it on stdin), runs the agent's command in it with
a timeout, and takes `git diff` of what it changed as the proposal.

    gitresearch loop --policy agent --command 'claude -p --permission-mode acceptEdits'
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

from . import InvalidReply, PolicyError, Proposal, State
from .prompt import SYSTEM_PROMPT, build_prompt

PROMPT_FILE = "GITRESEARCH_PROMPT.md"  # written into the scratch repo, left out of the diff
DESCRIPTION_FILE = "GITRESEARCH_DESCRIPTION"  # the agent may write its one-line description here
TRANSCRIPT_CHARS = 4000  # of the agent's output, kept in the note
CHARS_PER_TOKEN = 3  # the prompt's size is estimated (no tokenizer for an arbitrary agent)
AGENT_TASK = (
    "You are run as the proposer of one experiment. Edit the files of this directory (only the "
    "editable ones) to make one change you expect to lower the metric, then stop. Do not run "
    "training: the harness runs it. Write a one-line description of your change to "
    f"{DESCRIPTION_FILE}, or make it the last line you print.")


def render(messages: list[dict]) -> str:
    return "\n\n".join(m["content"] for m in messages)


class AgentPolicy:
    name = "agent"

    def __init__(self, config, store, command: str | None = None):
        self.config, self.store = config, store
        self.command = command if command is not None else config.policy.agent_command
        if not self.command.strip():
            raise PolicyError("the agent policy needs a command: --command '...' or [policy] agent_command")
        self.timeout = config.policy.agent_timeout_s

    def prompt(self, state: State) -> str:
        tokens = max(self.config.llm.context_tokens, 8192)
        prompt = build_prompt(state, lambda text: len(text) // CHARS_PER_TOKEN, tokens, 0,
                              SYSTEM_PROMPT + "\n\n" + AGENT_TASK)
        return render(prompt.messages)

    def propose(self, state: State) -> Proposal:
        text = self.prompt(state)
        with self.store.scratch_repo(state.best_commit) as scratch:
            (scratch / PROMPT_FILE).write_text(text)
            started = time.monotonic()
            # the user's own environment (the agent needs its keys; it is not train.py), in a
            # session of its own so a timeout kills everything it started
            proc = subprocess.Popen(self.command, shell=True, cwd=scratch, text=True, env=dict(os.environ),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            try:
                stdout, stderr = proc.communicate(input=text, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
                out = stdout + stderr
                data = {"command": self.command, "seconds": round(time.monotonic() - started, 1),
                        "transcript_tail": out[-TRANSCRIPT_CHARS:]}
                raise InvalidReply(f"the agent ran past its {self.timeout:g} s timeout", out, data) from None
            transcript = stdout + stderr
            data = {"command": self.command, "exit_code": proc.returncode,
                    "seconds": round(time.monotonic() - started, 1),
                    "transcript_tail": transcript[-TRANSCRIPT_CHARS:]}
            if proc.returncode != 0:
                raise InvalidReply(f"the agent exited {proc.returncode}", transcript, data)
            description_file = scratch / DESCRIPTION_FILE
            description = description_file.read_text().strip() if description_file.is_file() else ""
            description = description or next(
                (line.strip() for line in reversed(stdout.splitlines()) if line.strip()), "")
            diff = self.store.scratch_diff(scratch, exclude=(PROMPT_FILE, DESCRIPTION_FILE))
        if not diff.strip():
            raise InvalidReply("the agent changed no file", transcript, data)
        return Proposal(diff, description.splitlines()[0][:200] if description else "agent edit",
                        data, reply=transcript[-TRANSCRIPT_CHARS:])

    def observe(self, record: dict) -> None:
        """The agent sees the results in its next prompt's history."""

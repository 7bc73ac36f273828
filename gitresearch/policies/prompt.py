"""The prompt builder shared by the LLM and RL policies: agenda, the current best code, the
history window read from git, the best chain, diagnostics, and the failed tries of this
proposal with their exact errors. It fits a token budget by dropping the oldest history
first; the code is never cut (a prompt without room for it is an error).

`[llm] prompt = "compact"` (build_compact_prompt) is the prompt a small model can read: no
system prompt or agenda, only the lines around each live constant of the editable files, one
line per past experiment, and the task; the imitation data (imitation.py) is written in it."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Collection

from ..resources import resource
from ..workers import visible_gpus
from . import PolicyError, State
from .constants import Site, find_sites
from .moves import MOVES_PREFIX, best_steps, steps_of
from .reply import parse_reply

SYSTEM_PROMPT = (resource("policy") / "system_prompt.md").read_text().rstrip("\n")  # policy/system_prompt.md

REPLY_CHARS_FED_BACK = 4000  # of a failed reply, repeated to the model with its error
AGENDA_TRUNCATED = "\n[... agenda truncated to fit the context]"
CONTEXT_LINES = 3  # around each constant in the compact view: the context a unified diff needs
COMPACT_TASK = ("Propose the next experiment: one change to the current best. Reply with the "
                "Description line and one ```diff block.")
# [llm] reply = "moves" (moves.py): the harness writes the literals of the steps
MOVES_TASK = ("Propose the next experiment: one change to the current best. Reply with one line: "
              "Moves: NAME xF or NAME /F (a factor), NAME +K or NAME -K, NAME = V; steps separated by ;. "
              "The step again repeats the steps of the change that made the current best.")
RETRY_ASK = {"diff": "Reply again: Description line, then one ```diff block.",
             "moves": "Reply again: one Moves line."}


MARGIN = 16  # tokens a prompt leaves free beside the reply budget (the chat template's headers)

def fence(text: str, lang: str = "") -> str:
    """A fenced block whose fence is longer than any backtick run inside (CommonMark)."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _num(value, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def render_entry(entry) -> str:
    """One history entry; its first line is a fixed format (tests parse it)."""
    memory = f"{entry.peak_memory_mb:.0f} MB" if isinstance(entry.peak_memory_mb, (int, float)) else "- MB"
    lines = [f"### #{entry.experiment} {entry.status} | val_bpb {_num(entry.val_bpb, '.6f')} | "
             f"delta {_num(entry.delta, '+.6f')} | {_num(entry.seconds, '.1f')} s | {memory}",
             f"description: {entry.description}"]
    if entry.comment:
        lines.append(f"self-evaluation: {entry.comment}")
    if entry.confirmation and entry.status != "discard":  # a discard's reason holds it
        lines.append(f"confirmation: {entry.confirmation}")
    if entry.reason:
        lines.append(f"reason: {entry.reason[:600]}")
    lines.append(fence(entry.diff, "diff") if entry.diff.strip() else "(no diff)")
    return "\n".join(lines)


def render_best_chain(chain: list[dict], metric: str = "val_bpb") -> str:
    lines = []
    for link in chain:
        gain = f" ({link['delta']:+.6f})" if isinstance(link.get("delta"), float) else ""
        number = link.get("experiment")
        label = "baseline" if number == 0 else f"#{number}"
        lines.append(f"- {label} {metric} {_num(link.get('val_bpb'), '.6f')}{gain}: {link['description']}")
    return "\n".join(lines) or "(no experiment kept yet)"


def render_diagnostics(state: State) -> str:
    d, run = state.diagnostics, state.config.run
    name = state.config.metric.name
    statuses = ", ".join(f"{k} {v}" for k, v in d.get("by_status", {}).items()) or "none yet"
    lines = [f"- experiments so far: {d.get('experiments', 0)} ({statuses})",
             f"- experiments since the last kept one: {d.get('since_last_keep', 0)}",
             f"- baseline {name} {_num(d.get('baseline_val_bpb'), '.6f')}, noise std "
             f"{_num(d.get('noise_std'), '.6f')} (from {d.get('noise_n', 0)} repeated runs"
             + (f"; upper bound {_num(d.get('noise_upper'), '.6f')}" if d.get("noise_upper") else "")
             + f"); a change must beat the best by more than {_num(d.get('min_delta'), '.6f')} "
             f"(lower is better), and is re-run against best before it is kept",
             f"- training budget: {run.budget_s:g} s per run; hopeless runs are stopped early",
             f"- editable files: {', '.join(state.config.files.editable)}; everything else is frozen"]
    if d.get("drift"):
        lines.append(f"- the machine changed (a re-run of best drifted: {d['drift']}); "
                     "gains are judged against fresh runs of best")
    lines += [f"- recent failure: {line}" for line in d.get("recent_failures", [])]
    if d.get("crashed_constants"):
        avoided = "; ".join(f"{name} ({', '.join(f'#{n}' for n in numbers)})"
                            for name, numbers in d["crashed_constants"].items())
        lines.append(f"- changes to these constants crashed repeatedly since they last ran: avoid them: {avoided}")
    return "\n".join(lines)


def render_code(files: dict[str, str]) -> str:
    return "\n\n".join(f"## {path}\n{fence(source, 'python' if path.endswith('.py') else '')}"
                       for path, source in sorted(files.items()))


@dataclass(frozen=True)
class Prompt:
    messages: list[dict]  # chat messages: system, user, then assistant/user per failed try
    tokens: int  # prompt tokens as the budget counted them
    history_shown: int  # history entries kept
    history_dropped: int  # oldest entries dropped to fit


def build_prompt(state: State, count_tokens: Callable[[str], int], context_tokens: int,
                 reply_tokens: int, system: str = SYSTEM_PROMPT) -> Prompt:
    """The chat messages for `state`, within context_tokens - reply_tokens."""
    budget = context_tokens - reply_tokens
    head = [f"# Research agenda\n{state.agenda.strip() or '(none given)'}",
            f"# The current best ({state.best_commit[:12]})\n{render_code(state.files)}",
            f"# How the best got here (best chain, oldest first)\n{render_best_chain(state.best_chain, state.config.metric.name)}"]
    tail = [f"# Diagnostics\n{render_diagnostics(state)}"] + (
        [f"# The optimiser's view (follow it, change it or override it)\n{state.optimiser}"]
        if state.optimiser else []) + [
            "# Your task\nPropose the next experiment: one change to the current best, different "
            "from everything in the history. Reply with the Description line and one ```diff block."]
    retries = []
    for attempt in state.attempts[-2:]:  # the last two failed tries, each with its exact error
        reply = attempt.reply if len(attempt.reply) <= REPLY_CHARS_FED_BACK else \
            attempt.reply[:REPLY_CHARS_FED_BACK] + "\n[... reply truncated]"
        retries += [{"role": "assistant", "content": reply or attempt.diff or "(empty reply)"},
                    {"role": "user", "content": f"That proposal was rejected: {attempt.error}\n"
                     "Fix it and reply again in the required form (Description line, then one "
                     "```diff block against the current best shown above)."}]
    entries = [render_entry(e) for e in state.history]
    fixed = count_tokens(system) + count_tokens("\n\n".join(head + tail)) + \
        sum(count_tokens(m["content"]) for m in retries) + MARGIN
    if fixed > budget:  # the agenda gives way before the code; the code never does
        without_agenda = fixed - count_tokens(head[0])
        room = budget - without_agenda - count_tokens(AGENDA_TRUNCATED) - MARGIN
        if room <= 0:
            raise PolicyError(f"the prompt without history needs {fixed} tokens (code: "
                              f"{count_tokens(head[1])}), over the {budget} the context leaves "
                              f"([llm] context_tokens {context_tokens} - max_tokens {reply_tokens})")
        agenda = head[0]
        while count_tokens(agenda) > room:
            agenda = agenda[:int(len(agenda) * 0.9)]
        head[0] = agenda + AGENDA_TRUNCATED
        fixed = without_agenda + count_tokens(head[0])
    costs = [count_tokens(text) + 2 for text in entries]
    shown, used = 0, fixed + count_tokens("# Recent experiments\n")
    for cost in costs:  # newest first: the oldest are the ones left out
        if used + cost > budget:
            break
        used, shown = used + cost, shown + 1
    history = "# Recent experiments (newest first)\n" + ("\n\n".join(entries[:shown]) or "(none yet)")
    if shown < len(entries):
        history += f"\n\n[{len(entries) - shown} older experiments not shown: no room in the context]"
    user = "\n\n".join(head + [history] + tail)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}] + retries
    return Prompt(messages, used, shown, len(entries) - shown)




def compact_view(source: str, sites: list[Site], context: int = CONTEXT_LINES, hidden: Collection[int] = ()) -> str:
    """The file's lines within `context` of a live constant, in runs headed by their line
    numbers ("# lines 12-30"); the lines between runs are left out, and so are the `hidden`
    ones (1-based: the lines of constants the policy may not move, hidden_lines)."""
    lines = source.splitlines()
    keep = sorted({i for s in sites for i in range(s.line - 1 - context, s.line + context)
                   if 0 <= i < len(lines) and i + 1 not in hidden})
    runs: list[list[int]] = []
    for i in keep:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return "\n".join(f"# lines {run[0] + 1}-{run[-1] + 1}\n" + "\n".join(lines[i] for i in run)
                     for run in runs)


def history_line(number, status: str, value, delta, description: str, steps: str | None = None) -> str:
    """One past experiment in the compact prompt; in the moves form with its steps
    (moves.steps_of) after a `|`, in the words a Moves reply uses."""
    line = f"#{number} {status} {_num(value, '.6f')} ({_num(delta, '+.6f')}): {description}"
    return f"{line} | {MOVES_PREFIX} {steps}" if steps else line


def compact_prompt(files: dict[str, str], sites: dict[str, list[Site]], history: list[str] = (),
                   metric: str = "val_bpb", reply: str = "diff", hidden: dict[str, set[int]] | None = None) -> str:
    """The user message of the compact prompt: each editable file's constants with their
    context (less the `hidden` lines: path -> line numbers), the given history lines (newest
    first), then the task."""
    hidden = hidden or {}
    views = [f"## {path}\n{fence(compact_view(source, sites[path], hidden=hidden.get(path, ())), 'python')}"
             for path, source in sorted(files.items()) if sites.get(path)]
    past = "\n".join(history) or "(none yet)"
    return ("# The current best: its constants\n" + "\n\n".join(views)
            + f"\n\n# Past experiments ({metric}, lower is better; newest first)\n{past}"
            + f"\n\n# Your task\n{MOVES_TASK if reply == 'moves' else COMPACT_TASK}")


def compact_retry(reply: str, error: str, form: str = "diff") -> list[dict]:
    """A failed try as the compact prompt feeds it back: the reply, then its error (the
    imitation data shows the model exactly these messages)."""
    return [{"role": "assistant", "content": (reply or "(empty reply)")[:REPLY_CHARS_FED_BACK]},
            {"role": "user", "content": f"Rejected: {error[:600]}\n{RETRY_ASK[form]}"}]


def hidden_lines(all_sites: list[Site], shown: list[Site]) -> set[int]:
    """The lines (1-based) of constants left out of `shown` with no shown constant on them: the
    compact view leaves them out, so that a constant the policy may not move is not on view
    beside those it may (a small LM named them, to be told they are not shown: docs/gym.md)."""
    return {s.line for s in all_sites} - {s.line for s in shown}


def shown_sites(state: State) -> dict[str, list[Site]]:
    """path -> the live constants the compact prompt shows (and a Moves line may name): those
    of this machine's runs (CUDA or not), less the skipped ones and those to blame for repeated
    crashes."""
    return _sites(state)[0]


def _sites(state: State) -> tuple[dict[str, list[Site]], dict[str, set[int]]]:
    """shown_sites, and path -> the lines of the constants to blame for repeated crashes that
    the view leaves out (hidden_lines)."""
    config = state.config
    cuda = bool(visible_gpus())  # the runner gives each run a GPU when this machine has one
    avoided = set(state.diagnostics.get("crashed_constants") or {})  # crashed repeatedly: not offered
    found = {path: find_sites(source, config.policy.skip_constants, cuda=cuda, metric=config.metric.name)
             for path, source in state.files.items()}
    shown = {path: [s for s in sites if s.name.split("[")[0] not in avoided] for path, sites in found.items()}
    return shown, {path: hidden_lines(found[path], shown[path]) for path in found}


def read_reply(text: str, state: State, make_diff: Callable[..., str]) -> tuple[str, str]:
    """(description, diff) of a reply to the prompt for `state` (reply.parse_reply): a Moves
    line may name the constants the prompt shows, and its `again` repeats the steps that made
    the current best (moves.best_steps)."""
    sites = shown_sites(state)
    return parse_reply(text, state.files, make_diff, sites, best_steps(state.best_chain, sites))


def give_way(history: list[str], retries: list[dict],
             fits: Callable[[list[str], list[dict]], bool]) -> tuple[list[str], list[dict]] | None:
    """The newest history lines and the fed-back tries that fit: the history goes first, oldest
    first, a quarter of the lines shown at a time; then the tries, oldest first (a small
    model's window may not hold one: the loop asks again without it rather than stop); None
    where the constants' view alone does not fit (it is never cut)."""
    shown = len(history)
    while not fits(history[:shown], retries):
        if shown > 0:
            shown = max(0, shown - max(1, shown // 4))
        elif retries:
            retries = retries[2:]
        else:
            return None
    return history[:shown], retries


def build_compact_prompt(state: State, count_tokens: Callable[[str], int], context_tokens: int,
                         reply_tokens: int) -> Prompt:
    """The compact prompt for `state`, within context_tokens - reply_tokens: history lines
    are dropped oldest first, then the fed-back tries (give_way); the constants' view is never cut."""
    config, form = state.config, state.config.llm.reply
    sites, hidden = _sites(state)
    lines = [history_line(e.experiment, e.status, e.val_bpb, e.delta, e.description,
                          steps_of(e.description, sites) if form == "moves" else None) for e in state.history]
    retries = [m for attempt in state.attempts[-2:]
               for m in compact_retry(attempt.reply or attempt.diff, attempt.error, form)]
    user_of = lambda shown: compact_prompt(state.files, sites, shown, config.metric.name, form, hidden)  # noqa: E731
    budget = lambda tries: context_tokens - reply_tokens - MARGIN - sum(count_tokens(m["content"]) for m in tries)  # noqa: E731
    fitted = give_way(lines, retries, lambda shown, tries: count_tokens(user_of(shown)) <= budget(tries))
    if fitted is None:
        raise PolicyError(f"the compact prompt needs {count_tokens(user_of([]))} tokens, over the {budget([])} "
                          f"the context leaves ([llm] context_tokens {context_tokens} - max_tokens {reply_tokens})")
    shown, retries = fitted
    user = user_of(shown)
    messages = [{"role": "user", "content": user}] + retries
    return Prompt(messages, count_tokens(user), len(shown), len(lines) - len(shown))


def prompt_for(state: State, count_tokens: Callable[[str], int], context_tokens: int,
               reply_tokens: int, system: str = SYSTEM_PROMPT) -> Prompt:
    """The prompt `[llm] prompt` asks for: full (build_prompt) or compact."""
    if state.config.llm.prompt == "compact":
        return build_compact_prompt(state, count_tokens, context_tokens, reply_tokens)
    return build_prompt(state, count_tokens, context_tokens, reply_tokens, system)

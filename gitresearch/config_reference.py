"""The gitresearch.toml that `init` writes: every key of config.py with its default and its
comment there, most of them commented out. Generated from the dataclasses, so it never
drifts from the defaults (tests load it uncommented and compare)."""
from __future__ import annotations

import inspect
import json
import re
from dataclasses import MISSING, fields

from . import config as config_module
from .config import Config

# keys written live (uncommented): what a new repo must look at first
ACTIVE = {("run", "command"), ("run", "budget_s"), ("run", "grace_s"), ("files", "editable"),
          ("files", "frozen"), ("metric", "name")}
FIELD = re.compile(r"^    (\w+): [^=]+=.*?(?:  # (.*))?$")
SEARCH_EXAMPLE = """\
# [search]  # the optuna policy's space where the defaults (x/÷10 around each value) do not fit
# WIDTH = {low = 64, high = 384, step = 64}
# HEAD_DIM = {low = 32, high = 64, step = 32}
"""


def comments() -> dict[str, dict[str, str]]:
    """class name -> field -> its comment in config.py (the line's own, else the lines above)."""
    found: dict[str, dict[str, str]] = {}
    current, above = None, []
    for line in inspect.getsource(config_module).splitlines():
        if line.startswith("class "):
            current, above = line.split()[1].split("(")[0].rstrip(":"), []
            found[current] = {}
        elif current and line.strip().startswith("#"):
            above.append(line.strip().lstrip("# "))
        elif current and (match := FIELD.match(line)):
            found[current][match.group(1)] = match.group(2) or " ".join(above)
            above = []
        else:
            above = []
    return found


def toml_value(value) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return None  # None: unset, no TOML spelling


def reference_toml(values: dict[tuple[str, str], object] | None = None, header: str = "") -> str:
    """The full reference; `values` overrides ((section, key) -> value) are written live."""
    values = values or {}
    notes = comments()
    out = [header or "# gitresearch settings: every key with its default; uncomment to change one.\n"
           "# Command-line flags override this file. Reference: gitresearch's docs/adopting.md", "schema = 1"]
    for section in fields(Config):
        if section.name in ("schema", "search"):
            continue
        cls = section.default_factory
        defaults = cls()
        out.append(f"\n[{section.name}]")
        for f in fields(cls):
            default = getattr(defaults, f.name) if f.default is not MISSING or f.default_factory is not MISSING else None
            value = values.get((section.name, f.name), default)
            comment = notes.get(cls.__name__, {}).get(f.name, "")
            spelled = toml_value(value)
            live = (section.name, f.name) in ACTIVE or (section.name, f.name) in values
            if spelled is None:
                out.append(f"# {f.name}: unset by default ({comment})")
            else:
                line = f"{f.name} = {spelled}" + (f"  # {comment}" if comment else "")
                out.append(line if live else f"# {line}")
    return "\n".join(out) + "\n\n" + SEARCH_EXAMPLE

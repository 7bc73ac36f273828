"""The search space a search policy may edit: the numeric and boolean literals of a file's
module-level UPPER_CASE constants that can change the run on this machine (docs/policies.md).

Two kinds of literal are left out:
- a dead branch: `X if COND else Y`, or a module-level `if COND:` block, where COND is known
  here. What is known is the device the runner gives the run (CUDA or not, as
  `torch.cuda.is_available()` will answer in it), names assigned from it, literals, and
  `not`/`and`/`or`/`==`/`!=`/`in` over those; any other condition keeps both branches.
- bookkeeping: a constant whose every read only reaches output (print, logging, an
  f-string), directly or through names assigned from it that do, where that output does not
  name the metric (a line that reports val_bpb is the result, not a display); and the names
  of DEFAULT_SKIP (seeds, logging cadence, hardware peak figures), with [policy]
  skip_constants on top (names or globs).
- the base of a power: in `2**19` only the exponent is a site (`kind` "exponent").

Shapes: `relations()` finds the constants that must divide others (`A % B`, `A // B`,
`round(A / B)`, also through function parameters that default to them), and a shape-like int
(a name with DIM, WIDTH, EMBD, HIDDEN, CHANNEL; 8 or more) carries `align`, the power of two
(up to 32) it is a multiple of: policies keep both when they mutate.
"""
from __future__ import annotations

import ast
import fnmatch
import math
import re
import statistics
from dataclasses import dataclass

UNKNOWN = object()  # a condition this module cannot evaluate
OUTPUT_CALLS = {"print", "debug", "info", "warning", "error", "log", "write", "set_postfix"}
# never research: seeds change the sample, not the method; logging cadence and hardware peak
# figures (an MFU denominator) change what is printed. Globs, matched on the constant's name.
DEFAULT_SKIP = ("SEED", "*_SEED", "SEED_*", "*PEAK_FLOPS*", "LOG_EVERY*", "*_LOG_EVERY*",
                "PRINT_EVERY*", "LOG_INTERVAL*", "VERBOSE*")
SHAPE_NAME = re.compile(r"DIM|WIDTH|EMBD|EMBED|HIDDEN|CHANNEL")
MAX_ALIGN = 32  # a shape-like int keeps its power-of-two factor up to this


def skipped(name: str, skip: tuple[str, ...] = ()) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in DEFAULT_SKIP + tuple(skip))


def alignment(name: str, value) -> int:
    """The power of two a shape-like int must stay a multiple of (1: no constraint)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 8 or not SHAPE_NAME.search(name):
        return 1
    return min(value & -value, MAX_ALIGN)


@dataclass(frozen=True)
class Site:
    """One literal number or bool inside a module-level assignment."""
    name: str  # the assigned name, plus an index when the value holds several literals
    line: int  # 1-based
    col: int  # UTF-8 byte offsets in the line
    end_col: int
    value: int | float | bool
    kind: str = "value"  # value | exponent (of a power: mutated by steps, never its base)
    align: int = 1  # a shape-like int stays a multiple of this


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def evaluate(node: ast.AST, known: dict, cuda: bool):
    """The value of a condition from what is known on this machine, or UNKNOWN."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return known.get(node.id, UNKNOWN)
    if isinstance(node, ast.Call) and not node.args and _dotted(node.func).endswith("cuda.is_available"):
        return cuda
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value = evaluate(node.operand, known, cuda)
        return UNKNOWN if value is UNKNOWN else not value
    if isinstance(node, ast.BoolOp):
        values = [evaluate(v, known, cuda) for v in node.values]
        if UNKNOWN in values:
            return UNKNOWN
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.IfExp):
        test = evaluate(node.test, known, cuda)
        return UNKNOWN if test is UNKNOWN else evaluate(node.body if test else node.orelse, known, cuda)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right = evaluate(node.left, known, cuda), evaluate(node.comparators[0], known, cuda)
        if UNKNOWN in (left, right) or isinstance(right, ast.AST):
            return UNKNOWN
        op = node.ops[0]
        try:
            if isinstance(op, ast.Eq):
                return left == right
            if isinstance(op, ast.NotEq):
                return left != right
            if isinstance(op, (ast.In, ast.NotIn)):
                return (left in right) == isinstance(op, ast.In)
        except TypeError:
            return UNKNOWN
    if isinstance(node, (ast.Tuple, ast.List)):
        values = [evaluate(v, known, cuda) for v in node.elts]
        return UNKNOWN if UNKNOWN in values else tuple(values)
    return UNKNOWN


def _live_branches(node, known: dict, cuda: bool) -> list:
    """The branches of an `if` (statement or expression) this machine can take: the one its
    condition picks when known here, both when not."""
    test = evaluate(node.test, known, cuda)
    return [node.body, node.orelse] if test is UNKNOWN else [node.body if test else node.orelse]


def _live_literals(node: ast.AST, known: dict, cuda: bool, kind: str = "value"):
    """(literal, kind) for the number and bool literals of an expression, dead branches and
    conditions left out; of a power with a literal base, the exponent alone."""
    if isinstance(node, ast.IfExp):
        for branch in _live_branches(node, known, cuda):
            yield from _live_literals(branch, known, cuda, kind)
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        yield node, kind
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.left, ast.Constant):
        yield from _live_literals(node.right, known, cuda, "exponent")  # 2**10 -> 1**10 always fails
        return
    for child in ast.iter_child_nodes(node):
        yield from _live_literals(child, known, cuda, kind)


def _live_statements(body, known: dict, cuda: bool):
    """Module-level statements on the path this machine takes, `known` updated as it goes."""
    for node in body:
        if isinstance(node, ast.If):
            for branch in _live_branches(node, known, cuda):
                yield from _live_statements(branch, known, cuda)
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = evaluate(node.value, known, cuda)
            for target in targets:
                if isinstance(target, ast.Name):
                    if value is UNKNOWN:
                        known.pop(target.id, None)
                    else:
                        known[target.id] = value
        yield node


def _names_the_metric(node: ast.AST, metric: str) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and metric in n.value
               for n in ast.walk(node))


def _reads(scope: ast.AST, index: dict) -> dict[str, list[ast.Name]]:
    """The reads (loads) of each name in `scope`, walked once per scope: a walk per name
    made find_sites quadratic in the script's size (0.2 s a call on the bundled target)."""
    if scope not in index:
        index[scope] = {}
        for n in ast.walk(scope):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                index[scope].setdefault(n.id, []).append(n)
    return index[scope]


def _reaches_only_output(name: str, scope: ast.AST, parents: dict, metric: str, index: dict,
                         depth: int = 0) -> bool:
    """Whether every read of `name` in `scope` ends in output (a print or log call, an
    f-string) that does not report the metric, directly or through local names assigned
    from it that do."""
    for read in _reads(scope, index).get(name, []):
        node, found = read, False
        while node in parents and not found:
            node = parents[node]
            if isinstance(node, ast.JoinedStr) or (
                    isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] in OUTPUT_CALLS):
                if _names_the_metric(node, metric):
                    return False  # the result the harness reads, not a display
                found = True
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if depth > 3 or not names or len(names) != len(targets):
                    return False
                home = next((p for p in _ancestors(node, parents)
                             if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))), scope)
                found = all(_reaches_only_output(n, home, parents, metric, index, depth + 1)
                            for n in names if n != name)
                if not found:
                    return False
            elif isinstance(node, ast.stmt):
                return False
        if not found:
            return False
    return True


def _ancestors(node, parents):
    while node in parents:
        node = parents[node]
        yield node


def bookkeeping(tree: ast.Module, names, metric: str = "val_bpb") -> set[str]:
    """The constants among `names` that cannot change the run: read, and every read only on
    the way to output that does not report `metric`. (One never read here is kept: another
    module may import it.)"""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    index: dict = {}
    read = _reads(tree, index)
    return {name for name in names if name in read and _reaches_only_output(name, tree, parents, metric, index)}


def find_sites(source: str, skip: tuple[str, ...] = (), cuda: bool = False,
               metric: str = "val_bpb") -> list[Site]:
    """The live, non-bookkeeping literals of the module-level constants, on a machine that
    has (cuda=True) or lacks a CUDA device; `metric`: the name of the result the script
    reports (output that names it is the result, not bookkeeping)."""
    tree = ast.parse(source)
    found, known = [], {}
    for node in _live_statements(tree.body, known, cuda):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if names and names[0].isupper() and not skipped(names[0], skip):  # constants: UPPER_CASE
            literals = [(n, kind) for n, kind in _live_literals(node.value, known, cuda)
                        if n.lineno == n.end_lineno]
            found.append((names[0], sorted(literals, key=lambda item: (item[0].lineno, item[0].col_offset))))
    idle = bookkeeping(tree, {name for name, _ in found}, metric)
    sites = []
    for name, literals in found:
        if name in idle:
            continue
        for i, (lit, kind) in enumerate(literals):
            label = name if len(literals) == 1 else f"{name}[{i}]"
            align = alignment(name, lit.value) if kind == "value" and len(literals) == 1 else 1
            sites.append(Site(label, lit.lineno, lit.col_offset, lit.end_col_offset, lit.value, kind, align))
    return sites


def relations(source: str) -> set[tuple[str, str]]:
    """(multiple, divisor) pairs of constants the code divides: `A % B`, `A // B` and
    `round(A / B)` / `int(A / B)`, where each side is a constant's name, or a function
    parameter whose default is one."""
    tree = ast.parse(source)
    constants = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(t, ast.Name) and t.id.isupper()}
    pairs = set()

    def visit(node, aliases):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            defaults = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            defaults += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            aliases = dict(aliases)
            for arg, default in defaults:
                if isinstance(default, ast.Name) and default.id in constants:
                    aliases[arg.arg] = default.id
        name = lambda n: (n.id if n.id in constants else aliases.get(n.id)) if isinstance(n, ast.Name) else None  # noqa: E731
        divided = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.FloorDiv)):
            divided = node
        elif (isinstance(node, ast.Call) and _dotted(node.func) in ("round", "int") and len(node.args) == 1
              and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Div)):
            divided = node.args[0]
        if divided is not None and name(divided.left) and name(divided.right):
            pairs.add((name(divided.left), name(divided.right)))
        for child in ast.iter_child_nodes(node):
            visit(child, aliases)

    visit(tree, {})
    return {(a, b) for a, b in pairs if a != b}


def rewrite(source: str, changes: list[tuple[Site, object]]) -> str:
    """The source with each site's literal replaced by its new value, all else byte for byte."""
    lines = source.splitlines(keepends=True)
    for site, new in sorted(changes, key=lambda c: (c[0].line, c[0].col), reverse=True):
        raw = lines[site.line - 1].encode("utf-8")
        lines[site.line - 1] = (raw[:site.col] + repr(new).encode() + raw[site.end_col:]).decode("utf-8")
    return "".join(lines)


def described(changes: list[tuple[Site, object]]) -> str:
    """The changes as the notes' descriptions name them: `MATRIX_LR 0.005 -> 0.01; DEPTH 4 -> 5`."""
    return "; ".join(f"{site.name} {site.value!r} -> {new!r}" for site, new in changes)


def signed_log_moves(before: dict, after: dict) -> dict[str, float]:
    """name -> ln(new / old) of each positive number of `before` (name -> value) that `after`
    changed to another positive number: how far, and which way, an edit moved its constants
    (the random policy's moves stay within ln 3; [policy] max_move_factor bounds them)."""
    def positive(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0

    return {k: math.log(after[k] / v) for k, v in before.items()
            if positive(v) and positive(after.get(k)) and after[k] != v}


def log_moves(before: dict, after: dict) -> list[float]:
    """|ln(new / old)| of each move signed_log_moves finds."""
    return [abs(m) for m in signed_log_moves(before, after).values()]


def move_summary(moves: list[float]) -> tuple[float | None, float | None]:
    """(median |ln(new / old)|, share of moves beyond the random policy's factor 3) of
    log_moves' figures, rounded to 3 places; (None, None) for no move."""
    if not moves:
        return None, None
    beyond = sum(m > math.log(3) + 1e-9 for m in moves) / len(moves)
    return round(statistics.median(moves), 3), round(beyond, 3)

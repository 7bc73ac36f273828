"""Module-level constants of a Python source file, found and rewritten through the AST."""
import ast


def set_constant(source: str, name: str, template: str) -> str:
    """Rewrite the module-level assignment `name = value` as `name = template.format(value)`,
    keeping every other byte of the source (comments and layout included)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            lines = source.splitlines(keepends=True)
            old = ast.get_source_segment(source, node.value)
            if node.value.lineno != node.value.end_lineno:
                raise ValueError(f"{name} spans several lines; rewrite it by hand")
            index = node.value.lineno - 1
            line = lines[index]
            col, end = node.value.col_offset, node.value.end_col_offset
            # col offsets are UTF-8 byte offsets: slice the encoded line
            raw = line.encode("utf-8")
            lines[index] = (raw[:col] + template.format(old).encode("utf-8") + raw[end:]).decode("utf-8")
            return "".join(lines)
    raise KeyError(f"no module-level constant {name}")

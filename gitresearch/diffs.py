"""Diff identity: a leaf module, so that policies and the harness share it without a circle."""
import hashlib


def diff_sha(diff: str) -> str:
    """Identity of a diff's content, independent of blob ids and line numbers in its headers."""
    body = [line for line in diff.splitlines() if line[:1] in "+- " and not line.startswith(("+++", "---"))]
    return hashlib.sha256("\n".join(body).encode()).hexdigest()[:16]

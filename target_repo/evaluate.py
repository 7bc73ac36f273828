"""
The nanochat target's evaluator: the frozen code that decides a run's val_bpb.

    python evaluate.py [MODEL]   # default: $GITRESEARCH_ARTIFACTS/model.pt2 (prepare.save_model)

gitresearch runs it after training, in a fresh sandbox holding only the frozen files, the
artifact train.py saved and the data cache, and takes its number as the result. It prints an
autoresearch-style summary block, or `refused: REASON` and exits 2 when the model may not be
scored:
- the artifact is loaded without unpickling anything (torch.load is held to weights_only);
- the graph may call ATen operators only, none that reads files (aten.from_file), and may not
  mutate its buffers or inputs: it is a pure function of the tokens it is given, with no
  memory from one batch to the next;
- look-ahead: predictions at or before a position may not change when the tokens after it
  (in the same row, at every position of a randomly drawn row, or in other rows of the batch)
  change;
then val_bpb = prepare.evaluate_bpb on the fixed eval_tokens of the validation split, the same
code and tokens as an in-process evaluation.
"""
import contextlib
import operator
import os
import sys
import time
from pathlib import Path

import torch

import prepare

REFUSED = 2  # exit status: the model may not be scored
DENIED_OPS = {"from_file", "_from_file"}  # ATen operators that read the filesystem
# Logits at or before a position may move this much when later tokens change: float noise of
# an honest causal model is about 1e-4 here; a peek below it gains at most 2 x 1e-3 nats per
# token (log-softmax moves at most twice its inputs' largest change), about 0.001 bpb.
LOOKAHEAD_ATOL = 1e-3


class Refused(Exception):
    pass


@contextlib.contextmanager
def no_unpickling():
    """torch.export.load unpickles its weights with weights_only=False: force True, and refuse
    pickled custom objects outright."""
    real_load = torch.load

    def weights_only_load(*args, **kwargs):
        kwargs["weights_only"] = True
        return real_load(*args, **kwargs)

    def refuse(*args, **kwargs):
        raise Refused("the artifact holds pickled objects")

    from torch.export.pt2_archive import _package

    saved = (_package.pickle, torch._C._pickle_load_obj)
    torch.load, _package.pickle = weights_only_load, type("NoPickle", (), {"loads": staticmethod(refuse)})
    torch._C._pickle_load_obj = refuse
    try:
        yield
    finally:
        torch.load = real_load
        _package.pickle, torch._C._pickle_load_obj = saved


def load_model(path: Path):
    if not path.is_file() or path.is_symlink():
        raise Refused(f"no model artifact at {path} (train.py must call prepare.save_model(model))")
    try:
        with no_unpickling():
            exported = torch.export.load(str(path))
    except Refused:
        raise
    except Exception as err:  # a malformed or hostile archive: any failure is a refusal
        raise Refused(f"the artifact does not load as an exported program: {type(err).__name__}: {err}")
    # Functionalised, an in-place write to a buffer or an input shows in the signature.
    exported = exported.run_decompositions({})
    signature = exported.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        raise Refused("the graph mutates its buffers or inputs (state between batches)")
    for module in exported.graph_module.modules():
        for node in module.graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem:
                continue
            target = node.target
            if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
                raise Refused(f"the graph calls {target}, not an ATen operator")
            if target._opname in DENIED_OPS:
                raise Refused(f"the graph calls {target}, which reads files")
    model = exported.module()
    model.training = False  # exported in eval mode; the graph has no train mode to leave
    return model


def check_lookahead(model, val_tokens: torch.Tensor, device) -> None:
    """Refuse a model whose logits at a position depend on later tokens or on other rows.

    Within a row: a validation row drawn at random (a secret seed: the frozen code is visible
    to the policies, the draw is not) is cut at every position once, eight cuts a batch; each
    copy keeps the row up to its cut and has random tokens after it. Across rows: eight more
    batches keep one row up to a random cut and make everything else random. Every kept
    prefix's logits must equal those of the intact row within LOOKAHEAD_ATOL."""
    seq_len, vocab, batch = prepare.spec().seq_len, prepare.spec().vocab_size, prepare.EVAL_BATCH
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
    rows = len(val_tokens) // seq_len
    row_of = lambda i: val_tokens[i * seq_len: (i + 1) * seq_len]
    base = row_of(int(torch.randint(rows, (1,), generator=gen)))
    with torch.no_grad():
        reference = model(base.expand(batch, seq_len).to(device)).float()
        spread = (reference - reference[:1]).abs().max().item()
        if not spread <= LOOKAHEAD_ATOL:
            raise Refused(f"identical rows of one batch got logits {spread:.3g} apart")
        cuts = torch.randperm(seq_len - 1, generator=gen).tolist()  # every position once
        cuts += [-1] * (-len(cuts) % batch)
        for start in range(0, len(cuts), batch):
            x = torch.randint(vocab, (batch, seq_len), generator=gen)
            for r, p in enumerate(cuts[start: start + batch]):
                x[r, : p + 1] = base[: p + 1]
            out = model(x.to(device)).float()
            for r, p in enumerate(cuts[start: start + batch]):
                _compare(out[r, : p + 1], reference[0, : p + 1], p, "later tokens")
        for kept in range(batch):  # one real row, everything else random
            p = int(torch.randint(seq_len - 1, (1,), generator=gen))
            x = torch.randint(vocab, (batch, seq_len), generator=gen)
            x[kept, : p + 1] = base[: p + 1]
            out = model(x.to(device)).float()
            _compare(out[kept, : p + 1], reference[0, : p + 1], p, "other rows of the batch")


def _compare(got: torch.Tensor, want: torch.Tensor, position: int, what: str) -> None:
    gap = (got - want).abs().max().item() if position >= 0 else 0.0
    if not gap <= LOOKAHEAD_ATOL:
        raise Refused(f"look-ahead: the logits at positions <= {position} changed by {gap:.3g} "
                      f"when {what} changed")


def main() -> int:
    start = time.time()
    default = Path(os.environ.get("GITRESEARCH_ARTIFACTS", "artifacts")) / prepare.MODEL_FILE
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    try:
        model = load_model(path)
        params = list(model.parameters())
        device = params[0].device if params else torch.device("cpu")
        val_tokens, token_bytes = prepare.load_val()
        check_lookahead(model, val_tokens, device)
        val_bpb = prepare.evaluate_bpb(model, val_tokens, token_bytes, device=device,
                                       batch_size=prepare.EVAL_BATCH)
    except Refused as err:
        print(f"refused: {err}", flush=True)
        return REFUSED
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"eval_tokens:      {prepare.spec().eval_tokens}")
    print(f"eval_seconds:     {time.time() - start:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
  (in the same row or in other rows of the batch) change;
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
LOOKAHEAD_ATOL = 1e-5  # logits at or before a position may move this much at most


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
    """Pass k keeps the first p_k + 1 tokens of row k of a real batch and makes every other
    token random; row k's logits up to p_k must equal those of the real batch. So no row may
    see its own later tokens, nor anything of another row."""
    seq_len, vocab = prepare.spec().seq_len, prepare.spec().vocab_size
    x = val_tokens[: prepare.EVAL_BATCH * seq_len].view(prepare.EVAL_BATCH, seq_len).to(device)
    gen = torch.Generator().manual_seed(0)
    cuts = torch.linspace(0, seq_len - 2, prepare.EVAL_BATCH).long().tolist()
    with torch.no_grad():
        reference = model(x).float()
        for row, p in enumerate(cuts):
            perturbed = torch.randint(vocab, x.shape, generator=gen).to(device)
            perturbed[row, : p + 1] = x[row, : p + 1]
            out = model(perturbed).float()
            gap = (out[row, : p + 1] - reference[row, : p + 1]).abs().max().item()
            if not gap <= LOOKAHEAD_ATOL:
                raise Refused(f"look-ahead: the logits at positions <= {p} of row {row} changed "
                              f"by {gap:.3g} when later tokens or other rows changed")


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

"""
Frozen environment of the nanochat target: corpus, tokenizer, splits, constants, evaluation.

    python prepare.py                                   # build the default corpus cache (offline)
    python prepare.py --corpus fineweb --shards 8       # download web-text shards (GPU scale)
    python prepare.py --corpus fineweb --local-dir DIR  # web-text shards already on disk

train.py imports this file and must not change it: the harness checks its hash before and
after every run. The cache lives outside the repo, in $NANOCHAT_CACHE_DIR (default:
~/.cache/gitresearch-nanochat), split in two folders: CORPUS/train (the train split and the
token byte lengths: all the training sandbox may read) and CORPUS/val (the validation split:
only the evaluator, evaluate.py, may read it). The default corpus's cached files are checked
against SHA-256 pins in this file; a web-text cache against the manifest written when it
was built (read-only to training, like the rest of the cache).

The result of a run is not train.py's to say: train.py saves its model with save_model()
(an exported graph: torch.export), and evaluate.py, in a fresh sandbox, measures val_bpb on
it with evaluate_bpb() below, on a fixed number of validation tokens.

Corpora:
- "default": the top-level modules of the CPython 3.11.7 standard library (4.66 MB of Python
  source and docstrings, PSF License v2), shipped as data/corpus.txt.xz and pinned by SHA-256,
  with its BPE tokenizer (data/tokenizer.json). Same bytes on every machine, no network.
  Built by tools/build_corpus.py in the gitresearch repo.
- "fineweb": FineWeb-Edu parquet shards (karpathy/fineweb-edu-100b-shuffle on the Hugging
  Face hub, ODC-By licence), or local .parquet/.txt shards; the last shard is validation.
"""
import argparse
import hashlib
import json
import lzma
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# Constants train.py must not change.


@dataclass(frozen=True)
class CorpusSpec:
    vocab_size: int  # BPE vocabulary, special tokens included
    seq_len: int  # tokens per training/evaluation row
    eval_tokens: int  # fixed validation token budget of evaluate_bpb
    quick_eval_tokens: int  # held-out tail of the train split for the periodic learning-curve estimate
    tokenizer_chars: int  # characters of the train split the tokenizer is trained on


CORPORA = {
    "default": CorpusSpec(vocab_size=2048, seq_len=256, eval_tokens=65_536,
                          quick_eval_tokens=8_192, tokenizer_chars=5_000_000),
    "fineweb": CorpusSpec(vocab_size=8192, seq_len=2048, eval_tokens=10_485_760,
                          quick_eval_tokens=262_144, tokenizer_chars=200_000_000),
}
CORPUS = "default"  # which corpus this research repo uses; change it only before the baseline
DEFAULT_BUDGET_S = 300  # training seconds when GITRESEARCH_BUDGET_S is unset
EOT = "<|endoftext|>"  # document separator; zero bytes, so it never counts in bpb

HERE = Path(__file__).resolve().parent
DEFAULT_CORPUS_FILE = HERE / "data" / "corpus.txt.xz"
DEFAULT_CORPUS_SHA256 = "538336ab73a93b4c771c038e3c87f9bf69d23f08dfa49b62c0575d4d66eb15a5"
DEFAULT_TOKENIZER = HERE / "data" / "tokenizer.json"  # trained on the train split, shipped
PINNED_CACHE_SHA256 = {  # the default corpus's cache, as every machine builds it
    "train/token_bytes.npy": "63b0a7608221177a267c14908723f324572a67d3741aefda38804041c1510f28",
    "train/train.bin": "e2ec067d5e60d1e95a35c04f29c7063430de7209641981dcaa96ac749f3736ec",
    "val/val.bin": "f20542e5c7a49eddc64e1e822ab1f4dd32a693fda0862b373cdcbaa94fa4306c",
}
EVAL_BATCH = 8  # rows per forward pass of the evaluation; the exported model takes this shape
MODEL_FILE = "model.pt2"  # save_model()'s file in $GITRESEARCH_ARTIFACTS
DEFAULT_VAL_EVERY = 10  # every 10th document of the default corpus is validation
FINEWEB_URL_REPO = "karpathy/fineweb-edu-100b-shuffle"
FINEWEB_VAL_SHARD = 6542  # the last shard of that dataset, held out as validation
CACHE_FORMAT = 2  # bump when the cached layout changes (2: train/ and val/ folders)


FROZEN_MANIFEST = HERE / "frozen.sha256"  # `sha256sum -c` format: the frozen files' pinned hashes


class FrozenDataError(RuntimeError):
    """A frozen input does not match its pinned or recorded hash."""


def verify_frozen_files(manifest: Path = FROZEN_MANIFEST) -> None:
    """Check this repo's frozen files (prepare.py itself among them) against their pinned
    hashes. The harness runs the same check from outside, before and after every run."""
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        expected, name = line.split(maxsplit=1)
        path = manifest.parent / name.lstrip("*")
        if path == DEFAULT_CORPUS_FILE and not path.exists() and path.parent.is_dir():
            continue  # training's checkout leaves the corpus out: it holds the validation text
        if not path.exists():
            raise FrozenDataError(f"{path}: frozen file is missing; restore it from git")
        actual = sha256_file(path)
        if actual != expected:
            raise FrozenDataError(f"{path}: frozen file was modified (SHA-256 {actual}, "
                                  f"pinned {expected}); restore it from git")


def spec() -> CorpusSpec:
    return CORPORA[CORPUS]


def budget_seconds() -> float:
    return float(os.environ.get("GITRESEARCH_BUDGET_S", DEFAULT_BUDGET_S))


def cache_dir(corpus: str = CORPUS) -> Path:
    root = os.environ.get("NANOCHAT_CACHE_DIR") or os.path.expanduser("~/.cache/gitresearch-nanochat")
    return Path(root) / corpus


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Documents.


def default_documents() -> list[str]:
    """The pinned default corpus, one document per standard-library module."""
    try:
        raw = lzma.decompress(DEFAULT_CORPUS_FILE.read_bytes())
    except (OSError, lzma.LZMAError) as err:
        raise FrozenDataError(f"{DEFAULT_CORPUS_FILE}: cannot read the default corpus ({err})")
    actual = hashlib.sha256(raw).hexdigest()
    if actual != DEFAULT_CORPUS_SHA256:
        raise FrozenDataError(f"{DEFAULT_CORPUS_FILE}: SHA-256 {actual} does not match the "
                              f"pinned {DEFAULT_CORPUS_SHA256}; restore the file from git")
    text = raw.decode("utf-8")
    return ["# ==== " + doc for doc in text.split("# ==== ") if doc]


def split_default(docs: list[str]) -> tuple[list[str], list[str]]:
    train = [d for i, d in enumerate(docs) if i % DEFAULT_VAL_EVERY != DEFAULT_VAL_EVERY - 1]
    val = [d for i, d in enumerate(docs) if i % DEFAULT_VAL_EVERY == DEFAULT_VAL_EVERY - 1]
    return train, val


def read_shard(path: Path) -> list[str]:
    """One shard's documents: a parquet file with a `text` column, or a text file whose
    documents are separated by blank-line-delimited EOT markers or, failing that, lines."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # only the web-text corpus needs it

        return [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t]
    text = path.read_text(encoding="utf-8")
    parts = text.split(EOT) if EOT in text else text.splitlines()
    return [p.strip("\n") for p in parts if p.strip()]


def fineweb_shards(local_dir: str | None, shards: int) -> list[Path]:
    if local_dir:
        found = sorted(p for p in Path(local_dir).iterdir() if p.suffix in (".parquet", ".txt"))
        if len(found) < 2:
            sys.exit(f"{local_dir}: need at least 2 shards (.parquet or .txt); the last is validation")
        return found
    from huggingface_hub import hf_hub_download  # network only when asked for

    ids = list(range(shards)) + [FINEWEB_VAL_SHARD]
    return [Path(hf_hub_download(FINEWEB_URL_REPO, f"shard_{i:05d}.parquet", repo_type="dataset"))
            for i in ids]


# --------------------------------------------------------------------------------------------
# Tokenizer and token byte lengths.


def train_tokenizer(docs: list[str], corpus_spec: CorpusSpec):
    """Byte-level BPE (GPT-2 style pre-tokenisation), trained on the train split only."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=corpus_spec.vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)

    def limited():
        left = corpus_spec.tokenizer_chars
        for doc in docs:
            if left <= 0:
                return
            yield doc[:left]
            left -= len(doc)

    tok.train_from_iterator(limited(), trainer=trainer)
    return tok


def token_byte_lengths(tok) -> np.ndarray:
    """UTF-8 bytes each token id stands for. Byte-level BPE writes one alphabet character per
    byte, so a token's byte length is its string length; special tokens are zero bytes."""
    special = {EOT}
    lengths = np.zeros(tok.get_vocab_size(), dtype=np.int32)
    for token, idx in tok.get_vocab().items():
        lengths[idx] = 0 if token in special else len(token)
    return lengths


def encode_documents(tok, docs: list[str]) -> np.ndarray:
    eot = tok.token_to_id(EOT)
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.append(eot)
        ids.extend(enc.ids)
    return np.asarray(ids, dtype=np.uint16)


# --------------------------------------------------------------------------------------------
# Cache: built once, checked on every load.

CACHE_FILES = ("train/tokenizer.json", "train/token_bytes.npy", "train/train.bin", "val/val.bin")


def build_cache(corpus: str = CORPUS, local_dir: str | None = None, shards: int = 8) -> Path:
    corpus_spec = CORPORA[corpus]
    if corpus == "default":
        from tokenizers import Tokenizer

        train_docs, val_docs = split_default(default_documents())
        tok = Tokenizer.from_file(str(DEFAULT_TOKENIZER))
    else:
        paths = fineweb_shards(local_dir, shards)
        train_docs = [d for p in paths[:-1] for d in read_shard(p)]
        val_docs = read_shard(paths[-1])
        tok = train_tokenizer(train_docs, corpus_spec)
    lengths = token_byte_lengths(tok)
    train_ids, val_ids = encode_documents(tok, train_docs), encode_documents(tok, val_docs)
    # bpb is only honest if token bytes add up to the text's bytes: check it once, here.
    val_bytes = sum(len(d.encode("utf-8")) for d in val_docs)
    if int(lengths[val_ids].sum()) != val_bytes:
        raise FrozenDataError(f"token byte lengths sum to {int(lengths[val_ids].sum())}, "
                              f"the validation text has {val_bytes} bytes")
    if len(val_ids) < corpus_spec.eval_tokens + 1:
        raise FrozenDataError(f"validation split has {len(val_ids)} tokens, "
                              f"evaluation needs {corpus_spec.eval_tokens + 1}")
    # Built in a private folder and renamed into place, so concurrent builders never mix files.
    out = cache_dir(corpus)
    final, out = out, out.with_name(f"{out.name}.building-{os.getpid()}")
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "val").mkdir(exist_ok=True)
    tok.save(str(out / "train" / "tokenizer.json"))
    np.save(out / "train" / "token_bytes.npy", lengths)
    train_ids.tofile(out / "train" / "train.bin")
    val_ids.tofile(out / "val" / "val.bin")
    manifest = {"format": CACHE_FORMAT, "corpus": corpus,
                "files": {name: sha256_file(out / name) for name in CACHE_FILES},
                "train_tokens": int(len(train_ids)), "val_tokens": int(len(val_ids)),
                "val_bytes": val_bytes}
    # Each half carries the manifest: the training sandbox sees train/ alone.
    for half in ("train", "val"):
        (out / half / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if final.exists():  # a rebuild (--force) or a concurrent builder that finished first
        shutil.rmtree(final)
    try:
        os.rename(out, final)
    except OSError:  # another process renamed its build into place between our two steps
        shutil.rmtree(out)
    return final


def verified_cache(corpus: str = CORPUS, halves: tuple[str, ...] = ("train", "val")) -> Path:
    """The cache folder, built if missing, with the files of `halves` checked: the default
    corpus's against the pins above, a web-text corpus's against its manifest."""
    out = cache_dir(corpus)
    manifest_path = out / halves[0] / "manifest.json"
    if not manifest_path.exists() and not (out / halves[0]).exists():
        if corpus != "default":
            raise FrozenDataError(f"{out}: no {corpus} cache; run `python prepare.py --corpus {corpus}`")
        build_cache(corpus)
    try:
        manifest = json.loads(manifest_path.read_text())
        recorded = manifest["files"]
    except (OSError, ValueError, KeyError) as err:
        raise FrozenDataError(f"{manifest_path}: unreadable manifest ({err}); delete {out} to rebuild")
    if manifest.get("format") != CACHE_FORMAT:
        raise FrozenDataError(f"{manifest_path}: cache format {manifest.get('format')}, "
                              f"expected {CACHE_FORMAT}; delete {out} to rebuild")
    pinned = PINNED_CACHE_SHA256 if corpus == "default" else recorded
    for name in CACHE_FILES:
        if name.split("/")[0] not in halves or name not in pinned:
            continue
        path = out / name
        if not path.exists():
            raise FrozenDataError(f"{path}: missing from the data cache; delete {out} to rebuild")
        actual = sha256_file(path)
        if actual != pinned[name]:
            raise FrozenDataError(f"{path}: SHA-256 {actual} does not match the pinned "
                                  f"{pinned[name]}; the cached data was modified, "
                                  f"delete {out} to rebuild")
    return out


def load_tokenizer(corpus: str = CORPUS):
    from tokenizers import Tokenizer

    if corpus == "default":
        return Tokenizer.from_file(str(DEFAULT_TOKENIZER))
    return Tokenizer.from_file(str(verified_cache(corpus, ("train",)) / "train" / "tokenizer.json"))


def _tokens(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))


def load_token_bytes(corpus: str = CORPUS) -> torch.Tensor:
    return torch.from_numpy(np.load(verified_cache(corpus, ("train",)) / "train" / "token_bytes.npy")).long()


def load_train(corpus: str = CORPUS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train tokens, dev tokens, token byte lengths) for training, with the frozen files and
    the train half of the cache checked. The dev tokens are the train split's last
    quick_eval_tokens + 1 tokens, cut off from the training tokens: the learning curve's
    periodic estimate. Training never sees the validation split."""
    verify_frozen_files()
    out = verified_cache(corpus, ("train",))
    tokens = _tokens(out / "train" / "train.bin")
    cut = len(tokens) - CORPORA[corpus].quick_eval_tokens - 1
    return tokens[:cut], tokens[cut:], load_token_bytes(corpus)


def load_val(corpus: str = CORPUS) -> tuple[torch.Tensor, torch.Tensor]:
    """(validation tokens, token byte lengths): the evaluator's, never train.py's."""
    verify_frozen_files()
    out = verified_cache(corpus, ("val", "train"))
    return _tokens(out / "val" / "val.bin"), load_token_bytes(corpus)


def save_model(model, directory: str | None = None) -> Path:
    """Export `model` (idx (EVAL_BATCH, seq_len) int64 -> logits) with torch.export into
    $GITRESEARCH_ARTIFACTS (or `directory`) for evaluate.py. The graph is exported in eval
    mode from the model's parameters on their device, in their dtype."""
    directory = Path(directory or os.environ.get("GITRESEARCH_ARTIFACTS") or "artifacts")
    directory.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    example = torch.zeros(EVAL_BATCH, spec().seq_len, dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        exported = torch.export.export(model, (example,))
    if was_training:
        model.train()
    path = directory / MODEL_FILE
    torch.export.save(exported, str(path))
    return path


# --------------------------------------------------------------------------------------------
# Evaluation: the metric every experiment is judged by.


@torch.no_grad()
def evaluate_bpb(model, val_tokens: torch.Tensor, token_bytes: torch.Tensor,
                 seq_len: int | None = None, max_tokens: int | None = None,
                 batch_size: int = 8, device: str | torch.device = "cpu") -> float:
    """Validation bits per byte of `model` on the first `max_tokens` targets of `val_tokens`.

    `model(idx)` takes a (B, T) int64 tensor and returns (B, T, vocab) logits. The targets are
    cut into rows of `seq_len`; bpb = summed cross-entropy in nats / (ln 2 x summed UTF-8 bytes
    of the targets). Zero-byte targets (special tokens) count in neither sum.
    """
    seq_len = seq_len or spec().seq_len
    max_tokens = max_tokens or spec().eval_tokens
    rows = max_tokens // seq_len
    if rows < 1 or rows * seq_len + 1 > len(val_tokens):
        raise ValueError(f"cannot evaluate {max_tokens} tokens in rows of {seq_len} "
                         f"from {len(val_tokens)} validation tokens")
    was_training = model.training
    if was_training:  # (an exported graph has no train mode to leave)
        model.eval()
    token_bytes = token_bytes.to(device)
    total_nats, total_bytes = 0.0, 0
    for start in range(0, rows, batch_size):
        n = min(batch_size, rows - start)
        chunk = val_tokens[start * seq_len: (start + n) * seq_len + 1].to(device)
        x = torch.stack([chunk[i * seq_len: (i + 1) * seq_len] for i in range(n)])
        y = torch.stack([chunk[i * seq_len + 1: (i + 1) * seq_len + 1] for i in range(n)])
        logits = model(x).float()
        nats = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
        nbytes = token_bytes[y.reshape(-1)]
        counted = nbytes > 0
        total_nats += nats[counted].sum().item()
        total_bytes += int(nbytes.sum().item())
    if was_training:
        model.train()
    return total_nats / (math.log(2) * total_bytes)


# --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the nanochat target's data cache.")
    parser.add_argument("--corpus", choices=sorted(CORPORA), default=CORPUS)
    parser.add_argument("--shards", type=int, default=8, help="web-text train shards to download")
    parser.add_argument("--local-dir", help="use local .parquet/.txt shards instead of downloading")
    parser.add_argument("--force", action="store_true", help="rebuild even if the cache is valid")
    args = parser.parse_args()
    if args.force or not (cache_dir(args.corpus) / "train" / "manifest.json").exists():
        build_cache(args.corpus, args.local_dir, args.shards)
    out = verified_cache(args.corpus)
    manifest = json.loads((out / "train" / "manifest.json").read_text())
    print(f"{args.corpus} cache ok at {out}: {manifest['train_tokens']:,} train tokens, "
          f"{manifest['val_tokens']:,} val tokens")


if __name__ == "__main__":
    main()

"""The bundled nanochat target: metric, determinism, learning, GPU shape, frozen data."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import TARGET, load_target_modules
from helpers import benchmark_module

set_constant = benchmark_module("pysource").set_constant


@pytest.fixture(scope="module")
def prepare():
    return load_target_modules(TARGET)["prepare"]


class BigramModel(torch.nn.Module):
    """logits[b, t] = table[idx[b, t]]: small enough to compute by hand."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, idx):
        return self.table[idx]


def test_evaluate_bpb_matches_hand_computation(prepare):
    vocab = 5
    table = torch.tensor([[0.1 * (i + 1) * (j - 2) for j in range(vocab)] for i in range(vocab)])
    token_bytes = torch.tensor([0, 1, 2, 3, 1])  # token 0 is special: zero bytes
    val = torch.tensor([1, 2, 0, 3, 4, 4, 2, 1, 3, 0, 2, 4, 1])
    seq_len, max_tokens = 4, 12
    got = prepare.evaluate_bpb(BigramModel(table), val, token_bytes, seq_len, max_tokens,
                               batch_size=2)
    nats = nbytes = 0.0
    for row in range(max_tokens // seq_len):
        for pos in range(seq_len):
            i = row * seq_len + pos
            context, target = int(val[i]), int(val[i + 1])
            if token_bytes[target] == 0:
                continue
            logits = [float(v) for v in table[context]]
            log_z = math.log(sum(math.exp(v) for v in logits))
            nats += log_z - logits[target]
            nbytes += int(token_bytes[target])
    assert got == pytest.approx(nats / (math.log(2) * nbytes), rel=1e-6)


def test_evaluate_bpb_rejects_a_budget_larger_than_the_split(prepare):
    with pytest.raises(ValueError, match="cannot evaluate"):
        prepare.evaluate_bpb(BigramModel(torch.zeros(3, 3)), torch.tensor([1, 2, 1]),
                             torch.ones(3, dtype=torch.long), seq_len=4, max_tokens=8)


def test_token_bytes_add_up_to_utf8_bytes(prepare, nanochat_cache):
    tok = prepare.load_tokenizer()
    lengths = prepare.load_token_bytes()
    text = "def café(x):\n    return '☃ naïve 🙂' * x  # ünïcödé\n"
    ids = tok.encode(text).ids
    assert int(lengths[ids].sum()) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert lengths[tok.token_to_id(prepare.EOT)] == 0


def test_data_cache_is_deterministic_and_split(prepare, nanochat_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_CACHE_DIR", str(tmp_path))
    rebuilt = prepare.build_cache()
    original = prepare.cache_dir().parent.parent / nanochat_cache.name / "default"
    for name in prepare.CACHE_FILES:
        assert prepare.sha256_file(rebuilt / name) == prepare.sha256_file(nanochat_cache / "default" / name)
    for name, pinned in prepare.PINNED_CACHE_SHA256.items():  # every machine builds the same bytes
        assert prepare.sha256_file(rebuilt / name) == pinned
    train, dev, _ = prepare.load_train()
    val, _ = prepare.load_val()
    assert len(val) > prepare.spec().eval_tokens and len(train) > 5 * len(val)
    assert len(dev) == prepare.spec().quick_eval_tokens + 1
    assert original.exists()


def test_training_half_of_the_cache_holds_no_validation_data(prepare, nanochat_cache):
    train_half = nanochat_cache / "default" / "train"
    val, _ = prepare.load_val()
    assert not list(train_half.glob("val*"))
    needle = val[1000:1064].numpy().astype("uint16").tobytes()  # 64 validation tokens in a row
    assert needle not in (train_half / "train.bin").read_bytes()


def test_pinned_files_are_the_shipped_ones(prepare):
    prepare.verify_frozen_files()  # the committed frozen.sha256 matches prepare.py and the corpus
    assert len(prepare.default_documents()) > 100


def test_tampered_prepare_is_named(target_copy):
    prepare = load_target_modules(target_copy)["prepare"]
    path = target_copy / "prepare.py"
    path.write_text(path.read_text() + "\n# evaluate_bpb = lambda *a, **k: 0.0\n")
    with pytest.raises(prepare.FrozenDataError, match=r"prepare\.py: frozen file was modified"):
        prepare.verify_frozen_files()


def test_tampered_corpus_is_named(target_copy):
    prepare = load_target_modules(target_copy)["prepare"]
    corpus = target_copy / "data" / "corpus.txt.xz"
    corpus.write_bytes(corpus.read_bytes()[:-100])
    with pytest.raises(prepare.FrozenDataError, match=r"corpus\.txt\.xz"):
        prepare.default_documents()


def test_tampered_cache_is_named(prepare, nanochat_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_CACHE_DIR", str(tmp_path))
    built = prepare.build_cache()
    val = built / "val" / "val.bin"
    data = bytearray(val.read_bytes())
    data[100] ^= 1
    val.write_bytes(bytes(data))
    prepare.load_train()  # the training half is intact
    with pytest.raises(prepare.FrozenDataError, match=r"val\.bin: SHA-256 .* does not match the pinned"):
        prepare.load_val()
    manifest = built / "train" / "manifest.json"  # a rewritten manifest changes nothing: the pins are frozen
    record = json.loads(manifest.read_text())
    record["files"]["val/val.bin"] = prepare.sha256_file(val)
    manifest.write_text(json.dumps(record))
    with pytest.raises(prepare.FrozenDataError, match=r"val\.bin"):
        prepare.load_val()


def test_web_text_corpus_from_local_shards(prepare, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = "the of learning model data a to in is gradient loss network train we".split()
    docs = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(60)) + f" doc {i}."
            for i in range(300)]
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.table({"text": docs[:150]}), shards / "shard_00000.parquet")
    pq.write_table(pa.table({"text": docs[150:250]}), shards / "shard_00001.parquet")
    (shards / "shard_00002.txt").write_text(prepare.EOT.join(docs[250:]))  # validation
    small = prepare.CorpusSpec(vocab_size=300, seq_len=16, eval_tokens=512,
                               quick_eval_tokens=64, tokenizer_chars=10**6)
    monkeypatch.setitem(prepare.CORPORA, "fineweb", small)
    monkeypatch.setenv("NANOCHAT_CACHE_DIR", str(tmp_path / "cache"))
    out = prepare.build_cache("fineweb", local_dir=str(shards))
    manifest = json.loads((out / "train" / "manifest.json").read_text())
    assert manifest["corpus"] == "fineweb" and out.name == "fineweb"
    train, dev, token_bytes = prepare.load_train("fineweb")
    val, _ = prepare.load_val("fineweb")
    assert len(dev) == small.quick_eval_tokens + 1
    assert int(token_bytes[val].sum()) == manifest["val_bytes"] == sum(len(d) for d in docs[250:])
    assert len(train) > len(val)


def run_train(directory, env_extra, timeout=300):
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "train.py"], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=timeout)


def shrink(train_py, **constants):
    source = train_py.read_text()
    for name, value in constants.items():
        source = set_constant(source, name, value)
    train_py.write_text(source)


def test_same_seed_and_steps_give_identical_models(target_copy, nanochat_cache, monkeypatch, tmp_path):
    shrink(target_copy / "train.py", DEPTH="2", WIDTH="64", BATCH_SIZE="4")
    monkeypatch.setenv("GITRESEARCH_BUDGET_S", "1000")
    monkeypatch.setenv("GITRESEARCH_ARTIFACTS", str(tmp_path))
    monkeypatch.delenv("GITRESEARCH_METRICS", raising=False)
    models = [load_target_modules(target_copy, ("prepare", "train"))["train"].main(max_steps=4)
              for _ in range(2)]
    a, b = (m.state_dict() for m in models)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def evaluate(directory, artifacts, cache):
    """Run the frozen evaluate.py on a saved model: (exit code, summary dict, output)."""
    proc = subprocess.run([sys.executable, "evaluate.py"], cwd=directory, capture_output=True, text=True,
                          env=dict(os.environ, GITRESEARCH_ARTIFACTS=str(artifacts),
                                   NANOCHAT_CACHE_DIR=str(cache)), timeout=300)
    out = proc.stdout + proc.stderr
    summary = dict(line.split(":", 1) for line in out.split("---\n")[-1].splitlines() if ":" in line)
    return proc.returncode, summary, out


def test_evaluator_equals_the_in_process_figure(target_copy, nanochat_cache, monkeypatch, tmp_path):
    """The same checkpoint: the sandboxable evaluator's val_bpb is the former in-process one."""
    monkeypatch.setenv("GITRESEARCH_BUDGET_S", "1000")
    monkeypatch.setenv("GITRESEARCH_ARTIFACTS", str(tmp_path))
    monkeypatch.delenv("GITRESEARCH_METRICS", raising=False)
    modules = load_target_modules(target_copy, ("prepare", "train"))
    model = modules["train"].main(max_steps=3)
    val, token_bytes = modules["prepare"].load_val()
    in_process = modules["prepare"].evaluate_bpb(model, val, token_bytes)
    code, summary, out = evaluate(target_copy, tmp_path, nanochat_cache)
    assert code == 0, out
    assert abs(float(summary["val_bpb"]) - in_process) <= 1e-6
    assert int(summary["eval_tokens"]) == modules["prepare"].spec().eval_tokens


@pytest.mark.alone
def test_short_cpu_run_improves_val_bpb(target_copy, nanochat_cache, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    proc = run_train(target_copy, {"GITRESEARCH_BUDGET_S": "8", "GITRESEARCH_METRICS": str(metrics),
                                   "NANOCHAT_CACHE_DIR": str(nanochat_cache),
                                   "GITRESEARCH_ARTIFACTS": str(tmp_path / "out")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    points = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert points[0]["step"] == 0 and points[0]["t"] == 0 and points[-1]["t"] >= 8
    assert all(b["t"] >= a["t"] for a, b in zip(points, points[1:]))
    summary = dict(line.split(":", 1) for line in proc.stdout.split("---\n")[1].splitlines())
    assert "val_bpb" not in summary  # training reports no result of its own
    assert float(summary["dev_bpb"]) == pytest.approx(points[-1]["val_bpb"], abs=1e-6)
    assert float(summary["peak_vram_mb"]) > 10
    assert "step 0" in proc.stdout and "| loss: " in proc.stdout
    code, result, out = evaluate(target_copy, tmp_path / "out", nanochat_cache)
    assert code == 0, out
    assert float(result["val_bpb"]) < 0.98 * points[0]["val_bpb"]  # loose: CI machines are loaded


def export_model(prepare, model, directory):
    directory.mkdir()
    return prepare.save_model(model, str(directory))


class Bidirectional(torch.nn.Module):
    """Sees the next token: a bigram table over (current, next)."""

    def __init__(self, vocab):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, vocab)

    def forward(self, idx):
        nxt = torch.cat([idx[:, 1:], idx[:, -1:]], dim=1)
        return self.emb(idx) + 5 * torch.nn.functional.one_hot(nxt, self.emb.num_embeddings).float()


class SparsePeek(Bidirectional):
    """Sees the next token at a few positions only (none of them a round number)."""

    def __init__(self, vocab):
        super().__init__(vocab)
        self.register_buffer("mask", (torch.arange(256) % 50 == 17).float()[None, :, None])

    def forward(self, idx):
        nxt = torch.cat([idx[:, 1:], idx[:, -1:]], dim=1)
        peek = torch.nn.functional.one_hot(nxt, self.emb.num_embeddings).float() * self.mask
        return self.emb(idx) + 5 * peek


class RowMixer(torch.nn.Module):
    """Causal within a row, but each row sees the next row's first token (the last target)."""

    def __init__(self, vocab):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, vocab)

    def forward(self, idx):
        out = self.emb(idx)
        return out + self.emb(torch.roll(idx[:, :1], -1, dims=0))


class Memory(torch.nn.Module):
    """Keeps the last batch in a buffer: state from one batch to the next."""

    def __init__(self, vocab):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, vocab)
        self.register_buffer("seen", torch.zeros(8, 256, dtype=torch.long))

    def forward(self, idx):
        self.seen.copy_(idx)
        return self.emb(idx)


@pytest.mark.parametrize("cheat, reason", [(Bidirectional, "look-ahead"), (SparsePeek, "look-ahead"),
                                           (RowMixer, "look-ahead"),
                                           (Memory, "mutates its buffers")])
def test_evaluator_refuses_cheating_models(prepare, nanochat_cache, target_copy, tmp_path, cheat, reason):
    export_model(prepare, cheat(prepare.spec().vocab_size), tmp_path / "a")
    code, _, out = evaluate(target_copy, tmp_path / "a", nanochat_cache)
    assert code == 2 and "refused: " in out and reason in out, out
    assert "val_bpb" not in out


def test_evaluator_refuses_a_missing_or_forged_artifact(nanochat_cache, target_copy, tmp_path):
    code, _, out = evaluate(target_copy, tmp_path / "none", nanochat_cache)
    assert code == 2 and "no model artifact" in out
    (tmp_path / "forged").mkdir()
    (tmp_path / "forged" / "model.pt2").write_bytes(b"PK\x03\x04 not an archive")
    code, _, out = evaluate(target_copy, tmp_path / "forged", nanochat_cache)
    assert code == 2 and "does not load as an exported program" in out


@pytest.mark.parametrize("constant, value", [("LOGIT_SOFTCAP", "float('nan')"),
                                             ("DIVERGE_FACTOR", "0.5")])
def test_divergence_fails_fast(target_copy, nanochat_cache, constant, value):
    shrink(target_copy / "train.py", **{constant: value})
    proc = run_train(target_copy, {"GITRESEARCH_BUDGET_S": "60",
                                   "NANOCHAT_CACHE_DIR": str(nanochat_cache)})
    assert proc.returncode == 1
    assert "FAIL: training diverged at step 1" in proc.stdout
    assert "val_bpb:" not in proc.stdout


def test_gpu_configuration_on_meta_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    modules = load_target_modules(TARGET, ("prepare", "train"))
    train, web = modules["train"], modules["prepare"].CORPORA["fineweb"]
    assert (train.DEPTH, train.WIDTH, train.HEAD_DIM) == (12, 768, 64)
    with torch.device("meta"):
        model = train.GPT(web.vocab_size, web.seq_len)
        logits = model(torch.zeros(2, web.seq_len, dtype=torch.long))
    d, v, layers = 768, web.vocab_size, 12
    per_block = 4 * d * d + 2 * 4 * d * d  # q, k, v, proj + MLP in and out, no biases
    assert sum(p.numel() for p in model.parameters()) == layers * per_block + 2 * v * d
    assert logits.shape == (2, web.seq_len, v)
    assert model.lm_head.weight is not model.wte.weight  # untied head
    assert len(model.blocks) == 12 and model.blocks[0].attn.n_head == 12
    for name in ("prepare", "train"):  # do not leak the GPU-scale module to other tests
        sys.modules.pop(name, None)

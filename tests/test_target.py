"""The bundled nanochat target: metric, determinism, learning, GPU shape, frozen data."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import TARGET, load_target_modules
from gitresearch.pysource import set_constant


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
    train, val, _ = prepare.load_data()
    assert len(val) > prepare.spec().eval_tokens and len(train) > 5 * len(val)
    assert original.exists()


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
    val = built / "val.bin"
    data = bytearray(val.read_bytes())
    data[100] ^= 1
    val.write_bytes(bytes(data))
    with pytest.raises(prepare.FrozenDataError, match=r"val\.bin: SHA-256 .* does not match the manifest"):
        prepare.load_data()


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
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["corpus"] == "fineweb" and out.name == "fineweb"
    train, val, token_bytes = prepare.load_data("fineweb")
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


def test_same_seed_and_steps_give_identical_val_bpb(target_copy, nanochat_cache, monkeypatch):
    shrink(target_copy / "train.py", DEPTH="2", WIDTH="64", BATCH_SIZE="4")
    monkeypatch.setenv("GITRESEARCH_BUDGET_S", "1000")
    monkeypatch.delenv("GITRESEARCH_METRICS", raising=False)
    results = [load_target_modules(target_copy, ("prepare", "train"))["train"].main(max_steps=4)
               for _ in range(2)]
    assert results[0] == results[1]
    assert math.isfinite(results[0])


def test_short_cpu_run_improves_val_bpb(target_copy, nanochat_cache, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    proc = run_train(target_copy, {"GITRESEARCH_BUDGET_S": "8", "GITRESEARCH_METRICS": str(metrics),
                                   "NANOCHAT_CACHE_DIR": str(nanochat_cache)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    points = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert points[0]["step"] == 0 and points[0]["t"] == 0
    assert points[-1]["final"] and points[-1]["t"] >= 8
    assert all(b["t"] >= a["t"] for a, b in zip(points, points[1:]))
    summary = dict(line.split(":", 1) for line in proc.stdout.split("---\n")[1].splitlines())
    assert float(summary["val_bpb"]) == pytest.approx(points[-1]["val_bpb"], abs=1e-6)
    assert float(summary["val_bpb"]) < 0.98 * points[0]["val_bpb"]  # loose: CI machines are loaded
    assert float(summary["peak_vram_mb"]) > 10
    assert "step 0" in proc.stdout and "| loss: " in proc.stdout


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

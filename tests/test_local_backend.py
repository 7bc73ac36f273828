"""The local transformers backend: a tiny GPT-2 with random weights, built from a config
here (no download), proposes through the loop; its garbage output ends as `invalid`."""
import transformers

from gitresearch.config import LLMConfig
from gitresearch.gitstore import Store
from helpers import FAKES, cli, make_repo


def tiny_model(path, positions=4096):
    """A byte-level BPE tokenizer trained on the fake train.py and a 1-layer GPT-2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([(FAKES / "curve.py").read_text()] * 4, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(path)
    config = transformers.GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=positions,
                                     n_embd=32, n_layer=1, n_head=2, eos_token_id=0, bos_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def test_local_backend_generates_and_counts(tmp_path):
    from gitresearch.policies.backends import LocalBackend

    backend = LocalBackend(LLMConfig(backend="local", model=str(tiny_model(tmp_path / "m", 512)),
                                     max_tokens=16, temperature=1.0))
    assert backend.context_tokens == 512  # the model's own limit wins over [llm] context_tokens
    assert backend.count_tokens("LR = 0.1") > 0
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "LR = 0.1"}]
    assert backend.render(messages).endswith("ASSISTANT:\n")  # no chat template: plain turns
    completion = backend.complete(messages)
    assert isinstance(completion.text, str) and completion.usage["completion_tokens"] <= 16


def test_local_model_garbage_is_recorded_invalid(tmp_path):
    model = tiny_model(tmp_path / "model")
    repo = make_repo(tmp_path / "repo", config='[policy]\nmax_tries = 2\n[llm]\nmax_tokens = 24\n'
                                               'context_tokens = 4096\ntemperature = 1.0\n')
    cli("init", cwd=repo)
    out = cli("loop", "--policy", "llm", "--backend", "local", "--model", str(model),
              "--max-experiments", "2", cwd=repo).stdout
    assert "stopped: reached 2 experiments" in out
    records = [e.record for e in Store(repo).experiments() if e.number > 0]
    assert [r["status"] for r in records] == ["invalid", "invalid"]
    for record in records:
        assert len(record["attempts"]) == 2 and record["reward"]["penalty"] == 1.0
        assert record["policy_data"]["backend"] == "local" and record["policy_data"]["prompt_tokens"] > 500
        assert all(a["error"] for a in record["attempts"])

"""The local transformers backend: a tiny GPT-2 with random weights, built from a config
here (no download), proposes through the loop; its garbage output ends as `invalid`."""
from gitresearch.config import LLMConfig
from gitresearch.gitstore import Store
from helpers import cli, make_repo
from tiny_lm import tiny_model


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
        assert len(record["attempts"]) == 2 and record["reward"]["penalty"] == 12.0
        assert record["policy_data"]["backend"] == "local" and record["policy_data"]["prompt_tokens"] > 500
        assert all(a["error"] for a in record["attempts"])

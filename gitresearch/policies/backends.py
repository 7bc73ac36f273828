"""Model backends: `messages -> Completion` and a token counter.

- `openai`: any OpenAI-compatible chat-completions endpoint (vLLM, the llama.cpp server,
  Ollama's /v1, hosted APIs) over httpx. Base URL: [llm] base_url, else $OPENAI_BASE_URL (the
  variable named by base_url_env), else https://api.openai.com/v1; the key is read from the
  variable named by api_key_env (default OPENAI_API_KEY) and sent only to the endpoint.
  429, 5xx, timeouts and connection errors are retried with exponential, jittered backoff
  (Retry-After honoured); other 4xx fail at once. No tokenizer is at hand for a remote model,
  so prompt tokens are estimated at CHARS_PER_TOKEN characters each (cautious for code).
- `local`: a transformers causal LM from a path or a hub id, with its chat template where it
  has one; its own tokenizer counts the tokens.
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field

from ..config import LLMConfig
from . import BackendError

CHARS_PER_TOKEN = 3.0  # estimate for endpoints without a local tokenizer (code runs ~3-4)
DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_BACKOFF_S = 60.0


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Completion:
    text: str
    seconds: float
    usage: dict = field(default_factory=dict)
    finish_reason: str | None = None


class OpenAIBackend:
    def __init__(self, config: LLMConfig, environ: dict | None = None, sleep=time.sleep):
        import httpx

        environ = os.environ if environ is None else environ
        if not config.model:
            raise BackendError("[llm] model is not set (gitresearch loop --model NAME)")
        self.config, self.sleep, self.httpx = config, sleep, httpx
        self.base_url = (config.base_url or environ.get(config.base_url_env) or DEFAULT_BASE_URL).rstrip("/")
        key = environ.get(config.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(
            config.timeout_s, connect=config.connect_timeout_s))
        self.context_tokens = config.context_tokens

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    def complete(self, messages: list[dict]) -> Completion:
        c = self.config
        url = f"{self.base_url}/chat/completions"
        body = {"model": c.model, "messages": messages, "temperature": c.temperature,
                "top_p": c.top_p, "max_tokens": c.max_tokens}
        started, failure, wait = time.monotonic(), "", c.backoff_s
        for attempt in range(c.retries + 1):
            retry_after = None
            try:
                response = self.client.post(url, json=body)
            except self.httpx.TimeoutException as err:
                failure = f"timed out ({type(err).__name__}, timeout {c.timeout_s:g} s)"
            except self.httpx.TransportError as err:
                failure = f"connection error: {type(err).__name__}: {err}"
            else:
                if response.status_code == 429 or response.status_code >= 500:
                    failure = f"HTTP {response.status_code}: {response.text[:300]}"
                    retry_after = _retry_after(response.headers.get("retry-after"))
                elif response.status_code >= 400:
                    raise BackendError(f"POST {url}: HTTP {response.status_code}: {response.text[:500]}")
                else:
                    return _completion(response, url, time.monotonic() - started)
            if attempt < c.retries:
                self.sleep(min(retry_after if retry_after is not None else wait * random.uniform(0.5, 1.0), MAX_BACKOFF_S))
                wait *= 2
        raise BackendError(f"POST {url}: {failure} (after {c.retries + 1} attempts)")


def _retry_after(value: str | None) -> float | None:
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to the backoff


def _completion(response, url: str, seconds: float) -> Completion:
    try:
        data = response.json()
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
        raise BackendError(f"POST {url}: malformed chat-completions response ({err!r}): "
                           f"{response.text[:300]}") from err
    return Completion(text, seconds, data.get("usage") or {}, choice.get("finish_reason"))


class LocalBackend:
    """A transformers causal LM in this process (also the base of the RL policy)."""

    def __init__(self, config: LLMConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not config.model:
            raise BackendError("[llm] model is not set: a local path or a hub id (--model)")
        self.config, self.torch = config, torch
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = "auto" if config.dtype == "auto" else getattr(torch, config.dtype)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(config.model)
            self.model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype).to(device).eval()
        except (OSError, ValueError) as err:
            raise BackendError(f"cannot load the local model {config.model!r}: {err}") from err
        self.device = device
        positions = getattr(self.model.config, "max_position_embeddings", None) or \
            getattr(self.model.config, "n_positions", None)
        self.context_tokens = min(config.context_tokens, positions) if positions else config.context_tokens

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, messages: list[dict]) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        turns = [f"{m['role'].upper()}:\n{m['content']}" for m in messages]
        return "\n\n".join(turns) + "\n\nASSISTANT:\n"

    def complete(self, messages: list[dict]) -> Completion:
        c, torch = self.config, self.torch
        started = time.monotonic()
        inputs = self.tokenizer(self.render(messages), return_tensors="pt", add_special_tokens=False).to(self.device)
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        try:
            with torch.no_grad():
                out = self.model.generate(**inputs, do_sample=c.temperature > 0, max_new_tokens=c.max_tokens,
                                          temperature=c.temperature if c.temperature > 0 else None,
                                          top_p=c.top_p if c.temperature > 0 else None, pad_token_id=pad)
        except torch.OutOfMemoryError as err:  # a long prompt on a small GPU: a failed try, not a crash
            raise BackendError(f"the local model ran out of memory on a {inputs['input_ids'].shape[1]}-token "
                               f"prompt: lower [llm] context_tokens ({err})") from err
        new = out[0, inputs["input_ids"].shape[1]:].tolist()
        finish = "length"
        if eos is not None and eos in new:  # cut at the first EOS, not at the pad id
            new, finish = new[:new.index(eos)], "stop"
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return Completion(text, time.monotonic() - started,
                          {"prompt_tokens": int(inputs["input_ids"].shape[1]), "completion_tokens": len(new)}, finish)


def make_backend(config: LLMConfig):
    if config.backend == "openai":
        return OpenAIBackend(config)
    if config.backend == "local":
        return LocalBackend(config)
    raise BackendError(f"unknown [llm] backend {config.backend!r} (available: openai, local)")

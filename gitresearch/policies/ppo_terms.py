"""PPO's terms on tensors, apart from the learner that holds the model (ppo.py): the reply's
log-probs and entropies in checkpointed chunks, the decision tokens, the k3 KL estimate and the
running reward statistics (docs/policies.md, "PPO details")."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _logp_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                  blocked: torch.Tensor | None = None):
    x = logits.float() / temperature
    if blocked is not None:  # tokens the grammar gives probability 0
        x = x.masked_fill(blocked, float("-inf"))
    lse = torch.logsumexp(x, dim=-1)
    token = x.gather(-1, targets[..., None]).squeeze(-1) - lse
    finite = x if blocked is None else x.masked_fill(blocked, 0.0)  # 0 * -inf would be nan
    entropy = lse - (torch.softmax(x, dim=-1) * finite).sum(-1)
    return token, entropy


def reply_logp_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int,
                       blocked: torch.Tensor | None = None):
    """Log-probs of `targets` and entropies under `logits` / temperature, with the `blocked`
    tokens (True) given probability 0, `chunk` positions at a time; with gradients, each
    chunk's float copy and softmax are recomputed in the backward pass instead of kept
    (checkpointed)."""
    from torch.utils.checkpoint import checkpoint

    tokens, entropies = [], []
    for start in range(0, logits.shape[1], max(1, chunk)):
        part = (logits[:, start:start + chunk], targets[:, start:start + chunk], temperature,
                None if blocked is None else blocked[:, start:start + chunk])
        token, entropy = (checkpoint(_logp_entropy, *part, use_reentrant=False)
                          if torch.is_grad_enabled() and logits.requires_grad else _logp_entropy(*part))
        tokens.append(token)
        entropies.append(entropy)
    return torch.cat(tokens, dim=1), torch.cat(entropies, dim=1)


def decision_mask(entropy: torch.Tensor, share: float) -> torch.Tensor:
    """1.0 at the reply's `share` highest-entropy tokens (at least one; ties at the threshold
    are all kept), 0.0 elsewhere; all ones at share >= 1. Most tokens of a diff are copies
    and format (headers, the removed line, the fence) that the model writes with near-zero
    entropy; the few uncertain ones (which constant, its new value) are the decisions the
    reward can be about (Wang et al. 2025: RL on the top 20 % highest-entropy tokens matches
    or beats RL on all of them)."""
    if share >= 1.0 or entropy.numel() == 0:
        return torch.ones_like(entropy)
    k = max(1, math.ceil(share * entropy.numel() - 1e-9))  # 0.3 x 10 tokens is 3, not 4
    threshold = torch.topk(entropy.detach(), k).values[-1]
    return (entropy.detach() >= threshold).to(entropy.dtype)


KL_K3_MAX = 10.0  # nats: the ceiling of one token's k3 term (as verl's low_var_kl)


def kl_k3(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) on tokens the policy sampled
    (Schulman 2020; GRPO's penalty): r - log r - 1 with r = p_ref / p, never negative, zero
    where they agree, linear (not exponential) in how far the policy moved above the
    reference, and clamped at KL_K3_MAX where the reference is far more likely, so that one
    token cannot dominate an update."""
    log_ratio = torch.clamp(ref - logp, -20.0, 20.0)  # exp stays finite: no inf x 0 in the clamp's gradient
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, max=KL_K3_MAX)


@dataclass
class RunningStats:
    """Mean and variance of every reward seen (Welford), to normalise rewards whose scale
    depends on the target's noise and on the penalties."""
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)

    def std(self) -> float:
        return (self.m2 / (self.count - 1)) ** 0.5 if self.count > 1 else 0.0

    def normalise(self, value: float, clip: float) -> float:
        """(value - mean) / std, clipped; the raw value, clipped, until the rewards have a
        spread (one reward, or all equal: centring would erase the only signal there is)."""
        std = self.std()
        return max(-clip, min(clip, (value - self.mean) / std if std > 1e-8 else value))

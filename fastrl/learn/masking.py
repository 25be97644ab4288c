"""Action masking for discrete policies: invalid actions get probability zero.

A masked env hands out its action mask (bool ``[N, n]``, ``n`` the policy's logits: ``sum(nvec)`` for MultiDiscrete)
as the last ``n`` columns of its flat observation (``fastrl.envs.masks``), so the mask travels with the observation
through the rollout buffer, the minibatches, K members' vmapped calls and the learner of IMPALA/APPO without a field
of its own. A model splits it off (``action_mask``) before its trunks, never feeding it to the network, and hands it
to the one place its action distribution is built (``fastrl.learn.models.action_logp_entropy`` / ``action_mode``),
which masks the logits (``masked_logits``).
"""
from __future__ import annotations

import torch


def action_mask(flat_obs: torch.Tensor, width: int) -> torch.Tensor | None:
    """The action mask in the last ``width`` columns of ``flat_obs [..., D + width]`` (0/1 values) as bool
    ``[..., width]``; None when ``width`` is 0 (an unmasked policy)."""
    return flat_obs[..., -width:] > 0.5 if width else None


def masked_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``logits [B, n]`` (float32) with the actions ``mask [B, n]`` rules out set to float32's most negative finite
    value, not -inf: their softmax probability is exactly 0, so log-softmax, entropy (``0 * finite``) and gradients
    stay finite, and Gumbel-max sampling and argmax never choose them while any action is valid."""
    logits = logits.float()
    return logits if mask is None else logits.masked_fill(~mask, torch.finfo(torch.float32).min)

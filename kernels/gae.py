"""Generalized advantage estimation over time-major tensors ``[T, *B]``."""
import torch


def gae_reference(reward, value, next_value, done, terminated, gamma, lam):
    """Plain loop twin. Returns ``(advantage, value_target)`` in float32, shape ``[T, *B]``."""
    reward, value, next_value = (x.float() for x in (reward, value, next_value))
    not_done = 1.0 - done.float()
    not_term = 1.0 - terminated.float()
    adv = torch.zeros_like(reward)
    last = torch.zeros_like(reward[0])
    for t in range(reward.shape[0] - 1, -1, -1):
        delta = reward[t] + gamma * not_term[t] * next_value[t] - value[t]
        last = delta + gamma * lam * not_done[t] * last
        adv[t] = last
    return adv, adv + value


gae = gae_reference

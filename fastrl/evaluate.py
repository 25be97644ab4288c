"""Deterministic evaluation on separate envs: the policy's mode, ``episodes`` episodes per seed."""
from __future__ import annotations

import torch

from fastrl.envs import BatchedEnv, NormalizedEnv


def eval_seed(run_seed: int, k: int) -> int:
    """Seeds for eval envs, disjoint from the training envs' seeds."""
    return (run_seed * 100_003 + 700_000_000 + k * 10_007) % (2**31 - 1)


@torch.no_grad()
def evaluate(agent, cfg, normalizer_state: dict | None, episodes: int, seeds: int, device: torch.device,
             max_steps: int = 100_000) -> torch.Tensor:
    """Run ``episodes`` envs per seed to the end of their first episode. Returns returns ``[seeds * episodes]``."""
    results = []
    for k in range(seeds):
        raw = BatchedEnv(cfg.env, episodes, eval_seed(cfg.seed, k), cfg.env_backend, cfg.env_threads)
        env = NormalizedEnv(raw, cfg.normalize_obs, False, cfg.gamma, cfg.obs_clip, cfg.reward_clip, training=False)
        if normalizer_state is not None:
            env.load_state_dict(normalizer_state)
        obs = env.reset()
        finished = torch.zeros(episodes, dtype=torch.bool)
        episode_return = torch.zeros(episodes, dtype=torch.float64)
        for _ in range(max_steps):
            action = agent.act_deterministic(obs.to(device)).cpu()
            step = env.step(action)
            episode_return += step.reward.double() * ~finished
            finished |= step.done
            obs = step.observation
            if bool(finished.all()):
                break
        env.close()
        results.append(episode_return)
    return torch.cat(results)

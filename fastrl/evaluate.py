"""Deterministic evaluation on separate envs: the policy's mode, ``episodes`` episodes per seed."""
from __future__ import annotations

import torch

from fastrl.envs import make_env


def eval_seed(run_seed: int, k: int) -> int:
    """Seeds for eval envs, disjoint from the training envs' seeds."""
    return (run_seed * 100_003 + 700_000_000 + k * 10_007) % (2**31 - 1)


@torch.no_grad()
def evaluate(agent, cfg, normalizer_state: dict | None, episodes: int, seeds: int, device: torch.device,
             max_steps: int = 100_000) -> torch.Tensor:
    """Run ``episodes`` envs per seed to the end of their first episode. Returns returns ``[seeds * episodes]``."""
    results = []
    for k in range(seeds):
        # training=False: frozen normalizer statistics, unscaled rewards, whole unclipped Atari games.
        env = make_env(cfg, n_envs=episodes, seed=eval_seed(cfg.seed, k), training=False)
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


def evaluate_checkpoint(target, episodes: int, seeds: int, device: str = "cpu"):
    """Load a checkpoint (file or run dir) and evaluate it. Returns ``(returns [seeds * episodes], config)``."""
    from fastrl.checkpoint import load_checkpoint
    from fastrl.config import make_config
    from fastrl.distributed import resolve_device
    from fastrl.envs import make_env
    from fastrl.models import make_agent

    state = load_checkpoint(target)
    cfg = make_config(state["config"], where=f"checkpoint {target}")
    dev = resolve_device(device)
    probe = make_env(cfg, n_envs=1, training=False)
    agent = make_agent(cfg, probe.observation_shape, probe.action_spec)
    probe.close()
    agent.load_state_dict(state["model"])
    agent.to(dev).eval()
    return evaluate(agent, cfg, state.get("normalizer"), episodes, seeds, dev), cfg

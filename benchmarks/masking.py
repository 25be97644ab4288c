"""Action masking: does a masked policy beat an unmasked one on an env that penalises invalid actions?

    python -m benchmarks.masking [--steps 20000] [--seeds 1 2 3] [--out PATH]

The env (``MaskedChoice``, also the tests' masked env): each step a random subset of 6 actions is valid (each with
probability 1/2, at least one); a valid action earns +1, an invalid one -1 and the episode goes on; 50 steps. The
observation is the valid subset as 0/1 floats, so an unmasked policy can learn it too; a random policy scores 0, a
perfect one 50. Masked and unmasked PPO train with the same steps and hyperparameters: the masked one through
``action_masks()`` (sb3-contrib's convention), the unmasked one on the same env without it (``UnmaskedChoice``).
Reported per arm: each seed's training return (its last episodes' mean: what it earned while learning) and
final evaluation return (deterministic), their medians, and the invalid actions among 2,000 stochastic ``predict``
steps of the trained agent. JSON to benchmarks/results/<machine>/masking.json, or ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

import gymnasium
import numpy as np
import torch

from fastrl.envs.spaces import ActionSpec
from fastrl.envs.torch_envs import TorchEnvSpec

N_ACTIONS, EPISODE_STEPS = 6, 50
PREDICT_STEPS = 2000


class UnmaskedChoice(gymnasium.Env):
    """The penalised env without masks: the valid subset is only in the observation (see the module docstring)."""
    observation_space = gymnasium.spaces.Box(0.0, 1.0, (N_ACTIONS,), np.float32)
    action_space = gymnasium.spaces.Discrete(N_ACTIONS)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._observation(), {}

    def step(self, action):
        reward = 1.0 if self.valid[int(action)] else -1.0
        self.t += 1
        self._draw()
        return self._observation(), reward, self.t >= EPISODE_STEPS, False, {}

    def _draw(self):
        self.valid = self.np_random.random(N_ACTIONS) < 0.5
        self.valid[self.np_random.integers(N_ACTIONS)] = True

    def _observation(self):
        return self.valid.astype(np.float32)


class MaskedChoice(UnmaskedChoice):
    """sb3-contrib's convention: ``action_masks()`` gives the valid subset."""

    def action_masks(self) -> np.ndarray:
        return self.valid.copy()


class DictMaskedChoice(UnmaskedChoice):
    """PettingZoo's and RLlib's convention: a Dict observation with an ``action_mask`` entry."""
    observation_space = gymnasium.spaces.Dict({"observation": UnmaskedChoice.observation_space,
                                               "action_mask": gymnasium.spaces.MultiBinary(N_ACTIONS)})

    def _observation(self):
        return {"observation": self.valid.astype(np.float32), "action_mask": self.valid.astype(np.int8)}


# The same env, torch-native (``env_backend: torch``): physics ``[N, 7]`` float64, the valid subset as 0/1 in the
# first 6 columns and the steps taken in the last. Its draws (7 a step: a subset, and the action made valid) come from
# the env step's ``reset_uniform``. The 50 steps end it as terminated, as above; the time limit never comes first.
def _choice_subset(uniform: torch.Tensor) -> torch.Tensor:
    """``[N, 7]`` U(0, 1) draws -> ``[N, 6]`` 0/1 float64: each action valid with probability 1/2, one always."""
    forced = torch.nn.functional.one_hot((uniform[:, -1] * N_ACTIONS).long().clamp(max=N_ACTIONS - 1), N_ACTIONS)
    return ((uniform[:, :N_ACTIONS] < 0.5) | forced.bool()).double()


def choice_reset(uniform: torch.Tensor) -> torch.Tensor:
    return torch.cat((_choice_subset(uniform), torch.zeros_like(uniform[:, :1])), dim=-1)


def choice_dynamics(physics: torch.Tensor, action: torch.Tensor, fresh: torch.Tensor, uniform: torch.Tensor):
    chosen_valid = physics.gather(1, action.long().unsqueeze(-1)).squeeze(-1) > 0.5
    steps = physics[:, -1] + 1
    stepped = torch.cat((_choice_subset(uniform), steps.unsqueeze(-1)), dim=-1)
    return stepped, torch.where(chosen_valid, 1.0, -1.0).double(), steps >= EPISODE_STEPS


MASKED_CHOICE = TorchEnvSpec(
    reset=choice_reset, dynamics=choice_dynamics, observe=lambda physics: physics[:, :N_ACTIONS].float(),
    state_width=N_ACTIONS + 1, reset_draws=N_ACTIONS + 1, observation_shape=(N_ACTIONS,),
    action_spec=ActionSpec("discrete", n=N_ACTIONS), max_episode_steps=10 * EPISODE_STEPS,
    action_mask=lambda physics: physics[:, :N_ACTIONS] > 0.5)
UNMASKED_CHOICE = dataclasses.replace(MASKED_CHOICE, action_mask=None)


def invalid_predictions(agent, env_cls, steps: int = PREDICT_STEPS, seed: int = 0) -> int:
    """Invalid actions among ``steps`` stochastic ``predict`` calls of ``agent`` playing one ``env_cls`` env."""
    env = env_cls()
    obs, _ = env.reset(seed=seed)
    invalid = 0
    for _ in range(steps):
        masks = env.action_masks() if hasattr(env, "action_masks") else None
        action, _ = agent.predict(obs, deterministic=False, action_masks=masks)
        invalid += not env.valid[int(action)]
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    return invalid


def train_arm(env_cls, seed: int, steps: int, run_dir: Path, predict_steps: int = PREDICT_STEPS) -> dict:
    import fastrl
    run = fastrl.train(env=env_cls, seed=seed, total_steps=steps, n_envs=8, n_steps=64, n_epochs=4, n_minibatches=4,
                       lr=3e-3, eval_episodes=8, run_dir=run_dir, progress=False, wandb="disabled",
                       tensorboard=False, plot=False, quiet=True)
    return {"seed": seed, "train_return_mean": run.summary["episode_return_mean"],
            "eval_return_mean": run.summary["eval_return_mean"],
            "invalid_predictions": invalid_predictions(run.agent, env_cls, predict_steps, seed)}


def main(argv=None) -> int:
    from benchmarks.common import default_out, machine_info, markdown_table, write_json
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--predict-steps", type=int, default=PREDICT_STEPS, help="stochastic predict calls counted")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: the machine's results folder)")
    args = parser.parse_args(argv)
    arms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, env_cls in (("masked", MaskedChoice), ("unmasked", UnmaskedChoice)):
            runs = [train_arm(env_cls, seed, args.steps, Path(tmp) / f"{name}{seed}", args.predict_steps)
                    for seed in args.seeds]
            arms[name] = {"runs": runs,
                          "median_train_return": statistics.median(r["train_return_mean"] for r in runs),
                          "median_eval_return": statistics.median(r["eval_return_mean"] for r in runs),
                          "median_invalid_predictions": statistics.median(r["invalid_predictions"] for r in runs)}
    report = {"machine": machine_info(), "steps": args.steps, "seeds": args.seeds, "predict_steps": args.predict_steps,
              "arms": arms}
    path = write_json(report, args.out or default_out("masking"))
    print(markdown_table(["arm", "median train return", "median eval return",
                          f"median invalid of {args.predict_steps:,} predictions"],
                         [[name, *(arm[key] for key in ("median_train_return", "median_eval_return",
                                                         "median_invalid_predictions"))] for name, arm in arms.items()]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

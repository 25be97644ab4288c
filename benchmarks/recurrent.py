"""Does fastrl's recurrent PPO solve position-only CartPole, and at what cost beside sb3-contrib's RecurrentPPO?

CartPoleNoVel-v1 (CartPole-v1 observed as [x, theta]: no velocities, so a policy without memory cannot tell which way
the pole moves). In one process, one contender after another:

- ``fastrl[lstm]``: ``configs/ppo/cartpole_novel_lstm.yaml`` (``--recurrent``, default lstm), ``--steps`` each
  (default 150k, the config's; target: deterministic evaluation >= 475 within 300k), every seed in one population call (``n_seeds``, as
  ``--n-seeds 3`` on the command line), so its wall seconds are those of all seeds together; it stops once every
  member's last-100-episode training mean reaches ``--stop-at-return`` (default 475) or at ``--steps``;
- ``fastrl[none]``: the same config with ``recurrent: none`` (the baseline without memory);
- ``sb3-contrib``: ``RecurrentPPO("MlpLstmPolicy")`` at the RL Zoo's CartPoleNoVel-v1 settings (``ZOO_PPO_LSTM``, from
  hyperparams/ppo_lstm.yml), ``--sb3-steps`` each (default 100k, the zoo's budget, no early stop), one run per
  seed (``--sb3-seeds`` of them).

Figures per contender: the median over seeds of the deterministic evaluation's mean return (``--eval-episodes`` fresh
episodes per seed; VecNormalize's statistics frozen for SB3, the run's normalizer for fastrl) and of wall seconds
(fastrl: the one call, start-up and evaluation included; sb3-contrib: one run's ``learn``). JSON to ``--out`` only.

    python -m benchmarks.recurrent --n-seeds 3 --out /tmp/recurrent.json
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine_info, markdown_table, package_version, write_json

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "ppo" / "cartpole_novel_lstm.yaml"
ENV_ID = "CartPoleNoVel-v1"
TARGET = 475.0
# rl-baselines3-zoo hyperparams/ppo_lstm.yml, CartPoleNoVel-v1 (as its published model card lists them).
ZOO_PPO_LSTM = dict(n_envs=8, n_timesteps=100_000, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                    ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, normalize=dict(norm_obs=True, norm_reward=False),
                    policy_kwargs=dict(ortho_init=False, activation_fn="relu", lstm_hidden_size=64,
                                       enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])))


def run_fastrl(recurrent: str, seeds: list, steps: int, eval_episodes: int, compile_mode: str,
               stop_at_return: float) -> list:
    """One ``fastrl.train`` call training ``seeds`` as a population (``n_seeds``, seeds ``seeds[0]`` on): a row per
    member, each with the call's wall seconds (the members train together) and the steps it took."""
    import fastrl
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run = fastrl.train(config=str(CONFIG), recurrent=recurrent, seed=seeds[0], n_seeds=len(seeds),
                           total_steps=steps, compile=compile_mode, eval_episodes=eval_episodes,
                           stop_at_return=stop_at_return,
                           run_dir=str(Path(tmp) / "run"), wandb="disabled", tensorboard=False, plot=False,
                           progress=False, quiet=True)
        wall = time.perf_counter() - start
    members = run.summary["members"] if len(seeds) > 1 else [run.summary]
    assert len(members) == len(seeds), run.summary
    return [{"seed": seed, "eval_return": float(member["eval_return_mean"]), "wall_s": wall,
             "train_wall_s": float(run.summary["wall_time_s"]), "steps": int(run.summary["total_steps"]) // len(seeds)}
            for seed, member in zip(seeds, members)]


def run_sb3_contrib(seed: int, steps: int, eval_episodes: int) -> dict:
    import gymnasium
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    from benchmarks.peers_sb3 import Linear
    from fastrl.envs.registry import register_gymnasium_ids
    register_gymnasium_ids()
    zoo = ZOO_PPO_LSTM
    env = VecNormalize(make_vec_env(ENV_ID, n_envs=zoo["n_envs"], seed=seed), gamma=zoo["gamma"], **zoo["normalize"])
    kwargs = {**zoo["policy_kwargs"], "activation_fn": {"relu": nn.ReLU}[zoo["policy_kwargs"]["activation_fn"]]}
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=zoo["n_steps"], batch_size=zoo["batch_size"],
                         gae_lambda=zoo["gae_lambda"], gamma=zoo["gamma"], n_epochs=zoo["n_epochs"],
                         ent_coef=zoo["ent_coef"], learning_rate=Linear(zoo["learning_rate"]),
                         clip_range=Linear(zoo["clip_range"]), policy_kwargs=kwargs, seed=seed, device="cpu")
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - start
    eval_env = VecNormalize(make_vec_env(ENV_ID, n_envs=1, seed=seed + 10_000), training=False, norm_reward=False)
    eval_env.obs_rms = env.obs_rms
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes, deterministic=True,
                                 return_episode_rewards=True)
    assert gymnasium.spec(ENV_ID).max_episode_steps == 500
    return {"seed": seed, "eval_return": float(statistics.fmean(returns)), "wall_s": wall, "train_wall_s": wall,
            "steps": steps}


def summarize(runs: list) -> dict:
    returns = [r["eval_return"] for r in runs]
    return {"median_eval_return": statistics.median(returns), "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "seeds_at_target": sum(r >= TARGET for r in returns), "runs": runs}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON report's path")
    parser.add_argument("--recurrent", default="lstm", choices=("lstm", "gru"), help="fastrl's recurrent core")
    parser.add_argument("--n-seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150_000, help="fastrl's env steps per seed")
    parser.add_argument("--sb3-steps", type=int, default=ZOO_PPO_LSTM["n_timesteps"], help="sb3-contrib's per seed")
    parser.add_argument("--sb3-seeds", type=int, default=None, help="sb3-contrib's runs (default: --n-seeds)")
    parser.add_argument("--stop-at-return", type=float, default=TARGET,
                        help="fastrl's stop rule: end once every member's last-100-episode training mean reaches it "
                             "(0: the whole --steps)")
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--compile", default="off", help="fastrl's compile mode (off: no compile time in the figures)")
    parser.add_argument("--libs", default="fastrl[lstm],fastrl[none],sb3-contrib", help="comma-separated contenders")
    args = parser.parse_args(argv)
    seeds = list(range(1, args.n_seeds + 1))
    contenders = {  # fastrl: all seeds in one population call; sb3-contrib: one run per seed
        "fastrl[lstm]": lambda: run_fastrl(args.recurrent, seeds, args.steps, args.eval_episodes, args.compile,
                                           args.stop_at_return),
        "fastrl[none]": lambda: run_fastrl("none", seeds, args.steps, args.eval_episodes, args.compile,
                                           args.stop_at_return),
        "sb3-contrib": lambda: [run_sb3_contrib(s, args.sb3_steps, args.eval_episodes)
                                for s in seeds[:args.sb3_seeds or args.n_seeds]],
    }
    names = [name for name in args.libs.split(",") if name]
    unknown = sorted(set(names) - set(contenders))
    if unknown:
        parser.error(f"unknown --libs {unknown}; choose from {sorted(contenders)}")
    machine = machine_info()  # before the runs: its load_average_at_start is the quiet machine's
    runs = {name: contenders[name]() for name in names}
    report = {"question": __doc__.splitlines()[0], "env": ENV_ID, "target": TARGET, "args": vars(args),
              "config": CONFIG.read_text(), "zoo_ppo_lstm": ZOO_PPO_LSTM, "machine": machine,
              "versions": {lib: package_version(lib) for lib in ("sb3-contrib", "stable-baselines3", "envpool")},
              "results": {name: summarize(value) for name, value in runs.items()}}
    write_json(report, args.out)
    print(markdown_table(["contender", "median eval return", "median wall s", f"seeds >= {TARGET:.0f}"],
                         [[name, f"{r['median_eval_return']:.1f}", f"{r['median_wall_s']:.1f}",
                           f"{r['seeds_at_target']}/{len(r['runs'])}"] for name, r in report["results"].items()]))
    return report


if __name__ == "__main__":
    main()

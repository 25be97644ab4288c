"""What does one rollout step cost with EnvPool: eager against compiled, with the env step outside the graph or
inside it as a ``torch.library`` custom op? (``env_backend: torch`` runs a whole iteration as one function, rollout
and update together: ``python -m benchmarks.iteration`` measures it.)

    python -m benchmarks.rollout_step [--quick] [--n-envs N ...] [--steps T] [--repeats R] [--out PATH]

CartPole-v1, the default 64x64 tanh actor-critic, 1 torch thread. Microseconds per rollout step (one policy forward,
sampling, the env step and the buffer writes for all ``n_envs`` envs), the median of interleaved repetitions of a
``T``-step ``collect()`` (the bootstrap forward included, once per T steps). Contenders:

- ``eager``: ``Trainer.collect()`` with ``compile off``, EnvPool.
- ``compiled``: ``compile default``: ``fastrl.run.rollout.CompiledRolloutStep`` (forward, sampling, writes in one graph)
  and EnvPool's step as one call outside it (what fastrl runs).
- ``custom-op``: the same graph with the EnvPool step inside it, as a ``torch.library.custom_op`` (a Python-backed
  op, opaque to inductor: the graph splits around it), writing the env's outputs in the graph too.

Compiled contenders are warmed (two collects) before timing, in the trainers' guard-skipping stance from the second
collect on. JSON goes to benchmarks/results/<machine-tag>/rollout_step.json; a table is printed.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import default_out, interleaved, machine_info, markdown_table, write_json
from fastrl.config import make_config
from fastrl.run.compile import skip_guards
from fastrl.run.trainer import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", eval_episodes=0)
CONTENDERS = ("eager", "compiled", "custom-op")

_ENVS: dict = {}  # custom-op handle -> env (a custom op takes tensors and numbers, not Python objects)


def _register_env_op():
    """``fastrl_bench::env_step(action, handle) -> (obs, reward, terminated, truncated, done, valid)``."""
    if hasattr(_register_env_op, "op"):
        return _register_env_op.op

    @torch.library.custom_op("fastrl_bench::env_step", mutates_args=())
    def env_step(action: torch.Tensor, handle: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                             torch.Tensor, torch.Tensor]:
        step = _ENVS[handle].step(action)
        return (step.observation.clone(), step.reward.clone(), step.terminated.clone(), step.truncated.clone(),
                step.done.clone(), step.valid.clone())

    @env_step.register_fake
    def _(action, handle):
        env = _ENVS[handle]
        n = action.shape[0]
        flag = action.new_empty(n, dtype=torch.bool)
        return (action.new_empty(n, *env.observation_shape, dtype=env.observation_dtype),
                action.new_empty(n, dtype=torch.float32), flag, flag.clone(), flag.clone(), flag.clone())

    _register_env_op.op = env_step
    return env_step


class CustomOpCollect:
    """A trainer's rollout with the env step inside the compiled graph as a custom op (see the module docstring)."""

    def __init__(self, trainer):
        self.trainer = trainer
        op = _register_env_op()
        handle = len(_ENVS)
        _ENVS[handle] = trainer.env
        policy, views = trainer.policy, trainer.rollout_step.views
        self.draw_noise = trainer.rollout_step.draw_noise

        def step(obs, noise, *rows):
            row_obs, row_action, row_logp, row_value, row_reward, row_term, row_trunc, row_done, row_valid = rows
            action, logp, _, value = policy.get_action_and_value(obs, None, noise)
            row_obs.copy_(obs)
            row_action.copy_(action)
            row_logp.copy_(logp)
            row_value.copy_(value)
            next_obs, reward, terminated, truncated, done, valid = op(action, handle)
            row_reward.copy_(reward)
            row_term.copy_(terminated)
            row_trunc.copy_(truncated)
            row_done.copy_(done)
            row_valid.copy_(valid)
            return next_obs

        self.fn = torch.compile(step, fullgraph=True, dynamic=False)
        self.rows = [(views.observation[t], views.action[t], views.sample_log_prob[t], views.state_value[t],
                      views.reward[t], views.terminated[t], views.truncated[t], views.done[t], views.valid[t])
                     for t in range(views.action.shape[0])]

    def collect(self):
        tr = self.trainer
        with torch.no_grad():
            obs = tr.next_obs
            for t in range(tr.cfg.n_steps):
                obs = self.fn(obs, self.draw_noise(), *self.rows[t])
            tr._finish_rollout(obs)


def build(name: str, n_envs: int, steps: int):
    """A ``collect()`` callable for contender ``name`` and the trainer to close."""
    compiled = name in ("compiled", "custom-op")
    cfg = make_config(dict(env="CartPole-v1", n_envs=n_envs, n_steps=steps, total_steps=n_envs * steps * 1000,
                           compile="default" if compiled else "off", env_backend="envpool", torch_threads=1,
                           **QUIET))
    trainer = Trainer(cfg)
    collect = trainer.collect
    if name == "custom-op":
        custom = CustomOpCollect(trainer)
        collect = custom.collect
    collect()  # compiles
    trainer.iteration = 1  # the trainers skip guard evaluation from their second iteration on

    def warm_collect():
        with skip_guards(compiled):
            collect()
    warm_collect()

    def timed() -> float:
        start = time.perf_counter()
        warm_collect()
        return time.perf_counter() - start
    return timed, trainer


def bench(n_envs: int, steps: int, repeats: int, names=CONTENDERS) -> dict:
    torch._dynamo.reset()  # each n_envs compiles afresh, static shapes (no graph shared with the last case)
    timers, trainers = {}, []
    for name in names:
        timers[name], trainer = build(name, n_envs, steps)
        trainers.append(trainer)
    samples = interleaved(timers, repeats)
    for trainer in trainers:
        trainer.close()
    us = {name: statistics.median(s) / steps * 1e6 for name, s in samples.items()}
    return {"n_envs": n_envs, "steps": steps, "us_per_step": us,
            "samples_us": {name: [x / steps * 1e6 for x in s] for name, s in samples.items()},
            "speedup_over_eager": {name: us["eager"] / v for name, v in us.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout_step", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n_envs 1 and 32, fewer repeats (a smoke run)")
    parser.add_argument("--n-envs", type=int, nargs="+", default=None, help="default 1 5 32 (quick: 1 32)")
    parser.add_argument("--steps", type=int, default=128, help="rollout length T per timed collect")
    parser.add_argument("--repeats", type=int, default=None, help="timed collects per contender (default 9, quick 3)")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS,
                        help="a subset of the contenders (eager is always timed: the ratios are over it)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/rollout_step.json)")
    args = parser.parse_args(argv)
    names = ["eager"] + [name for name in args.contenders if name != "eager"]
    torch.set_num_threads(1)
    n_envs = args.n_envs or ([1, 32] if args.quick else [1, 5, 32])
    repeats = args.repeats or (3 if args.quick else 9)
    report = {"benchmark": "rollout_step", "quick": args.quick, "machine": machine_info(), "repeats": repeats,
              "results": [bench(n, args.steps, repeats, names) for n in n_envs]}
    report["machine"]["load_average_at_end"] = machine_info()["load_average_at_start"]
    path = write_json(report, args.out or default_out("rollout_step"))
    print(rollout_step_table(report))
    print(f"\nwrote {path}")
    return 0


def rollout_step_table(report: dict) -> str:
    names = [name for name in CONTENDERS if name in report["results"][0]["us_per_step"]]
    headers = ["n_envs"] + [f"{name} µs/step" for name in names] + [f"{name} speed-up" for name in names[1:]]
    rows = []
    for r in report["results"]:
        us, speedup = r["us_per_step"], r["speedup_over_eager"]
        rows.append([r["n_envs"]] + [round(us[name], 1) for name in names] +
                    [f"{speedup[name]:.2f}x" for name in names[1:]])
    return markdown_table(headers, rows)


if __name__ == "__main__":
    raise SystemExit(main())

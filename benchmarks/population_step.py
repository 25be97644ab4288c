"""How long does one eager minibatch step of a population take: the hand-derived gradient against autograd?

    python -m benchmarks.population_step [--members 3] [--repeats 15] [--threads 2] [--out PATH]

For K members of the 64x64 MLP actor-critic at the shapes of the zoo's eager populations, ``Update.steps`` (gather,
forward, loss, gradient, global-norm clip, Adam or RMSprop, guards, statistics) for one minibatch step, eagerly, as the
trainer runs it (``[K, P]`` weights, no vmap):

- ``hand``: the loss and gradient derived by hand (``fastrl.learn.mlp_gradient``, what the trainer runs);
- ``autograd``: the same step through autograd: at K > 1 one batched forward and one backward of the members'
  summed losses (``members_autograd``); at K = 1 (``--members 1``) autograd through the agent module whose
  parameters are views of the flat weights (the ``module`` path, a single run's step for other models).

Cases: CartPole at the zoo's PPO settings (discrete, one minibatch of 256 rows), MountainCarContinuous (Gaussian,
minibatch 256), Pendulum (gSDE, minibatch 64), A2C CartPole (8 envs x 5 steps, one step per rollout). Each contender
is timed in blocks of calls, interleaved round-robin (the order reversed every round); the figure is the median of
``--repeats`` blocks, in microseconds per step of all K members, and the ratio autograd / hand of those medians. The
machine's load average is recorded at the start and the end. glibc's thresholds are set as the trainer sets them
(``fastrl.run.allocator``). Prints a Markdown table; writes JSON only to ``--out``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import interleaved, load_average, machine_info, markdown_table, write_json
from fastrl.config import make_config
from fastrl.envs.spaces import ActionSpec
from fastrl.learn.models import ActorCritic
from fastrl.learn.stacked import FlatLayout
from fastrl.learn.update import Update, UpdateSpec, member_hparams
from fastrl.run.allocator import keep_freed_memory

# name -> (config overrides, observation size, action spec, rows per minibatch)
CASES = {
    "cartpole_zoo": (dict(algo="ppo", n_epochs=20, n_minibatches=1, clip_vloss=False), 4, ActionSpec("discrete", n=2), 256),
    "mountaincar_continuous": (dict(algo="ppo", clip_vloss=False, ent_coef=0.005), 2,
                               ActionSpec("continuous", shape=(1,), low=(-1.0,), high=(1.0,)), 256),
    "pendulum_gsde": (dict(algo="ppo", clip_vloss=False, use_sde=True), 3,
                      ActionSpec("continuous", shape=(1,), low=(-2.0,), high=(2.0,)), 64),
    "a2c_cartpole": (dict(algo="a2c", n_epochs=1, n_minibatches=1), 4, ActionSpec("discrete", n=2), 40),
}


def build(name: str, k: int, seed: int = 0):
    """The case's update, K members' weights and optimizer state, one minibatch of their own actions, and its rows."""
    overrides, obs_dim, spec, rows = CASES[name]
    cfg = make_config(dict(env="CartPole-v1", **overrides))
    agents = []
    for m in range(k):
        torch.manual_seed(seed + m)
        agents.append(ActorCritic((obs_dim,), spec, hidden_sizes=(64, 64), use_sde=cfg.use_sde))
    layout = FlatLayout(agents[0])
    params = torch.stack([layout.flatten(a) for a in agents])
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(k, rows, obs_dim, generator=gen)
    width = layout.agent.noise_width if spec.kind != "discrete" else spec.n
    with torch.no_grad():
        action, logp, _, value = layout.call_members("get_action_and_value", params, obs, None,
                                                     torch.rand(k, rows, width, generator=gen))
    noise = torch.randn(3, k, rows, generator=gen)
    batch = (obs, action, logp + 0.1 * noise[0], noise[1], value, value + noise[2],
             torch.rand(k, rows, generator=gen) > 0.05)
    index = None if cfg.algo == "a2c" else torch.stack([torch.randperm(rows, generator=gen)[None] for _ in range(k)])
    hparams = {key: value.expand(k).clone() for key, value in member_hparams(cfg, "cpu").items()}
    return UpdateSpec.of(cfg), layout, params, batch, index, hparams


def contender(name: str, k: int, hand: bool, calls: int):
    spec, layout, params, batch, index, hparams = build(name, k)
    active, epoch_ends = torch.ones(k, dtype=torch.bool), torch.ones(1, dtype=torch.bool)
    if k == 1 and not hand:  # the module path: one member's [P] weights, bound to the agent, unbatched inputs
        params, active = params[0], active[0]
        batch, hparams = tuple(t[0] for t in batch), {key: value[0] for key, value in hparams.items()}
        index = None if index is None else index[0]
        layout.bind(layout.agent, params)
        update = Update(spec, layout, path="module", agent=layout.agent)
    else:
        update = Update(spec, layout, path="members_hand" if hand else "members_autograd")  # ValueError where it can't
    opt_state = update.init_opt_state(params)

    def block() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            update.steps(params, opt_state, batch, index, hparams, active, epoch_ends)
        return (time.perf_counter() - start) / calls
    return block


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.population_step", description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=3, help="K members (default 3, the zoo's populations)")
    parser.add_argument("--repeats", type=int, default=15, help="timed blocks per contender (default 15)")
    parser.add_argument("--calls", type=int, default=100, help="steps per timed block (default 100)")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch intra-op threads (default 2: the trainer's for a population's update here)")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    if args.members < 1 or args.repeats < 1 or args.calls < 1:
        parser.error("--members, --repeats and --calls must be at least 1")
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the trainer on CPU
    report = {"benchmark": "population_step", "members": args.members, "repeats": args.repeats,
              "calls": args.calls, **machine_info(), "rows": []}
    for name in CASES:
        timers = {label: contender(name, args.members, label == "hand", args.calls) for label in ("hand", "autograd")}
        for fn in timers.values():  # warm-up: caches, the allocator, first touch
            fn()
        samples = interleaved(timers, args.repeats)
        us = {label: statistics.median(v) * 1e6 for label, v in samples.items()}
        report["rows"].append({"case": name, "hand_us": us["hand"], "autograd_us": us["autograd"],
                               "autograd_over_hand": us["autograd"] / us["hand"],
                               "samples_us": {label: [s * 1e6 for s in v] for label, v in samples.items()}})
    report["load_average_at_end"] = load_average()
    print(f"{args.members} members, {args.threads} threads, median of {args.repeats} blocks of {args.calls} steps; "
          f"load {report['load_average_at_start']} -> {report['load_average_at_end']}; code {report['code']}")
    print(markdown_table(["case", "hand µs/step", "autograd µs/step", "autograd / hand"],
                         [[r["case"], r["hand_us"], r["autograd_us"], f"{r['autograd_over_hand']:.2f}x"]
                          for r in report["rows"]]))
    if args.out:
        print(f"wrote {write_json(report, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

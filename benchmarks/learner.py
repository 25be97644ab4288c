"""How long does one PPO minibatch gradient step take: the torch.optim twin, the pure update eager and compiled?

    python -m benchmarks.learner [--quick] [--device cpu|cuda] [--threads 1] [--steps-per-call 8] [--members 4]
                                 [--no-compile-times] [--out PATH]

1. µs per minibatch gradient step (gather, forward, loss, backward, global-norm clip, Adam), the median of
   interleaved repetitions of a block of calls. Contenders, each with its own copy of the weights and optimizer state:
   - ``eager``: the torch.optim twin, CleanRL's step: the module's forward, ``kernels.ppo_loss``, backward,
     ``clip_grad_norm_`` and fused ``torch.optim.Adam`` (what fastrl ran before the pure update);
   - ``pure_eager``: ``fastrl.update.Update.steps``, one step per call, through the agent module bound to the flat
     weights (``FlatLayout.bind`` + ``update.eager_agent``: what the trainer runs with the update uncompiled);
   - ``pure_func``: the same without the bound module: ``torch.func.grad_and_value`` over ``functional_call``;
   - ``compiled``: ``Update.steps`` under one ``torch.compile(fullgraph=True)`` (inductor, ``--mode``), one step per
     call, guards evaluated; ``compiled_no_guards``: the same in the trainer's hot-loop stance
     (``fastrl.compile.skip_guards``, from its second iteration on);
   - ``compiled_k``: ``--steps-per-call`` k steps unrolled in one compiled call (8: the default update of 4 epochs x 2
     minibatches, as ``compile_plan`` gives it), guards skipped; per step = one call / k;
   - ``population``: ``--members`` K members vmapped in one compiled call of k steps each, guards skipped; per
     member-step = one call / (K k).
   Every call is shaped as the trainer's update call (``member_steps``: flat weights ``[K, P]`` and optimizer state
   written back in place), on minibatches gathered from a 2-minibatch batch by a ``minibatch_index``.
   Models: the 64x64 tanh MLP (obs 4, 2 actions) at minibatch 64, 256 and 2048; the Nature-CNN
   (``PixelActorCritic``, uint8 obs [4, 84, 84], 6 actions) at 256.
2. Compile seconds of the compiled call's first call (compile + its steps), for 1 and k steps per call, each in a
   fresh process: cold with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` in a new
   temporary folder), then warm, a second process on the same cache folder (a restart's cost).

Torch threads default to 1 (the trainer's CPU setting); the load average is recorded at the start and after each
case, since a busy machine makes both numbers meaningless. JSON goes to
benchmarks/results/<machine-tag>/learner.json; Markdown tables are printed.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.func import vmap

from benchmarks.common import (
    default_out,
    interleaved,
    load_average,
    machine_info,
    markdown_table,
    write_json,
)
from fastrl import kernels
from fastrl.compile import CompiledOrEager, skip_guards
from fastrl.config import make_config
from fastrl.envs import ActionSpec
from fastrl.models import ActorCritic, PixelActorCritic
from fastrl.stacked import FlatLayout
from fastrl.update import LOSS_KEYS, Update, UpdateSpec, epoch_end_mask, member_hparams, minibatch_index

# name -> (model, minibatch size)
CASES = {
    "mlp-64": ("mlp", 64),
    "mlp-256": ("mlp", 256),
    "mlp-2048": ("mlp", 2048),
    "cnn-256": ("nature_cnn", 256),
}
QUICK_CASES = ("mlp-64", "mlp-2048", "cnn-256")
COMPILE_PROBES = ("mlp-64", "cnn-256")
QUICK_COMPILE_PROBES = ("mlp-64",)
N_EPOCHS, N_MINIBATCHES = 4, 2  # the default update: 8 minibatch steps per rollout


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def member_steps(update: Update, n_members: int):
    """The trainer's update call (``Trainer._update_chunk``) without a trainer or an env: ``steps(params [K, P],
    opt_state, batch [K, B, ...], index [K, count, mb], hparams [K], active [K], epoch_ends [count])`` runs ``count``
    minibatch steps of each of K members (K = 1: ``Update.steps`` on member 0; else vmapped over the members, as the
    trainer compiles them) and writes the weights and optimizer state back in place. Returns ``(sums, active)``."""
    def steps(params, opt_state, batch, index, hparams, active, epoch_ends):
        def one_member(p, s, b, i, h, a):
            return update.steps(p, s, b, i, h, a, epoch_ends)
        if n_members == 1:
            new_params, new_state, sums, active = one_member(
                params[0], {k: v[0] for k, v in opt_state.items()}, tuple(x[0] for x in batch), index[0],
                {k: v[0] for k, v in hparams.items()}, active[0])
            new_params, new_state = new_params[None], {k: v[None] for k, v in new_state.items()}
        else:
            new_params, new_state, sums, active = vmap(one_member)(params, opt_state, batch, index, hparams, active)
        params.copy_(new_params)
        for key, value in new_state.items():
            opt_state[key].copy_(value)
        return sums, active
    return steps


def build(model: str, batch_size: int, device: torch.device, seed: int = 0):
    """A config, an agent, and one rollout's loss inputs (``LOSS_KEYS``, ``[N_MINIBATCHES * batch_size, ...]``, of
    the agent's own actions) with the ``[N_EPOCHS * N_MINIBATCHES, batch_size]`` minibatch rows of an update, on
    ``device``."""
    cfg = make_config(dict(env="CartPole-v1" if model == "mlp" else "Breakout-v5", ent_coef=0.01,
                           n_epochs=N_EPOCHS, n_minibatches=N_MINIBATCHES))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    rows = N_MINIBATCHES * batch_size
    if model == "mlp":
        agent = ActorCritic((4,), ActionSpec("discrete", n=2), hidden_sizes=(64, 64))
        obs = torch.randn(rows, 4, generator=gen)
    else:
        agent = PixelActorCritic((4, 84, 84), ActionSpec("discrete", n=6), model,
                                 channels_last=device.type == "cuda")
        obs = torch.randint(0, 256, (rows, 4, 84, 84), dtype=torch.uint8, generator=gen)
    agent, obs = agent.to(device), obs.to(device)
    with torch.no_grad():
        action, logp, _, value = agent.get_action_and_value(obs)
    noise = torch.randn(3, rows, generator=gen).to(device)
    valid = (torch.rand(rows, generator=gen) > 0.05).to(device)
    batch = (obs, action, logp + 0.1 * noise[0], noise[1], value, value + noise[2], valid)
    assert len(batch) == len(LOSS_KEYS)
    index = minibatch_index(rows, N_EPOCHS, N_MINIBATCHES, gen, "cpu").to(device)
    return cfg, agent, batch, index


class Members:
    """K members' flat weights ``[K, P]``, optimizer state and hyperparameters, and their batch ``[K, B, ...]`` and
    minibatch rows ``[K, n_steps, mb]`` (each member its own rows), for one compiled or eager update call."""

    def __init__(self, cfg, agent, batch: tuple, index, k: int, device: torch.device, eager_agent: bool = False,
                 mode: str = "off"):
        self.agent = copy.deepcopy(agent)
        layout = FlatLayout(self.agent)
        self.params = layout.flatten(self.agent).to(device).repeat(k, 1)
        spec = UpdateSpec.of(cfg)
        if eager_agent:  # the trainer's single uncompiled run: the module's parameters are views of params[0]
            layout.bind(self.agent, self.params[0])
            update = Update(spec, layout, path="module", agent=self.agent)
        else:  # the functional step, which member_steps vmaps over K > 1 members
            update = Update(spec, layout)
        self.opt_state = update.init_opt_state(self.params)
        self.hparams = {key: value.expand(k).clone() for key, value in member_hparams(cfg, device).items()}
        self.batch = tuple(x.expand(k, *x.shape).contiguous() for x in batch)
        self.index = torch.stack([index.roll(m, dims=0) for m in range(k)])
        self.active = torch.ones(k, dtype=torch.bool, device=device)
        self.n_members, self.n_steps = k, index.shape[0]
        if mode == "reduce-overhead" and device.type == "cuda":  # as the trainer: CUDA graphs replay fixed addresses
            for tensor in (self.params, *self.opt_state.values(), *self.hparams.values()):
                torch._dynamo.mark_static_address(tensor)
        self.call = CompiledOrEager(member_steps(update, k), mode, "the benchmarked update", fullgraph=True)
        self.first_call_s = None

    def caller(self, count: int):
        """``call(i)``: the ``i``-th call of ``count`` minibatch steps (cycling through the update's steps)."""
        firsts = list(range(0, self.n_steps, count))
        chunks = [(self.index[:, first:first + count], epoch_end_mask(first, count, N_MINIBATCHES, self.params.device))
                  for first in firsts]

        def call(i: int):
            index, epoch_ends = chunks[i % len(chunks)]
            return self.call(self.params, self.opt_state, self.batch, index, self.hparams, self.active, epoch_ends)
        return call


def torch_optim_twin(cfg, agent, batch: tuple, index):
    """``call(i)``: CleanRL's minibatch step on the module with fused Adam, on the ``i``-th minibatch's rows."""
    agent = copy.deepcopy(agent)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.lr, eps=cfg.adam_eps, fused=True)
    params = list(agent.parameters())

    def call(i: int):
        observation, action, old_logp, advantage, old_value, value_target, valid = (
            x[index[i % index.shape[0]]] for x in batch)
        _, logp, entropy, value = agent.get_action_and_value(observation, action)
        loss, _ = kernels.ppo_loss(logp.float(), old_logp, advantage, value.float(), old_value, value_target,
                                   entropy.float(), valid, clip_coef=cfg.clip_coef, vf_coef=cfg.vf_coef,
                                   ent_coef=cfg.ent_coef, clip_vloss=cfg.clip_vloss,
                                   normalize_advantage=cfg.norm_adv)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
    return call


def contenders(model: str, batch_size: int, device: torch.device, mode: str, per_call: int, k: int) -> tuple:
    """``name -> (call(i), minibatch steps per call, members, skip guards)``, and the compiled members (for their
    first-call seconds)."""
    cfg, agent, batch, index = build(model, batch_size, device)
    pure_eager = Members(cfg, agent, batch, index, 1, device, eager_agent=True)
    pure_func = Members(cfg, agent, batch, index, 1, device)
    compiled = {"compiled": Members(cfg, agent, batch, index, 1, device, mode=mode),
                "compiled_k": Members(cfg, agent, batch, index, 1, device, mode=mode)}
    if k:
        compiled["population"] = Members(cfg, agent, batch, index, k, device, mode=mode)
    one = compiled["compiled"].caller(1)
    out = {"eager": (torch_optim_twin(cfg, agent, batch, index), 1, 1, False),
           "pure_eager": (pure_eager.caller(1), 1, 1, False), "pure_func": (pure_func.caller(1), 1, 1, False),
           "compiled": (one, 1, 1, False), "compiled_no_guards": (one, 1, 1, True),
           "compiled_k": (compiled["compiled_k"].caller(per_call), per_call, 1, True)}
    if k:
        out["population"] = (compiled["population"].caller(per_call), per_call, k, True)
    for name, members in compiled.items():  # the first call compiles
        start = time.perf_counter()
        out[name][0](0)
        sync(device)
        members.first_call_s = time.perf_counter() - start
        if mode != "off" and not members.call.compiled:
            print(f"warning: {name} ({model} at {batch_size}) fell back to eager; its column times the eager call",
                  file=sys.stderr)
    return out, compiled


def timed_block(call, calls: int, device: torch.device, skip: bool):
    """Seconds per call of ``calls`` calls; ``skip``: in the trainer's guard-skipping stance."""
    def run() -> float:
        sync(device)
        with skip_guards(skip):
            start = time.perf_counter()
            for i in range(calls):
                call(i)
            sync(device)
            return (time.perf_counter() - start) / calls
    return run


def bench_case(name: str, device: torch.device, repeats: int, block_s: float, mode: str, per_call: int,
               k: int) -> dict:
    model, batch_size = CASES[name]
    fns, compiled = contenders(model, batch_size, device, mode, per_call, k)
    timers, calls_per_sample = {}, {}
    for key, (call, count, _, skip) in fns.items():
        warm_up = timed_block(call, N_EPOCHS * N_MINIBATCHES // count, device, skip)  # caches, allocator, first touch
        warm_up()
        calls_per_sample[key] = max(1, int(block_s / max(warm_up(), 1e-6)))
        timers[key] = timed_block(call, calls_per_sample[key], device, skip)
    samples = interleaved(timers, repeats)
    us = {key: [s * 1e6 / (fns[key][1] * fns[key][2]) for s in v]  # per (member-)minibatch step
          for key, v in samples.items()}
    med = {key: statistics.median(v) for key, v in us.items()}
    row = {"case": name, "model": model, "minibatch": batch_size, "repeats": repeats,
           "steps_per_call": per_call, "members": k, "calls_per_sample": calls_per_sample,
           "eager_us": med["eager"], "pure_eager_us": med["pure_eager"], "pure_func_us": med["pure_func"],
           "compiled_us": med["compiled"], "compiled_no_guards_us": med["compiled_no_guards"],
           "compiled_k_us": med["compiled_k"], "population_us": med.get("population"),
           "samples_us": us, "compiled": all(m.call.compiled for m in compiled.values()),
           "first_call_in_process_s": {key: m.first_call_s for key, m in compiled.items()},
           "load_average_after": load_average()}
    row["speedup"] = row["eager_us"] / row["compiled_us"]
    row["speedup_no_guards"] = row["eager_us"] / row["compiled_no_guards_us"]
    row["speedup_k"] = row["eager_us"] / row["compiled_k_us"]
    population = f", K={k} {row['population_us']:,.0f} µs per member-step" if k else ""
    print(f"{name}: torch.optim {row['eager_us']:,.0f} µs, pure eager {row['pure_eager_us']:,.0f}, torch.func "
          f"{row['pure_func_us']:,.0f}, compiled {row['compiled_us']:,.0f} ({row['speedup']:.2f}x), guards skipped "
          f"{row['compiled_no_guards_us']:,.0f} ({row['speedup_no_guards']:.2f}x), {per_call} per call "
          f"{row['compiled_k_us']:,.0f} ({row['speedup_k']:.2f}x){population} "
          f"({repeats} samples; load {row['load_average_after']})", flush=True)
    return row


# ---------------------------------------------------------------------------------------------- compile seconds
def compile_probe(name: str, device: str, threads: int, mode: str, per_call: int) -> dict:
    """In this (fresh) process: seconds of the compiled update call's first call (``per_call`` steps), and a second."""
    torch.set_num_threads(threads)
    model, batch_size = CASES[name]
    cfg, agent, batch, index = build(model, batch_size, torch.device(device))
    members = Members(cfg, agent, batch, index, 1, torch.device(device), mode=mode)
    call = members.caller(per_call)
    times = []
    for i in range(2):
        start = time.perf_counter()
        call(i)
        sync(torch.device(device))
        times.append(time.perf_counter() - start)
    return {"first_call_s": times[0], "second_call_s": times[1], "compiled": members.call.compiled}


def compile_times(name: str, device: torch.device, threads: int, mode: str, per_call: int) -> dict:
    """Cold (empty inductor cache) and warm (same cache, new process) first-call seconds."""
    with tempfile.TemporaryDirectory(prefix="fastrl-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        out = {}
        for label in ("cold", "warm"):
            cmd = [sys.executable, "-m", "benchmarks.learner", "--probe", name, "--device", str(device),
                   "--threads", str(threads), "--mode", mode, "--steps-per-call", str(per_call)]
            start = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            if proc.returncode != 0:
                raise RuntimeError(f"compile probe {name} ({label}) failed:\n{proc.stderr[-2000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["process_s"] = time.perf_counter() - start
            out[label] = result
    row = {"case": name, "steps_per_call": per_call, "cold_s": out["cold"]["first_call_s"],
           "warm_s": out["warm"]["first_call_s"], "cold_process_s": out["cold"]["process_s"],
           "warm_process_s": out["warm"]["process_s"], "step_after_compile_s": out["warm"]["second_call_s"],
           "compiled": out["cold"]["compiled"] and out["warm"]["compiled"], "load_average_after": load_average()}
    steps = f"{per_call} step{'s' if per_call > 1 else ''} per call"
    print(f"{name}, {steps}: compile cold {row['cold_s']:.1f} s, warm {row['warm_s']:.1f} s", flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learner", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases, repeats and compile probes (a smoke run)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--mode", default="default", help="torch.compile mode of the compiled calls")
    parser.add_argument("--steps-per-call", type=int, default=N_EPOCHS * N_MINIBATCHES,
                        help=f"minibatch steps per compiled call of compiled_k and population (default "
                             f"{N_EPOCHS * N_MINIBATCHES}, the whole default update; a divisor of it)")
    parser.add_argument("--members", type=int, default=4, help="K members of the vmapped population (0: skip it)")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per contender (default 15, quick 3)")
    parser.add_argument("--block-s", type=float, default=None,
                        help="seconds of calls per timed sample (default 0.2, quick 0.02)")
    parser.add_argument("--cases", default=None, help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--no-compile-times", action="store_true", help="skip the cold/warm compile probes")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/learner.json)")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # internal: one compile-time probe
    args = parser.parse_args(argv)
    per_call, n_steps = args.steps_per_call, N_EPOCHS * N_MINIBATCHES
    if per_call < 1 or n_steps % per_call:
        parser.error(f"--steps-per-call {per_call} does not divide the update's {n_steps} steps; pick 1, 2, 4 or 8")
    if args.members < 0:
        parser.error(f"--members {args.members} is negative; pick 0 (no population) or more")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.probe:
        print(json.dumps(compile_probe(args.probe, str(device), args.threads, args.mode, per_call)))
        return 0
    torch.set_num_threads(args.threads)
    cases = args.cases.split(",") if args.cases else list(QUICK_CASES if args.quick else CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; pick from {list(CASES)}")
    repeats = args.repeats or (3 if args.quick else 15)
    block_s = args.block_s or (0.02 if args.quick else 0.2)
    info = machine_info(device)
    rows = []
    for name in cases:
        torch._dynamo.reset()  # fresh graphs per case; keep dynamo's per-code cache from filling up
        rows.append(bench_case(name, device, repeats, block_s, args.mode, per_call, args.members))
    compile_rows = []
    if not args.no_compile_times:
        probes = QUICK_COMPILE_PROBES if args.quick else COMPILE_PROBES
        compile_rows = [compile_times(name, device, args.threads, args.mode, count)
                        for name in probes if name in cases for count in sorted({1, per_call})]
    report = {"benchmark": "learner", "quick": args.quick, "machine": info, "device": str(device), "mode": args.mode,
              "repeats": repeats, "block_s": block_s, "steps_per_call": per_call, "members": args.members,
              "results": rows, "compile": compile_rows, "load_average_at_end": load_average()}
    path = write_json(report, args.out or default_out("learner", device))
    print()
    print(markdown_table(["case", "minibatch", "torch.optim µs", "pure eager µs", "torch.func µs", "compiled µs",
                          "no guards µs", f"{per_call}/call µs", "speed-up",
                          f"K={args.members} µs/member-step" if args.members else "population (skipped)",
                          "load avg (1 min)"],
                         [[r["case"], r["minibatch"], r["eager_us"], r["pure_eager_us"], r["pure_func_us"],
                           r["compiled_us"], r["compiled_no_guards_us"], r["compiled_k_us"], f"{r['speedup_k']:.2f}x",
                           r["population_us"], (r["load_average_after"] or [None])[0]] for r in rows]))
    if compile_rows:
        print()
        print(markdown_table(["case", "steps/call", "cold compile s", "warm compile s", "cold process s",
                              "warm process s"],
                             [[r["case"], r["steps_per_call"], r["cold_s"], r["warm_s"], r["cold_process_s"],
                               r["warm_process_s"]] for r in compile_rows]))
    print(f"\nload average at start {info['load_average_at_start']}, at end {report['load_average_at_end']}"
          f"{' (QUICK: smoke numbers, not for publishing)' if args.quick else ''}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long does one PPO minibatch gradient step take: the torch.optim twin against the trainer's own update, eager
and compiled, and a population's?

    python -m benchmarks.learner [--quick] [--device cpu|cuda] [--threads 1] [--members 4] [--mode default]
                                 [--no-compile-times] [--out PATH]

1. µs per minibatch gradient step (gather, forward, loss, backward, global-norm clip, Adam), the median of
   interleaved repetitions of a block of calls. Contenders, each with its own weights and optimizer state:
   - ``eager``: the torch.optim twin, CleanRL's step: the module's forward, ``kernels.ppo_loss``, backward,
     ``clip_grad_norm_`` and fused ``torch.optim.Adam`` (what fastrl ran before the pure update), on minibatches of
     one batch of the agent's own actions;
   - ``pure_eager``: ``fastrl.run.trainer.Trainer.update()`` of a run with ``--compile off`` (the pure update through the
     bound module), per minibatch step: one call runs the GAE of its batch and all ``N_EPOCHS x N_MINIBATCHES`` steps;
   - ``compiled``: the same with ``--compile MODE`` (``--mode``): the trainer's compile plan decides the steps per
     compiled call and when guards are skipped, as in a run;
   - ``population``: ``--members`` K members (``--n-seeds K``) compiled, per member-step.
   Each trainer collects one rollout (CartPole-v1 for the MLP, Breakout-v5 for the CNN; the batch is two minibatches)
   and then updates on it again and again, its learning rate held (``anneal_lr`` off).
   Models: the 64x64 tanh MLP (obs 4, 2 actions) at minibatch 64, 256 and 2048; the Nature-CNN (uint8 obs
   [4, 84, 84], 6 actions) at 256.
2. Compile seconds of the compiled trainer's first ``update()`` (compile + its steps), each in a fresh process: cold
   with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` in a new temporary folder), then
   warm, a second process on the same cache folder (a restart's cost).

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

from benchmarks.common import (
    default_out,
    interleaved,
    load_average,
    machine_info,
    markdown_table,
    write_json,
)
from fastrl import kernels
from fastrl.config import make_config
from fastrl.learn.update import minibatch_index
from fastrl.run.trainer import Trainer

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
N_EPOCHS, N_MINIBATCHES, N_STEPS = 4, 2, 32  # the default update: 8 minibatch steps per rollout of 32 steps


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trainer_for(name: str, device: torch.device, threads: int, mode: str, members: int = 1) -> Trainer:
    """A real trainer for case ``name`` (``N_MINIBATCHES`` minibatches of the case's size per rollout) that has
    collected one rollout, ready for ``update()``."""
    model, batch_size = CASES[name]
    rows = N_MINIBATCHES * batch_size
    cfg = make_config(dict(env="CartPole-v1" if model == "mlp" else "Breakout-v5", n_envs=rows // N_STEPS,
                           n_steps=N_STEPS, n_epochs=N_EPOCHS, n_minibatches=N_MINIBATCHES, ent_coef=0.01,
                           anneal_lr=False, compile=mode, n_seeds=members, device=str(device),
                           torch_threads=threads, total_steps=rows * 1000, seed=1))
    trainer = Trainer(cfg, device=device)
    trainer.collect()
    return trainer


def torch_optim_twin(trainer: Trainer, seed: int = 0):
    """``call(i)``: CleanRL's minibatch step with fused Adam on a copy of the trainer's agent, on the ``i``-th
    minibatch of one batch (``[N_MINIBATCHES * batch_size]`` rows of the agent's own actions)."""
    cfg, device = trainer.cfg, trainer.device
    agent = copy.deepcopy(trainer.agent)
    gen = torch.Generator().manual_seed(seed)
    rows = trainer.n_envs * cfg.n_steps
    observation = trainer.buffer["observation"].reshape(rows, *trainer.env.observation_shape).to(device)
    with torch.no_grad():
        action, logp, _, value = agent.get_action_and_value(observation)
    noise = torch.randn(3, rows, generator=gen).to(device)
    valid = (torch.rand(rows, generator=gen) > 0.05).to(device)
    batch = (observation, action, logp + 0.1 * noise[0], noise[1], value, value + noise[2], valid)
    index = minibatch_index(rows, N_EPOCHS, N_MINIBATCHES, gen, "cpu").to(device)
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


def contenders(name: str, device: torch.device, threads: int, mode: str, k: int) -> tuple:
    """``name -> (call(i), minibatch steps per call, members)``, and the compiled trainers' first-update seconds."""
    eager = trainer_for(name, device, threads, "off")
    trainers = {"pure_eager": eager, "compiled": trainer_for(name, device, threads, mode)}
    if k:
        trainers["population"] = trainer_for(name, device, threads, mode, k)
    out = {"eager": (torch_optim_twin(eager), 1, 1)}
    first_update_s = {}
    for key, trainer in trainers.items():
        out[key] = (lambda i, trainer=trainer: trainer.update(), N_EPOCHS * N_MINIBATCHES, trainer.n_members)
        if key != "pure_eager":  # the first update compiles
            start = time.perf_counter()
            trainer.update()
            sync(device)
            first_update_s[key] = time.perf_counter() - start
    return out, first_update_s


def timed_block(call, calls: int, device: torch.device):
    """Seconds per call of ``calls`` calls."""
    def run() -> float:
        sync(device)
        start = time.perf_counter()
        for i in range(calls):
            call(i)
        sync(device)
        return (time.perf_counter() - start) / calls
    return run


def bench_case(name: str, device: torch.device, threads: int, repeats: int, block_s: float, mode: str,
               k: int) -> dict:
    model, batch_size = CASES[name]
    fns, first_update_s = contenders(name, device, threads, mode, k)
    timers, calls_per_sample = {}, {}
    for key, (call, count, _) in fns.items():
        warm_up = timed_block(call, max(1, N_EPOCHS * N_MINIBATCHES // count), device)  # caches, allocator
        warm_up()
        calls_per_sample[key] = max(1, int(block_s / max(warm_up(), 1e-6)))
        timers[key] = timed_block(call, calls_per_sample[key], device)
    samples = interleaved(timers, repeats)
    us = {key: [s * 1e6 / (fns[key][1] * fns[key][2]) for s in v]  # per (member-)minibatch step
          for key, v in samples.items()}
    med = {key: statistics.median(v) for key, v in us.items()}
    row = {"case": name, "model": model, "minibatch": batch_size, "repeats": repeats, "members": k,
           "calls_per_sample": calls_per_sample, "eager_us": med["eager"], "pure_eager_us": med["pure_eager"],
           "compiled_us": med["compiled"], "population_us": med.get("population"), "samples_us": us,
           "first_update_in_process_s": first_update_s, "load_average_after": load_average()}
    row["speedup"] = row["eager_us"] / row["compiled_us"]
    population = f", K={k} {row['population_us']:,.0f} µs per member-step" if k else ""
    print(f"{name}: torch.optim {row['eager_us']:,.0f} µs, trainer eager {row['pure_eager_us']:,.0f}, trainer "
          f"compiled {row['compiled_us']:,.0f} ({row['speedup']:.2f}x){population} "
          f"({repeats} samples; load {row['load_average_after']})", flush=True)
    return row


# ---------------------------------------------------------------------------------------------- compile seconds
def compile_probe(name: str, device: str, threads: int, mode: str) -> dict:
    """In this (fresh) process: seconds of the compiled trainer's first ``update()``, and of a second."""
    torch.set_num_threads(threads)
    trainer = trainer_for(name, torch.device(device), threads, mode)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        trainer.update()
        sync(torch.device(device))
        times.append(time.perf_counter() - start)
    return {"first_call_s": times[0], "second_call_s": times[1]}


def compile_times(name: str, device: torch.device, threads: int, mode: str) -> dict:
    """Cold (empty inductor cache) and warm (same cache, new process) first-update seconds."""
    with tempfile.TemporaryDirectory(prefix="fastrl-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        out = {}
        for label in ("cold", "warm"):
            cmd = [sys.executable, "-m", "benchmarks.learner", "--probe", name, "--device", str(device),
                   "--threads", str(threads), "--mode", mode]
            start = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            if proc.returncode != 0:
                raise RuntimeError(f"compile probe {name} ({label}) failed:\n{proc.stderr[-2000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["process_s"] = time.perf_counter() - start
            out[label] = result
    row = {"case": name, "cold_s": out["cold"]["first_call_s"], "warm_s": out["warm"]["first_call_s"],
           "cold_process_s": out["cold"]["process_s"], "warm_process_s": out["warm"]["process_s"],
           "update_after_compile_s": out["warm"]["second_call_s"], "load_average_after": load_average()}
    print(f"{name}: first update cold {row['cold_s']:.1f} s, warm {row['warm_s']:.1f} s", flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learner", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases, repeats and compile probes (a smoke run)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--mode", default="default", help="the compiled trainers' --compile (default, "
                                                          "reduce-overhead, max-autotune; off: all eager)")
    parser.add_argument("--members", type=int, default=4, help="K members of the population trainer (0: skip it)")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per contender (default 15, quick 3)")
    parser.add_argument("--block-s", type=float, default=None,
                        help="seconds of calls per timed sample (default 0.2, quick 0.02)")
    parser.add_argument("--cases", default=None, help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--no-compile-times", action="store_true", help="skip the cold/warm compile probes")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/learner.json)")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # internal: one compile-time probe
    args = parser.parse_args(argv)
    if args.members < 0:
        parser.error(f"--members {args.members} is negative; pick 0 (no population) or more")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.probe:
        print(json.dumps(compile_probe(args.probe, str(device), args.threads, args.mode)))
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
        rows.append(bench_case(name, device, args.threads, repeats, block_s, args.mode, args.members))
    compile_rows = []
    if not args.no_compile_times and args.mode != "off":
        probes = QUICK_COMPILE_PROBES if args.quick else COMPILE_PROBES
        compile_rows = [compile_times(name, device, args.threads, args.mode) for name in probes if name in cases]
    report = {"benchmark": "learner", "quick": args.quick, "machine": info, "device": str(device), "mode": args.mode,
              "repeats": repeats, "block_s": block_s, "members": args.members, "results": rows,
              "compile": compile_rows, "load_average_at_end": load_average()}
    path = write_json(report, args.out or default_out("learner", device))
    print()
    print(markdown_table(["case", "minibatch", "torch.optim µs", "trainer eager µs", "trainer compiled µs",
                          "speed-up", f"K={args.members} µs/member-step" if args.members else "population (skipped)",
                          "load avg (1 min)"],
                         [[r["case"], r["minibatch"], r["eager_us"], r["pure_eager_us"], r["compiled_us"],
                           f"{r['speedup']:.2f}x", r["population_us"], (r["load_average_after"] or [None])[0]]
                          for r in rows]))
    if compile_rows:
        print()
        print(markdown_table(["case", "cold compile s", "warm compile s", "cold process s", "warm process s"],
                             [[r["case"], r["cold_s"], r["warm_s"], r["cold_process_s"], r["warm_process_s"]]
                              for r in compile_rows]))
    print(f"\nload average at start {info['load_average_at_start']}, at end {report['load_average_at_end']}"
          f"{' (QUICK: smoke numbers, not for publishing)' if args.quick else ''}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

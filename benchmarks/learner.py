"""How long does one PPO gradient step take: the eager step against ``fastrl.learner.CompiledUpdate``?

    python -m benchmarks.learner [--quick] [--device cpu|cuda] [--threads 1] [--no-compile-times] [--out PATH]

1. µs per gradient step on one minibatch (forward, loss, backward, global-norm clip, Adam), median of
   interleaved repetitions of a block of steps: eager = ``ppo_loss_terms`` + ``backward_step`` with fused Adam
   (today's default), compiled = ``CompiledUpdate`` (one ``torch.compile`` graph, inductor, mode default).
   Models: the 64x64 tanh MLP (obs 4, 2 actions) at minibatch 64, 256 and 2048; the Nature-CNN
   (``PixelActorCritic``, uint8 obs [4, 84, 84], 6 actions) at 256.
2. Compile seconds of ``CompiledUpdate``'s first call (compile + one step), each in a fresh process: cold with an
   empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` in a new temporary folder), then
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
from fastrl.amp import backward_step, make_optimizer
from fastrl.config import make_config
from fastrl.envs import ActionSpec
from fastrl.learner import CompiledUpdate
from fastrl.models import ActorCritic, PixelActorCritic
from fastrl.ppo import ppo_loss_terms

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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(model: str, batch_size: int, device: torch.device, seed: int = 0):
    """A config, an agent and four minibatches (``LOSS_KEYS`` order) of its own actions, on ``device``."""
    cfg = make_config(dict(env="CartPole-v1" if model == "mlp" else "Breakout-v5", ent_coef=0.01))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if model == "mlp":
        agent = ActorCritic((4,), ActionSpec("discrete", n=2), hidden_sizes=(64, 64))
        obs_shape, obs_dtype = (4,), torch.float32
    else:
        agent = PixelActorCritic((4, 84, 84), ActionSpec("discrete", n=6), model,
                                 channels_last=device.type == "cuda")
        obs_shape, obs_dtype = (4, 84, 84), torch.uint8

    def make_obs():
        if obs_dtype == torch.uint8:
            return torch.randint(0, 256, (batch_size, *obs_shape), dtype=torch.uint8, generator=gen)
        return torch.randn(batch_size, *obs_shape, generator=gen)

    agent = agent.to(device)
    minibatches = []
    for _ in range(4):
        obs = make_obs().to(device)
        with torch.no_grad():
            action, logp, _, value = agent.get_action_and_value(obs)
        noise = torch.randn(3, batch_size, generator=gen).to(device)
        valid = (torch.rand(batch_size, generator=gen) > 0.05).to(device)
        minibatches.append((obs, action, logp + 0.1 * noise[0], noise[1], value, value + noise[2], valid))
    return cfg, agent, minibatches


def contenders(model: str, batch_size: int, device: torch.device, mode: str):
    """``name -> step(minibatch)`` for eager and compiled, each with its own copy of the agent and optimizer;
    plus the compiled step's first-call seconds in this process."""
    cfg, agent, minibatches = build(model, batch_size, device)
    eager_agent, compiled_agent = agent, copy.deepcopy(agent)
    eager_opt = make_optimizer(cfg, eager_agent.parameters())
    eager_params = list(eager_agent.parameters())

    def eager(batch):
        loss, _ = ppo_loss_terms(eager_agent, cfg, *batch)
        backward_step(loss, eager_opt, eager_params, cfg.max_grad_norm)

    update = CompiledUpdate(compiled_agent, make_optimizer(cfg, compiled_agent.parameters()), cfg, "ppo", mode=mode)
    start = time.perf_counter()
    update(*minibatches[0])
    sync(device)
    first_call_s = time.perf_counter() - start
    if mode != "off" and not update.compiled:
        print(f"warning: {model} at {batch_size} fell back to eager; the compiled column times the eager "
              "functional step", file=sys.stderr)
    return ({"eager": eager, "compiled": lambda batch: update(*batch), "compiled_no_guards": lambda batch: update(*batch)},
            minibatches, first_call_s, update.compiled)


def timed_block(step, minibatches, steps: int, device: torch.device, skip_guards: bool = False):
    """``skip_guards``: the block runs in the stance the trainers' hot loops use from their second iteration on
    (``fastrl.rollout.skip_guards``: compiled functions skip guard evaluation)."""
    from fastrl.rollout import skip_guards as stance

    def run() -> float:
        sync(device)
        with stance(skip_guards):
            start = time.perf_counter()
            for i in range(steps):
                step(minibatches[i % len(minibatches)])
            sync(device)
            return (time.perf_counter() - start) / steps
    return run


def bench_case(name: str, device: torch.device, repeats: int, block_s: float, mode: str) -> dict:
    model, batch_size = CASES[name]
    steps_fns, minibatches, first_call_s, compiled = contenders(model, batch_size, device, mode)
    for step in steps_fns.values():  # warm-up: caches, allocator, first-touch
        for batch in minibatches:
            step(batch)
    sync(device)
    probe = timed_block(steps_fns["eager"], minibatches, 3, device)()
    steps = max(1, int(block_s / max(probe, 1e-6)))
    samples = interleaved({k: timed_block(fn, minibatches, steps, device, skip_guards=k == "compiled_no_guards")
                           for k, fn in steps_fns.items()}, repeats)
    us = {k: [s * 1e6 for s in v] for k, v in samples.items()}
    row = {"case": name, "model": model, "minibatch": batch_size, "steps_per_sample": steps, "repeats": repeats,
           "eager_us": statistics.median(us["eager"]), "compiled_us": statistics.median(us["compiled"]),
           "compiled_no_guards_us": statistics.median(us["compiled_no_guards"]),
           "samples_us": us, "compiled": compiled, "first_call_in_process_s": first_call_s,
           "load_average_after": load_average()}
    row["speedup"] = row["eager_us"] / row["compiled_us"]
    row["speedup_no_guards"] = row["eager_us"] / row["compiled_no_guards_us"]
    print(f"{name}: eager {row['eager_us']:,.0f} µs, compiled {row['compiled_us']:,.0f} µs "
          f"({row['speedup']:.2f}x), guards skipped {row['compiled_no_guards_us']:,.0f} µs "
          f"({row['speedup_no_guards']:.2f}x; {steps} steps x {repeats}; load {row['load_average_after']})", flush=True)
    return row


# ---------------------------------------------------------------------------------------------- compile seconds
def compile_probe(name: str, device: str, threads: int, mode: str) -> dict:
    """In this (fresh) process: seconds of ``CompiledUpdate``'s first call, and of a second one."""
    torch.set_num_threads(threads)
    model, batch_size = CASES[name]
    cfg, agent, minibatches = build(model, batch_size, torch.device(device))
    update = CompiledUpdate(agent, make_optimizer(cfg, agent.parameters()), cfg, "ppo", mode=mode)
    times = []
    for batch in minibatches[:2]:
        start = time.perf_counter()
        update(*batch)
        sync(torch.device(device))
        times.append(time.perf_counter() - start)
    return {"first_call_s": times[0], "second_call_s": times[1], "compiled": update.compiled}


def compile_times(name: str, device: torch.device, threads: int, mode: str) -> dict:
    """Cold (empty inductor cache) and warm (same cache, new process) first-call seconds."""
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
           "step_after_compile_s": out["warm"]["second_call_s"],
           "compiled": out["cold"]["compiled"] and out["warm"]["compiled"], "load_average_after": load_average()}
    print(f"{name}: compile cold {row['cold_s']:.1f} s, warm {row['warm_s']:.1f} s", flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learner", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases, repeats and compile probes (a smoke run)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--mode", default="default", help="torch.compile mode of the compiled step")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per contender (default 15, quick 3)")
    parser.add_argument("--block-s", type=float, default=None,
                        help="seconds of steps per timed sample (default 0.2, quick 0.02)")
    parser.add_argument("--cases", default=None, help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--no-compile-times", action="store_true", help="skip the cold/warm compile probes")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/learner.json)")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # internal: one compile-time probe
    args = parser.parse_args(argv)
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
        torch._dynamo.reset()  # one CompiledUpdate per case; keep dynamo's per-code cache from filling up
        rows.append(bench_case(name, device, repeats, block_s, args.mode))
    compile_rows = []
    if not args.no_compile_times:
        probes = QUICK_COMPILE_PROBES if args.quick else COMPILE_PROBES
        compile_rows = [compile_times(name, device, args.threads, args.mode) for name in probes if name in cases]
    report = {"benchmark": "learner", "quick": args.quick, "machine": info, "device": str(device), "mode": args.mode,
              "repeats": repeats, "block_s": block_s, "results": rows, "compile": compile_rows,
              "load_average_at_end": load_average()}
    path = write_json(report, args.out or default_out("learner", device))
    print()
    print(markdown_table(["case", "minibatch", "eager µs/step", "compiled µs/step", "speed-up", "load avg (1 min)"],
                         [[r["case"], r["minibatch"], r["eager_us"], r["compiled_us"], f"{r['speedup']:.2f}x",
                           (r["load_average_after"] or [None])[0]] for r in rows]))
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

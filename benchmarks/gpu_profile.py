"""One-GPU profile: kernels against the device's bandwidth, PPO on Atari and CartPole eager / compiled / CUDA graphs.

    python -m benchmarks.gpu_profile [--dry-run] [--budget-s S] [--out PATH]     (also: fastrl bench --profile gpu)
    python -m benchmarks.gpu_profile --modes cudagraphs --atari-n-envs 256 --no-kernels    (a re-check of some rows)

1. Kernels: ``kernels.gae``, ``kernels.vtrace`` and ``kernels.ppo_loss`` (forward + backward), the Triton backend
   against the torch backend (gae/vtrace: the loop twin; ppo_loss: composed torch ops), at several sizes: median
   µs per call and GB/s over the bytes that must move (each input read once, each output written once), as a
   fraction of the device's peak memory bandwidth (``get_device_properties``: 2 x memory clock x bus width, else
   ``KNOWN_BANDWIDTH_GBPS`` by name) and of a measured device-to-device copy.
2. PPO on Breakout-v5 (EnvPool, Nature-CNN, configs/ppo/atari.yaml), end to end (``collect(); update()``): eager,
   compiled (``compile: default``) and compiled + CUDA graphs (``compile: reduce-overhead``), bf16 off and on, 64
   and 256 envs; env steps/s over a fixed number of iterations after the warm-up (which includes compiling). The
   minibatch size is the same at every n_envs, so the update graph compiles to the same shapes.
3. PPO on CartPole-v1 (configs/ppo/cartpole.yaml): env steps/s eager, compiled and compiled + CUDA graphs.
4. The whole iteration as one function (``fastrl.run.iteration``: rollout, GAE and every minibatch step) on the
   torch-native CartPole at PureJaxRL's config (configs/ppo/cartpole_purejaxrl.yaml), 4 and 2,048 envs: eager,
   compiled, and compiled + CUDA graphs (one graph replay per iteration).

The whole run keeps to ``--budget-s`` (default 450 s, under 8 minutes with start-up): a variant that would not fit
in what is left is skipped with the reason recorded, as is one that fails (its error's first line); the rest go on.

``--dry-run``: the same code on CPU with tiny sizes, in under a minute (CI's smoke test). CUDA-only variants are
skipped with a recorded reason, Triton runs only under ``TRITON_INTERPRET=1``, and the compiled variants trace with
dynamo's ``eager`` backend (the same graphs, no inductor code generation, which takes minutes on a small CPU).
Writes JSON to ``benchmarks/results/<machine-tag>/gpu_profile.json`` (a dry run: ``gpu_profile_dry_run.json``) and
prints a Markdown summary.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import default_out, machine_info, markdown_table, write_json

REPO = Path(__file__).resolve().parent.parent
QUIET = dict(progress=False, tensorboard=False, wandb="disabled", eval_episodes=0, checkpoint_interval=0,
             total_steps=10**9, stop_at_return=0.0)

# Peak DRAM bandwidth (GB/s) by device name, for when get_device_properties has no memory clock or bus width. The
# longest key contained in the lower-cased name wins.
KNOWN_BANDWIDTH_GBPS = {
    "h200": 4800, "gh200": 4000, "h100 nvl": 3900, "h100 80gb hbm3": 3350, "h100 sxm": 3350, "h100 pcie": 2000,
    "h100": 3350, "a100-sxm4-80gb": 2039, "a100 80gb pcie": 1935, "a100-sxm4-40gb": 1555, "a100-pcie-40gb": 1555,
    "a100": 1555, "l40s": 864, "l40": 864, "l4": 300, "a10g": 600, "a10": 600, "v100": 900, "t4": 320,
    "rtx 4090": 1008, "rtx 3090": 936,
}

# (mode name, compile setting); CUDA graphs need CUDA.
COMPILE_MODES = [("eager", "off"), ("compiled", "default"), ("cudagraphs", "reduce-overhead")]
MODE_NAMES = tuple(name for name, _ in COMPILE_MODES)
CUDA_ONLY = {"cudagraphs": "CUDA graphs need a CUDA device"}
# Seconds a variant needs (warm-up with a cold compile included) to be started: the budget check.
NEEDS_S = {"eager": 20.0, "compiled": 100.0, "cudagraphs": 100.0}


@contextlib.contextmanager
def trace_only_compile():
    """Within: ``torch.compile`` uses dynamo's ``eager`` backend (the graphs are traced, nothing is generated)."""
    real = torch.compile

    def compile_traced(fn=None, *, mode=None, **kwargs):
        kwargs.pop("options", None)
        return real(fn, backend="eager", **kwargs)
    torch.compile = compile_traced
    try:
        yield
    finally:
        torch.compile = real


class Budget:
    """Seconds left of the run's budget; ``fits(s)`` says whether a step of ``s`` seconds still does."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def fits(self, needed: float) -> bool:
        return self.left() >= needed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip() or '?').splitlines()[0][:300]}"


# ---------------------------------------------------------------------------------------------- bandwidth
def bandwidth_from_properties(memory_clock_khz: int, memory_bus_bits: int) -> float | None:
    """Peak DRAM GB/s from the memory clock (kHz, as CUDA reports it) and bus width (bits): two transfers a clock."""
    if not memory_clock_khz or not memory_bus_bits:
        return None
    return 2 * memory_clock_khz * 1e3 * memory_bus_bits / 8 / 1e9


def known_bandwidth(device_name: str) -> float | None:
    name = device_name.lower()
    matches = [key for key in KNOWN_BANDWIDTH_GBPS if key in name]
    return KNOWN_BANDWIDTH_GBPS[max(matches, key=len)] if matches else None


def device_bandwidth(device: torch.device) -> dict:
    """``{"gbps", "source"}``: the device's peak memory bandwidth and where the figure came from."""
    if device.type != "cuda":
        return {"gbps": None, "source": "no CUDA device: the measured copy bandwidth is the reference"}
    props = torch.cuda.get_device_properties(device)
    gbps = bandwidth_from_properties(getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0))
    if gbps is not None:
        return {"gbps": gbps, "source": "get_device_properties: 2 x memory_clock_rate x memory_bus_width"}
    gbps = known_bandwidth(props.name)
    return {"gbps": gbps, "source": f"KNOWN_BANDWIDTH_GBPS[{props.name!r}]" if gbps else f"unknown for {props.name}"}


# ---------------------------------------------------------------------------------------------- kernels
# Bytes per element that must move. gae: reward, value, next_value, done, terminated in; advantage, target out.
# vtrace: + behavior_logp, target_logp in. ppo_loss forward + backward: new_logp, old_logp, advantage, new_value,
# old_value, value_target, entropy (float32) and valid (bool) in; gradients of new_logp, new_value, entropy out.
LOSS_BYTES = 7 * 4 + 1 + 3 * 4


def _loss_inputs(n: int, device: torch.device, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    r = lambda: torch.randn(n, generator=g)
    new_logp, new_value = r(), r()
    tensors = [new_logp, new_logp + 0.3 * r(), r(), new_value, new_value + 0.3 * r(), r(), r().abs(),
               torch.rand(n, generator=g) < 0.9]
    out = [t.to(device) for t in tensors]
    for i in (0, 3, 6):  # new_logp, new_value, entropy
        out[i].requires_grad_()
    return out


def kernel_contenders(T: int, N: int, device: torch.device, backends: list) -> dict:
    """``(kernel, backend) -> (bytes moved per call, fn)`` at one shape, every backend on the same inputs."""
    from benchmarks.kernels import GAE_BYTES, VTRACE_BYTES, inputs
    from fastrl import kernels
    x = inputs(T, N, device)
    gae_args = (x["reward"], x["value"], x["next_value"], x["done"], x["terminated"])
    vtrace_args = (x["behavior_logp"], x["target_logp"], *gae_args)
    loss_args = _loss_inputs(T * N, device)
    wrt = [loss_args[i] for i in (0, 3, 6)]

    def loss_step(backend):
        loss, _ = kernels.ppo_loss(*loss_args, 0.2, 0.5, 0.01, backend=backend)
        return torch.autograd.grad(loss, wrt)
    out = {}
    for b in backends:
        out[("gae", b)] = (T * N * GAE_BYTES, lambda b=b: kernels.gae(*gae_args, 0.99, 0.95, backend=b))
        out[("vtrace", b)] = (T * N * VTRACE_BYTES, lambda b=b: kernels.vtrace(*vtrace_args, 0.99, backend=b))
        out[("ppo_loss fwd+bwd", b)] = (T * N * LOSS_BYTES, lambda b=b: loss_step(b))
    return out


def bench_kernels(device: torch.device, shapes: list, timing_s: float, min_reps: int, bandwidth: dict,
                  copy_gbps: float) -> tuple[list, dict]:
    from fastrl.kernels._backend import interpreting, triton_available

    from benchmarks.kernels import median_seconds
    backends, skipped = ["torch"], {}
    if not triton_available():
        skipped["triton"] = "the triton package is not installed"
    elif device.type == "cuda" or interpreting():
        backends.insert(0, "triton")
    else:
        skipped["triton"] = "Triton needs a CUDA device (or TRITON_INTERPRET=1 to interpret it on CPU)"
    rows = []
    for T, N in shapes:
        for (kernel, backend), (nbytes, fn) in kernel_contenders(T, N, device, backends).items():
            seconds = median_seconds(fn, device, timing_s, min_reps=min_reps, warmup=1)
            gbps = nbytes / seconds / 1e9
            rows.append({"kernel": kernel, "backend": backend, "T": T, "N": N, "us": seconds * 1e6, "gbps": gbps,
                         "of_peak": gbps / bandwidth["gbps"] if bandwidth["gbps"] else None,
                         "of_copy": gbps / copy_gbps})
    for row in rows:
        torch_row = next(r for r in rows if (r["kernel"], r["T"], r["N"], r["backend"]) ==
                         (row["kernel"], row["T"], row["N"], "torch"))
        row["speedup_vs_torch"] = torch_row["us"] / row["us"]
    return rows, skipped


# ---------------------------------------------------------------------------------------------- end to end
def rollout_compiled(trainer) -> bool:
    """Whether the rollout's policy step runs compiled: the whole iteration's function (env_backend torch),
    ``CompiledRolloutStep`` (CPU, sync envs) or else the compiled policy forward."""
    step = next(s for s in (trainer.iteration_call, trainer.rollout_step, trainer.policy_step) if s is not None)
    return bool(step.compiled)


def run_variant(base: dict, yaml_path: str, warmup_iterations: int, iterations: int, device: torch.device) -> dict:
    """Build a Trainer from ``base`` over ``yaml_path``, run ``warmup_iterations`` (compiling happens here), then time
    ``iterations`` of ``collect(); update()``. Returns env steps/s, warm-up seconds, what compiled, how many graphs
    inductor ran without CUDA graphs (``cudagraph_skips``) and the Trainer's sections."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from fastrl.config import make_config
    from fastrl.run.trainer import Trainer
    torch._dynamo.reset()  # each variant compiles afresh (and stays under dynamo's per-function cache limit)
    skips_before = counters["inductor"]["cudagraph_skips"]
    cfg = make_config({**base, **QUIET, "device": str(device)}, yaml_path)
    trainer = Trainer(cfg)
    try:
        start = time.perf_counter()
        for _ in range(warmup_iterations):
            trainer.collect()
            trainer.update()
        _sync(device)
        warmup_s = time.perf_counter() - start
        trainer.timer.pop()
        start = time.perf_counter()
        for _ in range(iterations):
            trainer.collect()
            trainer.update()
        _sync(device)
        elapsed = time.perf_counter() - start
        sections = {k.removeprefix("time/").removesuffix("_s"): v for k, v in trainer.timer.pop().items()}
        steps = iterations * cfg.n_envs * cfg.n_steps
        return {"status": "ok", "sps": steps / elapsed, "timed_steps": steps, "warmup_s": warmup_s,
                "rollout_compiled": rollout_compiled(trainer),
                "update_compiled": bool(trainer.update_call.compiled), "compile_plan": trainer.plan.to_dict(),
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips_before,
                "n_steps": cfg.n_steps, "n_minibatches": cfg.n_minibatches, "minibatch_size": cfg.minibatch_size,
                "n_epochs": cfg.n_epochs, "sections_s": sections}
    finally:
        trainer.close()
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()


def bench_task(task: dict, device: torch.device, budget: Budget, reserve_s: float, dry_run: bool,
               modes: tuple = MODE_NAMES, n_envs_only: tuple = ()) -> list:
    """Every (compile mode, amp, n_envs) variant of ``task`` that fits the budget (keeping ``reserve_s`` for what
    follows), all eager ones first; the rest are recorded as skipped, with the reason. With ``minibatch_size``,
    ``n_minibatches`` follows n_envs so that every variant's update has the same shapes."""
    rows = []
    for mode, compile_setting in [(m, c) for m, c in COMPILE_MODES if m in modes]:
        for amp in task["amps"]:
            for n_envs in [n for n in task["n_envs"] if not n_envs_only or n in n_envs_only]:
                row = {"variant": f"{mode} / bf16 {'on' if amp == 'bf16' else 'off'} / {n_envs} envs",
                       "mode": mode, "compile": compile_setting, "amp": amp, "n_envs": n_envs}
                reason = None
                if mode in CUDA_ONLY and device.type != "cuda":
                    reason = CUDA_ONLY[mode]
                elif dry_run and mode != "eager" and any(r["mode"] == mode and r["status"] == "ok" for r in rows):
                    reason = "dry run: one compiled variant per mode"
                elif not budget.fits(reserve_s + (2.0 if dry_run else NEEDS_S[mode])):
                    reason = f"time budget: {budget.left():.0f} s left"
                if reason is not None:
                    rows.append({**row, "status": "skipped", "reason": reason})
                    continue
                base = {**task["base"], "n_envs": n_envs, "compile": compile_setting, "amp": amp}
                if "minibatch_size" in task:
                    base["n_minibatches"] = max(1, n_envs * base["n_steps"] // task["minibatch_size"])
                try:
                    row.update(run_variant(base, task["yaml"], task["warmup_iterations"], task["iterations"], device))
                except Exception as e:  # noqa: BLE001  (a variant that fails is a finding; the profile goes on)
                    row.update(status="error", reason=_first_line(e))
                rows.append(row)
                print(f"  {task['env']} {row['variant']}: "
                      + (f"{row['sps']:,.0f} steps/s (warm-up {row['warmup_s']:.1f} s)" if row["status"] == "ok"
                         else f"{row['status']} ({row['reason']})"), flush=True)
    eager = {(r["amp"], r["n_envs"]): r["sps"] for r in rows if r["mode"] == "eager" and r["status"] == "ok"}
    for r in rows:
        if r["status"] == "ok" and (r["amp"], r["n_envs"]) in eager:
            r["speedup_vs_eager"] = r["sps"] / eager[(r["amp"], r["n_envs"])]
    return rows


def tasks(dry_run: bool) -> dict:
    """The two end-to-end tasks: Breakout-v5 (``minibatch_size`` fixed across n_envs) and CartPole-v1."""
    if dry_run:
        atari = dict(n_envs=[4], n_steps=4, n_epochs=1, minibatch_size=8, warmup_iterations=1, iterations=1)
        cartpole = dict(n_envs=[4], n_steps=8, n_epochs=1, warmup_iterations=1, iterations=1)
        whole = dict(n_envs=[4], n_steps=8, warmup_iterations=1, iterations=1)
    else:
        atari = dict(n_envs=[64, 256], n_steps=64, n_epochs=2, minibatch_size=1024, warmup_iterations=2, iterations=3)
        cartpole = dict(n_envs=[8], n_steps=32, n_epochs=20, warmup_iterations=3, iterations=10)
        whole = dict(n_envs=[4, 2048], n_steps=128, warmup_iterations=2, iterations=20)
    return {
        "atari": {"env": "Breakout-v5", "yaml": str(REPO / "configs/ppo/atari.yaml"), "amps": ["off", "bf16"],
                  "n_envs": atari["n_envs"], "minibatch_size": atari["minibatch_size"],
                  "warmup_iterations": atari["warmup_iterations"], "iterations": atari["iterations"],
                  "base": {"n_steps": atari["n_steps"], "n_epochs": atari["n_epochs"]}},
        "cartpole": {"env": "CartPole-v1", "yaml": str(REPO / "configs/ppo/cartpole.yaml"), "amps": ["off"],
                     "n_envs": cartpole["n_envs"], "warmup_iterations": cartpole["warmup_iterations"],
                     "iterations": cartpole["iterations"],
                     "base": {"n_steps": cartpole["n_steps"], "n_epochs": cartpole["n_epochs"], "n_minibatches": 1}},
        "iteration": {"env": "CartPole-v1 (torch env)", "yaml": str(REPO / "configs/ppo/cartpole_purejaxrl.yaml"),
                      "amps": ["off"], "n_envs": whole["n_envs"], "warmup_iterations": whole["warmup_iterations"],
                      "iterations": whole["iterations"], "base": {"n_steps": whole["n_steps"]}},
    }


# ---------------------------------------------------------------------------------------------- report
def summary_markdown(report: dict) -> str:
    bw = report["device_bandwidth"]
    peak = f"{bw['gbps']:,.0f} GB/s ({bw['source']})" if bw["gbps"] else bw["source"]
    lines = [f"## GPU profile: {report['machine']['machine']}{' (DRY RUN, CPU)' if report['dry_run'] else ''}",
             "", (f"Peak memory bandwidth {peak}; measured copy {report['copy_gbps']:,.1f} GB/s; "
                  f"{report['elapsed_s']:.0f} s in all."), "", "### Kernels", ""]
    lines.append(markdown_table(
        ["kernel", "backend", "T x N", "µs", "GB/s", "of peak", "of copy", "x torch"],
        [[r["kernel"], r["backend"], f"{r['T']}x{r['N']}", r["us"], r["gbps"],
          f"{r['of_peak']:.0%}" if r["of_peak"] is not None else "-", f"{r['of_copy']:.0%}",
          f"{r['speedup_vs_torch']:.1f}x"] for r in report["kernels"]]))
    for backend, reason in report["kernels_skipped"].items():
        lines.append(f"\n{backend}: skipped ({reason})")
    for key, title in (("atari", "PPO on Breakout-v5, env steps/s"), ("cartpole", "PPO on CartPole-v1, env steps/s"),
                       ("iteration", "The whole iteration (torch-native CartPole, PureJaxRL's config), env steps/s")):
        if key not in report:  # a report written before the row existed
            continue
        lines += ["", f"### {title}", ""]
        lines.append(markdown_table(
            ["variant", "steps/s", "x eager", "warm-up s", "compiled (rollout/update)", "note"],
            [[r["variant"], r.get("sps"), f"{r['speedup_vs_eager']:.2f}x" if "speedup_vs_eager" in r else "-",
              r.get("warmup_s"), f"{r['rollout_compiled']}/{r['update_compiled']}" if r["status"] == "ok" else "-",
              "" if r["status"] == "ok" else f"{r['status']}: {r['reason']}"] for r in report[key]]))
    return "\n".join(lines)


def run(dry_run: bool, budget_s: float, modes: tuple = MODE_NAMES,
        kernels: bool = True, n_envs_only: tuple = ()) -> dict:
    from benchmarks.kernels import copy_bandwidth
    budget = Budget(budget_s)
    device = torch.device("cpu" if dry_run else "cuda")
    machine = machine_info(device)  # at the start: its time and load average are the run's start
    bandwidth = device_bandwidth(device)
    copy_gbps = copy_bandwidth(device, 0.05 if dry_run else 0.5, nbytes=(8 << 20) if dry_run else (1 << 30))
    if dry_run:
        shapes, timing_s, min_reps = [(8, 16), (33, 5)], 0.02, 2
    else:
        shapes, timing_s, min_reps = [(128, 1024), (1024, 4096), (1024, 65536)], 0.5, 5
    print(f"# kernels on {device} ({bandwidth['source']})", flush=True)
    kernel_rows, kernels_skipped = (bench_kernels(device, shapes, timing_s, min_reps, bandwidth, copy_gbps) if kernels
                                    else ([], {"all": "--no-kernels"}))
    plan = tasks(dry_run)
    compile_context = trace_only_compile() if dry_run else contextlib.nullcontext()
    with compile_context:
        print("# PPO on Breakout-v5", flush=True)
        atari = bench_task(plan["atari"], device, budget, reserve_s=0.0 if dry_run else 60.0, dry_run=dry_run,
                           modes=modes, n_envs_only=n_envs_only)
        print("# PPO on CartPole-v1", flush=True)
        cartpole = bench_task(plan["cartpole"], device, budget, reserve_s=0.0 if dry_run else 60.0,
                              dry_run=dry_run, modes=modes)
        print("# the whole iteration: CartPole-v1 on the torch env, PureJaxRL's config", flush=True)
        iteration = bench_task(plan["iteration"], device, budget, reserve_s=0.0, dry_run=dry_run, modes=modes)
    return {"benchmark": "gpu_profile", "dry_run": dry_run, "device": str(device), "machine": machine,
            "budget_s": budget_s, "elapsed_s": budget_s - budget.left(),
            "compile_backend": "eager (dry run: dynamo traces, no inductor code generation)" if dry_run else "inductor",
            "device_bandwidth": bandwidth, "copy_gbps": copy_gbps, "kernels": kernel_rows,
            "kernels_skipped": kernels_skipped, "settings": {k: {kk: vv for kk, vv in v.items() if kk != "yaml"}
                                                             for k, v in plan.items()},
            "atari": atari, "cartpole": cartpole, "iteration": iteration}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same code on CPU, tiny sizes, under a minute")
    parser.add_argument("--budget-s", type=float, default=None, help="seconds for the whole profile (default 450; "
                        "dry run 50)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/gpu_profile.json)")
    parser.add_argument("--modes", nargs="+", choices=MODE_NAMES, default=None,
                        help="end-to-end variants to run (default: all; a re-check of one mode after a fix)")
    parser.add_argument("--atari-n-envs", type=int, nargs="+", default=(),
                        help="only these Atari n_envs (default: 64 and 256)")
    parser.add_argument("--no-kernels", action="store_true", help="skip the kernel timings")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("fastrl bench: error: --profile gpu needs a CUDA device and torch.cuda.is_available() is False; run it "
              "on a GPU machine, or add --dry-run for the CPU smoke run", file=sys.stderr)
        return 2
    modes = tuple(args.modes) if args.modes else MODE_NAMES
    report = run(args.dry_run, args.budget_s or (50.0 if args.dry_run else 450.0), modes, not args.no_kernels,
                 tuple(args.atari_n_envs))
    device = report["device"]
    path = write_json(report, args.out or default_out("gpu_profile_dry_run" if args.dry_run else "gpu_profile", device))
    print()
    print(summary_markdown(report))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How fast are fastrl's GAE and V-trace kernels against the plain loop and TorchRL's functionals?

    python -m benchmarks.kernels [--quick] [--out PATH]

For each (T, N) it times, in one run: ``kernels.gae`` / ``kernels.vtrace`` (the dispatched backend), the
plain loop twins, and TorchRL's ``vec_generalized_advantage_estimate``, ``generalized_advantage_estimate``
and ``vtrace_advantage_estimate`` (given contiguous batch-major [N, T, 1] inputs, their native layout).
It reports the median µs per call after warm-up and the bandwidth over the bytes that must move (each
input read once, each output written once: float32 values, bool flags), next to the machine's measured
memory-copy bandwidth. Writes JSON (default ``benchmarks/results/<machine-tag>/kernels.json``).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastrl import kernels  # noqa: E402

SHAPES = [(128, 64), (2048, 8), (128, 1024), (1024, 4096)]
GAMMA, LAM = 0.99, 0.95
GAE_BYTES = 3 * 4 + 2 * 1 + 2 * 4  # reward, value, next_value; done, terminated; adv, target
VTRACE_BYTES = 5 * 4 + 2 * 1 + 2 * 4  # + behavior_logp, target_logp; vs, pg_advantage


def machine_tag(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).lower().replace(" ", "-")
    return f"cpu-{os.cpu_count()}c"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, device, budget_s, min_reps, warmup=2):
    for _ in range(warmup):
        fn()
    sync(device)
    times, start = [], time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget_s and len(times) < 1000):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device, budget_s, nbytes=256 << 20):
    """GB/s of ``dst.copy_(src)`` on a large buffer, counting the read and the write."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    t = median_seconds(lambda: dst.copy_(src), device, budget_s, min_reps=5)
    return 2 * nbytes / t / 1e9


def inputs(T, N, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = {k: torch.randn(T, N, generator=g) for k in ("reward", "value", "next_value", "behavior_logp")}
    x["target_logp"] = x["behavior_logp"] + 0.3 * torch.randn(T, N, generator=g)
    x["done"] = torch.rand(T, N, generator=g) < 0.02
    x["terminated"] = x["done"] & (torch.rand(T, N, generator=g) < 0.5)
    return {k: v.to(device) for k, v in x.items()}


def contenders(x):
    """name -> (kind, callable). kind is "gae" or "vtrace"."""
    gae_args = (x["reward"], x["value"], x["next_value"], x["done"], x["terminated"])
    vt_args = (x["behavior_logp"], x["target_logp"]) + gae_args
    out = {
        "fastrl.gae": ("gae", lambda: kernels.gae(*gae_args, GAMMA, LAM)),
        "loop.gae": ("gae", lambda: kernels.gae_reference(*gae_args, GAMMA, LAM)),
        "fastrl.vtrace": ("vtrace", lambda: kernels.vtrace(*vt_args, GAMMA)),
        "loop.vtrace": ("vtrace", lambda: kernels.vtrace_reference(*vt_args, GAMMA)),
    }
    try:
        from torchrl.objectives.value import functional as F
    except ImportError:
        return out
    b = {k: v.t().unsqueeze(-1).contiguous() for k, v in x.items()}  # [N, T, 1], time_dim=-2
    rl_gae = (GAMMA, LAM, b["value"], b["next_value"], b["reward"], b["done"], b["terminated"])
    out["torchrl.vec_gae"] = ("gae", lambda: F.vec_generalized_advantage_estimate(*rl_gae))
    out["torchrl.gae"] = ("gae", lambda: F.generalized_advantage_estimate(*rl_gae))
    out["torchrl.vtrace"] = ("vtrace", lambda: F.vtrace_advantage_estimate(
        GAMMA, b["target_logp"], b["behavior_logp"], b["value"], b["next_value"], b["reward"], b["done"],
        b["terminated"]))
    return out


def run(quick=False, device=None):
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    budget = 0.2 if quick else 1.0
    copy_gbs = copy_bandwidth(device, budget)
    rows = []
    for T, N in SHAPES:
        x = inputs(T, N, device)
        for name, (kind, fn) in contenders(x).items():
            slow = name in ("loop.gae", "loop.vtrace", "torchrl.gae", "torchrl.vtrace") and T * N >= 1 << 20
            t = median_seconds(fn, device, budget, min_reps=1 if (quick and slow) else 3, warmup=1 if slow else 3)
            nbytes = T * N * (GAE_BYTES if kind == "gae" else VTRACE_BYTES)
            rows.append(dict(T=T, N=N, kernel=kind, impl=name, us=t * 1e6, gbps=nbytes / t / 1e9,
                             copy_ratio=nbytes / t / 1e9 / copy_gbs))
    for r in rows:  # speed-up of fastrl over each implementation of the same kernel at the same shape
        ours = next(o for o in rows if (o["T"], o["N"], o["impl"]) == (r["T"], r["N"], f"fastrl.{r['kernel']}"))
        r["fastrl_speedup"] = r["us"] / ours["us"]
    return dict(
        device=str(device), machine=machine_tag(device), platform=platform.platform(),
        torch=torch.__version__, threads=torch.get_num_threads(), copy_gbps=copy_gbs, quick=quick, results=rows,
    )


def table(report):
    lines = [f"{report['machine']}  copy bandwidth {report['copy_gbps']:.1f} GB/s  "
             f"(torch {report['torch']}, {report['threads']} threads)",
             f"{'T':>5} {'N':>5}  {'impl':<18} {'us/call':>12} {'GB/s':>8} {'of copy':>8} {'fastrl x':>9}"]
    for r in report["results"]:
        lines.append(f"{r['T']:>5} {r['N']:>5}  {r['impl']:<18} {r['us']:>12.1f} {r['gbps']:>8.2f} "
                     f"{100 * r['copy_ratio']:>7.1f}% {r['fastrl_speedup']:>8.1f}x")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short timing budget per contender")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/kernels.json)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args(argv)
    report = run(args.quick, args.device)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", report["machine"],
                                   "kernels.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    print(table(report))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

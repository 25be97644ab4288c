"""Shared benchmark helpers: machine tag and description, interleaved median timing, JSON out, Markdown tables.

Also ``EnvPoolVecEnv``: a minimal Stable-Baselines3 ``VecEnv`` over an EnvPool batch, so SB3 can be timed on
the same C++ environments fastrl uses (a learner-against-learner comparison).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import statistics
import time
from pathlib import Path

import numpy as np
import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_tag(device: torch.device | str = "cpu") -> str:
    """``cpu-<cores>c`` on CPU, the lower-cased GPU name on CUDA (the same tags benchmarks/kernels.py uses)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).lower().replace(" ", "-")
    return f"cpu-{os.cpu_count()}c"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def code_version() -> str | None:
    """The checkout's commit (short hash), with ``+changes(<paths>)`` naming the tracked files that differ from it
    (the first five, then how many more), so a reader can tell edits to the trainer from edits beside it; None
    outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    paths = [line[3:].split(" -> ")[-1] for line in dirty.stdout.splitlines() if line.strip()]
    if not paths:
        return commit.stdout.strip()
    more = f", {len(paths) - 5} more" if len(paths) > 5 else ""
    return f"{commit.stdout.strip()}+changes({', '.join(paths[:5])}{more})"


def machine_info(device: torch.device | str = "cpu") -> dict:
    """Everything needed to tell two result files apart: machine, versions, code, threads, time, load."""
    return {
        "code": code_version(),
        "machine": machine_tag(device),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average_at_start": load_average(),
    }


def package_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def default_out(name: str, device: torch.device | str = "cpu") -> Path:
    return RESULTS_DIR / machine_tag(device) / f"{name}.json"


def write_json(report: dict, path: str | Path) -> Path:
    """Write ``report`` atomically (tmp + rename) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def interleaved(contenders: dict, repeats: int) -> dict:
    """Run each ``name -> fn() -> seconds`` ``repeats`` times, round-robin, reversing the order every round.

    On a shared, noisy machine this spreads load spikes over all contenders instead of one.
    Returns ``name -> [seconds, ...]`` in run order.
    """
    names = list(contenders)
    samples = {name: [] for name in names}
    for round_ in range(repeats):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            samples[name].append(contenders[name]())
    return samples


def rate_summary(seconds: list, work: float) -> dict:
    """``work`` units per second: median over samples, plus min/max and the raw samples."""
    rates = sorted(work / s for s in seconds)
    return {"median": statistics.median(rates), "min": rates[0], "max": rates[-1], "samples": [work / s for s in seconds]}


def markdown_table(headers: list, rows: list) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
        return "" if v is None else str(v)
    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in body)) if body else len(str(h)) for i, h in enumerate(headers)]
    line = lambda values: "| " + " | ".join(str(v).rjust(w) for v, w in zip(values, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|", *map(line, body)])


def make_envpool_vec_env(env_id: str, n_envs: int, seed: int = 0):
    """An SB3 VecEnv over ``envpool.make(env_id, env_type="gymnasium", num_envs=n_envs)``."""
    import envpool
    from stable_baselines3.common.vec_env import VecEnv

    class EnvPoolVecEnv(VecEnv):
        """SB3's VecEnv contract over EnvPool, for throughput comparisons.

        EnvPool resets an env on the step *after* it ends (ignoring that step's action, reward 0), where SB3
        expects the reset observation on the ending step. This adapter passes EnvPool's timing through
        unchanged, so SB3 sees one extra zero-reward transition per episode: the compute per step is SB3's
        real cost, the learning signal is slightly off. Use it to time SB3, not to train with.
        """

        def __init__(self):
            self.pool = envpool.make(env_id, env_type="gymnasium", num_envs=n_envs, seed=seed)
            super().__init__(n_envs, self.pool.observation_space, self.pool.action_space)
            self._actions = None

        def reset(self):
            obs, _ = self.pool.reset()
            return obs

        def step_async(self, actions):
            self._actions = actions

        def step_wait(self):
            obs, reward, terminated, truncated, _ = self.pool.step(self._actions)
            done = terminated | truncated
            infos = [{} for _ in range(self.num_envs)]
            for i in np.flatnonzero(done):  # SB3's own VecEnvs loop over envs too; only ended ones here
                infos[i]["terminal_observation"] = obs[i]
                infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            return obs, reward.astype(np.float32), done, infos

        def close(self):
            self.pool.close()

        def get_attr(self, attr_name, indices=None):
            return [getattr(self, attr_name, None)] * len(self._get_indices(indices))

        def set_attr(self, attr_name, value, indices=None):
            setattr(self, attr_name, value)

        def env_method(self, method_name, *args, indices=None, **kwargs):
            raise NotImplementedError("EnvPoolVecEnv has no per-env methods")

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * len(self._get_indices(indices))

    return EnvPoolVecEnv()

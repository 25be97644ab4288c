"""Turn the benchmark JSON files into ``benchmarks/RESULTS.md`` and PNG plots.

    python -m benchmarks.report [--results benchmarks/results] [--out benchmarks/RESULTS.md] [--machine TAG ...]

Reads ``<results>/<machine-tag>/*.json`` (whatever parts have run: peers, peers_sb3_zoo, peers_sb3_default,
peers_rejax, learning, envs_sps, train_sps, rollout_sps, kernels, ddp_scaling, impala_sps), writes one Markdown
file with a section per machine, and per machine the plots under ``<results>/<machine-tag>/plots/``:
- ``learning_curves.png``: mean return of the last 100 episodes against env steps and against wall seconds,
  fastrl and SB3 on the same axes (one row per env);
- ``sps.png``: steps/s bars (training against SB3, raw env backends, end to end);
- ``kernels.png``: GAE / V-trace bandwidth of each implementation against the measured memory-copy limit.
A part whose JSON is missing is left out; one whose JSON cannot be read is named in the file with the reason.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS_DIR, markdown_table

OUT = Path(__file__).resolve().parent / "RESULTS.md"
PARTS = ("peers", "peers_sb3_zoo", "peers_sb3_default", "peers_rejax", "learning", "envs_sps", "train_sps",
         "rollout_sps", "rollout_step", "kernels", "ddp_scaling", "impala_sps", "learner", "default_solve",
         "default_process", "population", "zoo", "gpu_profile", "gpu_profile_recheck")
LIB_COLORS = {"fastrl": "tab:blue", "sb3": "tab:orange", "sb3[gym]": "tab:orange", "sb3[envpool]": "tab:red",
              "envpool": "tab:blue", "gym_sync": "tab:green", "gym_async": "tab:purple"}
PALETTE = ["tab:cyan", "tab:olive", "tab:brown", "tab:pink", "tab:gray"]
ALGO_STYLES = {"ppo": "-", "a2c": "--"}


def load(machine_dir: Path) -> tuple[dict, dict]:
    """``(part -> report, part -> why unreadable)`` for the known parts present in ``machine_dir``."""
    data, broken = {}, {}
    for part in PARTS:
        path = machine_dir / f"{part}.json"
        if path.is_file():
            try:
                data[part] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                broken[part] = f"{type(e).__name__}: {e}"
    return data, broken


def _fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)


def _when(report: dict) -> str:
    info = report.get("machine") if isinstance(report.get("machine"), dict) else report
    profile = "quick" if report.get("quick") else "full"
    return f"{profile} profile, {info.get('timestamp', 'time unknown')}"


# ---------------------------------------------------------------------------------------------- tables
def peers_section(report: dict) -> list:
    from benchmarks.peers_learning import peers_table
    return [f"Peers: fastrl (EnvPool envs) and Stable-Baselines3 (Gymnasium DummyVecEnv) with the same "
            f"hyperparameters, each run stopped when the mean return of its last 100 episodes reaches the threshold "
            f"(or at the budget). Medians over {report.get('seeds', '?')} seed(s); "
            f"'-' where fewer than half the seeds reached the threshold. ({_when(report)})", "",
            peers_table(report["results"])]


def _threads(report: dict) -> str:
    return f"{report.get('threads', '?')} torch thread(s) on every side"


def sb3_zoo_section(report: dict) -> list:
    from benchmarks.peers_sb3 import sb3_table
    entry = report["result"]
    return [f"SB3 like for like: both libraries at the [rl-baselines3-zoo]({report.get('zoo_source', '')}) PPO "
            f"settings for CartPole-v1 (lr and clip range annealed linearly to 0, no value clipping; fastrl's "
            f"mapping: `fastrl_from_sb3` in benchmarks/peers_sb3.py), each run stopped when the mean return of its last "
            f"100 episodes reaches {entry['threshold']:g}, checked after every update on both sides; budget "
            f"{entry['budget_steps']:,} steps. Medians over {report.get('seeds', '?')} seed(s), {_threads(report)}; "
            f"training seconds from the first rollout (fastrl[compiled]: its compile included, from a warm cache). "
            f"`python -m benchmarks.peers --part sb3-zoo`. ({_when(report)})", "", sb3_table(entry)]


def sb3_default_section(report: dict) -> list:
    from benchmarks.peers_sb3 import sb3_table
    entry = report["result"]
    return [f"Steps/s at SB3's default PPO hyperparameters (`PPO(\"MlpPolicy\", env)`, "
            f"{entry['sb3_hyperparameters']['n_envs']} env, n_steps 2048, minibatch 64, 10 epochs) on CartPole-v1, a "
            f"fixed budget of {entry['budget_steps']:,} steps; fastrl with the same hyperparameters, eager and "
            f"compiled. Medians over {report.get('seeds', '?')} seed(s), {_threads(report)}. "
            f"`python -m benchmarks.peers --part sb3-default`. ({_when(report)})", "", sb3_table(entry)]


def rejax_section(report: dict) -> list:
    from benchmarks.peers_rejax import rejax_table
    entry = report["result"]
    return [f"The JAX peer: rejax PPO with [its CartPole-v1 config]({entry.get('rejax_source', '')}) "
            f"({entry['rejax_config']['num_envs']} envs x {entry['rejax_config']['num_steps']} steps, "
            f"{entry['rejax_config']['num_epochs']} epochs, {entry['rejax_config']['num_minibatches']} minibatches, "
            f"{entry['budget_steps']:,} steps), jitted end to end on the CPU (XLA flags `{report.get('xla_flags', '')}`), "
            f"and fastrl at the same config (`fastrl_from_rejax` in benchmarks/peers_rejax.py). Both evaluate "
            f"{entry['eval_episodes']} sampled episodes every {entry['eval_every_steps']:,} steps; the training seconds "
            f"to the first evaluation >= {entry['threshold']:g} leave the evaluations out (rejax: steps / its "
            f"training steps/s). Medians over {report.get('seeds', '?')} seed(s), {_threads(report)}. "
            f"`python -m benchmarks.peers --part rejax`. ({_when(report)})", "", rejax_table(entry)]


def learning_section(report: dict) -> list:
    from benchmarks.peers_learning import learning_table
    return [f"Learning: fastrl at the rl-baselines3-zoo's step budgets, beside the zoo's published score "
            f"([benchmark.md]({report.get('zoo_source', '')}); one agent, deterministic evaluation). fastrl: "
            f"deterministic evaluation over {report['results'][0]['eval_episodes'] if report['results'] else '?'} "
            f"episodes, and the training mean of the last 100 episodes; medians over {report.get('seeds', '?')} "
            f"seed(s). ({_when(report)})", "", learning_table(report["results"])]


def envs_section(report: dict) -> list:
    from benchmarks.envs_sps import table
    lines = [f"Raw env throughput (random actions, no learner), median env steps/s. ({_when(report)})", "",
             table(report["results"], report["backends"])]
    skipped = sorted({f"{name}: {why}" for r in report["results"] for name, why in r["skipped"].items()})
    return lines + ([""] + [f"- skipped {s}" for s in skipped] if skipped else [])


def train_sps_section(report: dict) -> list:
    lines = []
    if report.get("end_to_end"):
        backends = [f"sb3[{b}]" for b in report.get("sb3_backends", [])]
        rows = [[r["env"], r["setting"], r["sps"]["fastrl"]["median"],
                 *[r["sps"][b]["median"] if b in r["sps"] else "skipped" for b in backends],
                 *[f"{r[f'fastrl_over_{b}']:.2f}x" if f"fastrl_over_{b}" in r else "-" for b in backends]]
                for r in report["end_to_end"]]
        lines += [f"End to end (collect + update), PPO, median steps/s, {report.get('threads', '?')} torch thread(s). "
                  f"({_when(report)})", "",
                  markdown_table(["env", "setting", "fastrl", *backends, *[f"fastrl / {b}" for b in backends]], rows)]
    if report.get("rollout"):
        rows = [[r["env"], r["n_envs"], r["sps"]["raw_envpool"]["median"], r["sps"]["fastrl_collect"]["median"],
                 f"{r['fastrl_over_raw']:.2f}x", f"{r['us_per_batched_step']['overhead']:.1f}"]
                for r in report["rollout"]]
        lines += ["", "Rollout only: `Trainer.collect()` against raw EnvPool stepping, median steps/s.", "",
                  markdown_table(["env", "n_envs", "raw EnvPool", "fastrl collect", "fastrl / raw",
                                  "overhead us / batched step"], rows)]
    return lines


def rollout_section(report: dict) -> list:
    lines = [f"Atari rollout: `Trainer.collect()` against raw EnvPool, median steps/s. ({_when(report)})", "",
             markdown_table(["env", "n_envs", "raw EnvPool", "rollout", "rollout / raw"],
                            [[r["env"], r["n_envs"], r["raw_sps"]["median"], r["rollout_sps"]["median"],
                              f"{r['rollout_over_raw']:.0%}"] for r in report.get("rollout", [])])]
    if report.get("train"):
        lines += ["", markdown_table(["variant", "env", "train steps/s", "warm-up s", "compiled"],
                                     [[r["variant"], r["env"], r["sps"], r["warmup_s"], r["compiled"]]
                                      for r in report["train"]])]
    return lines


def kernels_section(report: dict) -> list:
    rows = []
    for r in report["results"]:
        if not r["impl"].startswith("fastrl."):
            continue
        others = {o["impl"]: o["fastrl_speedup"] for o in report["results"]
                  if (o["T"], o["N"], o["kernel"]) == (r["T"], r["N"], r["kernel"]) and o["impl"] != r["impl"]}
        rows.append([r["kernel"], f"{r['T']} x {r['N']}", f"{r['us']:.1f}", f"{r['gbps']:.2f}",
                     f"{100 * r['copy_ratio']:.0f}%",
                     ", ".join(f"{name} {x:.1f}x" for name, x in others.items())])
    return [f"Kernels on {report.get('device', '?')}: fastrl's dispatched kernel, bandwidth over the bytes that must "
            f"move, against the measured copy bandwidth ({report['copy_gbps']:.1f} GB/s); speed-up over the loop "
            f"twin and TorchRL. ({'quick' if report.get('quick') else 'full'} profile)", "",
            markdown_table(["kernel", "T x N", "us / call", "GB/s", "of copy", "fastrl speed-up over"], rows)]


def ddp_section(report: dict) -> list:
    rows = [[r["ranks"], r["sps_median"], f"{r['scaling_efficiency']:.0%}", f"{r['allreduce_share_of_update']:.1%}"]
            for r in report["results"]]
    return [f"Data-parallel PPO on {report.get('env', '?')} ({report.get('n_envs_per_rank', '?')} envs per rank), "
            f"global steps/s. ({_when(report)})", "",
            markdown_table(["ranks", "steps/s (median)", "scaling efficiency", "all-reduce share of update"], rows)]


def rollout_step_section(report: dict) -> list:
    from benchmarks.rollout_step import rollout_step_table
    return [f"One rollout step (policy forward, sampling, env step, buffer writes) on CartPole-v1, µs per step: eager, "
            f"compiled with EnvPool's step outside the graph (what fastrl runs), inside it as a `torch.library` custom "
            f"op, and the torch-native env eager and fused into the graph. `python -m benchmarks.rollout_step`, median "
            f"of {report.get('repeats', '?')} interleaved {report['results'][0]['steps']}-step collects. "
            f"({_when(report)})", "", rollout_step_table(report)]


def impala_section(report: dict) -> list:
    rows = [[r["n_actors"], r["sync_interval"], r["actor_steps_per_s"], r["learner_samples_per_s"],
             f"{r['policy_lag_mean']:.2f}", f"{100 * r['learner_wait_frac']:.0f}%"] for r in report["results"]]
    return [f"IMPALA actor-learner throughput. ({_when(report)})", "",
            markdown_table(["actors", "sync", "actor steps/s", "learner samples/s", "policy lag", "learner wait"],
                           rows)]


def learner_section(report: dict) -> list:
    k = report.get("members") or "K"
    population = f"K={k} µs/member-step" if report.get("members") else "K members µs/member-step"

    def us(r, key):
        return r.get(key) if r.get(key) is not None else "-"
    rows = [[r["case"], r["minibatch"], r["eager_us"], us(r, "pure_eager_us"), r["compiled_us"],
             f"{r['speedup']:.2f}x" if r.get("speedup") else "-", us(r, "population_us"),
             (r.get("load_average_after") or ["?"])[0]] for r in report["results"]]
    lines = [f"One PPO minibatch gradient step (gather, forward, loss, backward, clip, Adam), µs: the torch.optim twin "
             f"(CleanRL's step, fused Adam) against `fastrl.run.trainer.Trainer.update()` per step, eager (`--compile "
             f"off`) and compiled (`--compile {report.get('mode', 'default')}`, the trainer's own compile plan; "
             f"speed-up over torch.optim), and {k} members (`--n-seeds {k}`, µs per member-step). `python -m "
             f"benchmarks.learner`, median of {report.get('repeats', '?')} samples. ({_when(report)})", "",
             markdown_table(["case", "minibatch", "torch.optim µs", "trainer eager µs", "trainer compiled µs",
                             "speed-up", population, "load (1 min)"], rows)]
    if report.get("compile"):
        rows = [[c["case"], c["cold_s"], c["warm_s"], c["cold_process_s"], c["warm_process_s"]]
                for c in report["compile"]]
        lines += ["", "Seconds of the compiled trainer's first update (compile and its steps): a cold and a warm "
                      "inductor cache.", "",
                  markdown_table(["case", "cold compile s", "warm compile s", "cold process s", "warm process s"],
                                 rows)]
    return lines


def default_solve_section(report: dict) -> list:
    rows = [list(r.values()) for r in report["table"]]
    return [f"`python -m fastrl.train` (the embedded default) to a last-100 mean of 475, one process per seed, "
            f"`python -m benchmarks.default_solve`; load average at start {report.get('load_average_at_start')}. "
            f"({_when(report)})", "", markdown_table(list(report["table"][0]), rows)]


def default_process_section(report: dict) -> list:
    rows = [list(r.values()) for r in report["table"]]
    return [f"`python -m fastrl.train` with every default, as a whole process (start to exit), one process per seed and "
            f"tree, interleaved: `python -m benchmarks.default_process`; load average at start "
            f"{report.get('load_average_at_start')}. ({_when(report)})", "", markdown_table(list(report["table"][0]), rows),
            *(["", report["notes"]] if report.get("notes") else [])]


def population_section(report: dict) -> list:
    info = report.get("machine", {})
    rows = [[r["env"], r["k"], f"{r['process_s']:.1f}", f"{r['over_one_seed']:.2f}x", f"{r['training_s']:.1f}",
             f"{r['agent_steps_per_s']:,.0f}", f"{r['members_reached']}/{r['members']}", f"{r['return_min']:.1f}"]
            for r in report["population"]]
    lines = [f"K seeds in one process (`--n-seeds K`, one vmapped, compiled program) against one seed, each a fresh "
             f"process with an empty compile cache (`compile: auto`; start-up, compiling and the final evaluation "
             f"count), `python -m benchmarks.population`. CartPole-v1: the embedded default, 120k steps per member; "
             f"LunarLander-v2: configs/ppo/lunarlander for 100k steps per member (a scaling figure, not a solve). "
             f"Load average at start {info.get('load_average_start')}, at end {info.get('load_average_end')}. "
             f"({_when(report)})", "",
             markdown_table(["env", "K", "process s", "vs one seed", "training s", "agent steps/s",
                             "members >= threshold", "lowest member's last-100"], rows)]
    for sep in report.get("separate", []):
        lines += ["", f"The same {sep['k']} CartPole seeds as separate single-run processes: one after another "
                      f"{sep['sequential_s']:.1f} s, two at a time {sep['two_at_a_time_s']:.1f} s, against "
                      f"{sep['one_process_s']:.1f} s in one process (median single process "
                      f"{sep['single_process_median_s']:.1f} s)."]
    return lines


def zoo_rows_span(rows: list) -> str:
    """"<first start> and <last end>" of the rows, minutes in UTC (a row without ``started``, from before
    2026-12-04, counts from its end ``timestamp``)."""
    starts = sorted(row.get("started") or row["timestamp"] for row in rows if row.get("timestamp"))
    ends = sorted(row["timestamp"] for row in rows if row.get("timestamp"))
    return f"{starts[0][:16].replace('T', ' ')} and {ends[-1][:16].replace('T', ' ')}"


def zoo_rows_code(rows: list) -> str:
    """Which code the rows ran: one sentence, naming every version when they differ (rows from before
    2026-12-04 recorded none), with a version's ``code_note`` where a row's file carries one (what its changes were,
    for rows from before ``code_version`` named the changed files)."""
    codes = [row.get("code") or "unrecorded" for row in rows]
    notes = {code: row["code_note"] for row, code in zip(rows, codes) if row.get("code_note")}
    if len(set(codes)) == 1:
        return f" Every row ran on code {codes[0]}" + (f" ({notes[codes[0]]})" if notes else "") + "."
    return " The rows ran on different code: " + "; ".join(
        f"{code} ({', '.join(row['config'] for row, c in zip(rows, codes) if c == code)}"
        + (f": {notes[code]}" if code in notes else "") + ")" for code in dict.fromkeys(codes)) + "."


def zoo_rows_cache(rows: list) -> str:
    """What the inductor cache held when the first row started (rows from before 2026-12-05 10:00 UTC recorded
    nothing): one sentence, or empty."""
    first = min((row for row in rows if row.get("timestamp")), key=lambda row: row.get("started") or row["timestamp"],
                default=None)
    if first is None or first.get("compile_cache_files_at_start") is None:
        return ""
    count = first["compile_cache_files_at_start"]
    if any(row.get("compile_cache_files_at_start") is not None and not row.get("compile_cache_dir") for row in rows):
        # Recorded before the rows named their cache (before fastrl.run.compile.compile_cache_dir set torch's own default
        # aside): only the first row used the one counted.
        start = "was empty" if count == 0 else f"held {count:,} files"
        return (f" fastrl's compile cache {start} when the first row started; the later rows' training processes "
                "inherited torch's own cache directory instead (`TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_<user>`, "
                "which torch writes into the zoo process's environment once it imports torch._dynamo) and found "
                "there whatever graphs earlier runs had left: their process times may be warm starts. Since "
                "2026-12-05 14:00 UTC every row compiles into fastrl's cache and records it.")
    if count == 0:
        return (" The compile cache was empty when the first row started: every graph was compiled in this run, and "
                "a later row reuses only the kernels that earlier rows built (the process times are first runs, not "
                "the faster repeat runs).")
    return f" The compile cache held {count:,} files when the first row started (earlier runs' graphs)."


def zoo_section(report: dict) -> list:
    from benchmarks.zoo import table
    info = report.get("machine", {})
    stamps = sorted(row["timestamp"] for row in report["rows"] if row.get("timestamp"))
    one_thread_only = "; rows before 2026-12-03 22:30 UTC timed 1 thread only" if stamps and \
        stamps[0] < "2026-12-03T22:30" else ""
    span = (f" The rows ran between {zoo_rows_span(report['rows'])} UTC.{zoo_rows_code(report['rows'])}"
            f"{zoo_rows_cache(report['rows'])}") if stamps else ""
    note = f" {report['note']}" if report.get("note") else ""  # what was learned about a run after it ran
    return [f"Every CPU config of configs/ as a population of seeds (one process; IMPALA: one process per seed) at the "
            f"RL Zoo's step budget, `python -m benchmarks.zoo --out-dir benchmarks/results`. Score: each seed's "
            f"deterministic evaluation at the end (5 seeds x 10 episodes of its mode policy), median and IQM over "
            f"the seeds; the zoo's figure is one agent's ([benchmark.md]({report.get('zoo_source')})). fastrl "
            f"process s: the whole population's process (start-up, compiling, training, final evaluation). SB3 "
            f"single run: the budget at SB3's steps/s measured here with the same hyperparameters (the zoo's own "
            f"rollout shape where it differs; for ppo/hopper and ppo/walker2d, which run CleanRL's settings (Walker2d "
            f"with seven tuned values), and ppo/swimmer, the zoo's whole run), Gymnasium envs, at the faster of 1 "
            f"torch thread and all cores (the count in brackets{one_thread_only}). Each row names its date and the "
            f"load average at its start; machine {info.get('cpu_model')}, {info.get('cpu_count', 2)} cores.{span}{note} Curves (median, "
            f"band from the lowest to the highest seed): `plots/zoo_<config>.png`.", "", table(report["rows"]),
            *sb3_runs_lines(report.get("sb3_runs") or [])]


def sb3_runs_lines(runs: list) -> list:
    """SB3 itself trained to the zoo's budget at the settings the table times it at (``benchmarks.zoo --sb3-seeds``):
    does the zoo's figure hold on this machine?"""
    if not runs:
        return []
    rows = [[r["config"], r["gym_env"], r["seed"], f"{r['steps']:,}", f"{r['eval_mean']:,.1f}",
             f"{r['last100_mean']:,.1f}", "-" if r["zoo"] is None else f"{r['zoo']:,.1f}", f"{r['train_s']:,.0f}",
             r["started"][:16].replace("T", " "), f"{r['load_average_at_start'][0]:.2f}", r["code"],
             f"`{r['command']}`"] for r in runs]
    return ["", "SB3 itself, trained to the zoo's budget at the settings the table times it at (1 torch thread) and "
                "scored by 10 deterministic episodes with its normalizer frozen: whether the zoo's published figure "
                "holds for SB3 on this machine.", "",
            markdown_table(["config", "env", "seed", "steps", "SB3 eval", "SB3 last-100", "zoo", "train s",
                            "started (UTC)", "load", "code", "command"], rows)]


def gpu_profile_section(report: dict) -> list:
    from benchmarks.gpu_profile import summary_markdown
    info = report["machine"]
    body = summary_markdown(report).split("\n", 2)[2]  # without its own heading
    note = f" {report['note']}" if report.get("note") else ""
    return [f"`fastrl bench --profile gpu` ({info.get('timestamp')}, {info.get('cpu_count')} CPU cores "
            f"({info.get('cpu_model')}), torch {info.get('torch')}, Python {info.get('python')}). Env steps/s of "
            f"`collect(); update()` after the warm-up, which includes compiling.{note}", "",
            body.replace("\n### ", "\n#### ")]


def gpu_profile_recheck_section(report: dict) -> list:
    from benchmarks.gpu_profile import summary_markdown
    lines = [report["note"], ""]
    for run in report["runs"]:
        lines += [f"`{run['command']}` ({run['report']['machine'].get('timestamp')}):", ""]
        body = summary_markdown(run["report"]).split("### PPO", 1)[1]
        lines += ["#### PPO" + body.replace("\n### ", "\n#### "), ""]
    return lines


def iteration_section(report: dict) -> list:
    from benchmarks.iteration import __doc__ as doc, section
    return [" ".join(doc.split("\n\n")[2:4]).replace("\n", " "), "", *section(report)]


SECTIONS = {  # part -> (heading, builder)
    "peers": ("fastrl against Stable-Baselines3", peers_section),
    "peers_sb3_zoo": ("SB3 like for like, at the zoo's CartPole settings", sb3_zoo_section),
    "peers_sb3_default": ("Steps/s at SB3's default hyperparameters", sb3_default_section),
    "peers_rejax": ("The JAX peer (rejax)", rejax_section),
    "learning": ("Learning at the zoo's budgets", learning_section),
    "envs_sps": ("Environment throughput", envs_section),
    "train_sps": ("End to end", train_sps_section),
    "rollout_sps": ("Rollout (Atari)", rollout_section),
    "rollout_step": ("The rollout step: eager, compiled, env inside or outside the graph", rollout_step_section),
    "kernels": ("Kernels", kernels_section),
    "ddp_scaling": ("Data-parallel scaling", ddp_section),
    "impala_sps": ("IMPALA", impala_section),
    "learner": ("Compiled learner", learner_section),
    "default_solve": ("The default, eager against compiled", default_solve_section),
    "default_process": ("The default command's process time, tree against tree", default_process_section),
    "population": ("Population training (many seeds in one process)", population_section),
    "zoo": ("The zoo: tuned configs at the RL Zoo's budgets, several seeds", zoo_section),
    "iteration": ("The whole iteration against rejax (PureJaxRL's CartPole config)", iteration_section),
    "gpu_profile": ("GPU profile: kernels, PPO on Atari and CartPole", gpu_profile_section),
    "gpu_profile_recheck": ("GPU profile: CUDA graphs re-checked", gpu_profile_recheck_section),
}


# ---------------------------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_learning_curves(report: dict, path: Path) -> Path | None:
    entries = [e for e in report["results"] if e["runs"]]
    if not entries:
        return None
    plt = _pyplot()
    envs = list(dict.fromkeys(e["env"] for e in entries))
    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 3.4 * len(envs)), squeeze=False)
    for row, env_id in enumerate(envs):
        ax_steps, ax_wall = axes[row]
        for e in (e for e in entries if e["env"] == env_id):
            for lib, runs in e["runs"].items():
                for i, run in enumerate(runs):
                    points = [(s, w, r) for s, w, r in run["curve"] if r is not None]
                    if not points:
                        continue
                    steps, wall, ret = zip(*points)
                    style = dict(color=LIB_COLORS.get(lib), linestyle=ALGO_STYLES.get(e["algo"], ":"), linewidth=1.4,
                                 alpha=0.85, label=f"{lib} {e['algo'].upper()}" if i == 0 else None)
                    ax_steps.plot(steps, ret, **style)
                    ax_wall.plot(wall, ret, **style)
            if e["threshold"] is not None:
                for ax in (ax_steps, ax_wall):
                    ax.axhline(e["threshold"], color="grey", linestyle=":", linewidth=1)
        ax_steps.set_title(f"{env_id}: return vs env steps")
        ax_wall.set_title(f"{env_id}: return vs wall time")
        ax_steps.set_xlabel("env steps")
        ax_wall.set_xlabel("wall seconds")
        for ax in (ax_steps, ax_wall):
            ax.set_ylabel("mean return, last 100 episodes")
            ax.grid(alpha=0.3)
        ax_steps.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Learning curves (dotted: threshold), {report['machine'].get('machine', '')}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, groups: list, series: dict, title: str, ylabel: str, log: bool = False):
    """Grouped bars: ``groups`` on the x axis, ``series`` name -> [value or None per group]."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [v or 0 for v in values]
        bars = ax.bar(xs, heights, width, label=name, color=LIB_COLORS.get(name, PALETTE[i % len(PALETTE)]))
        for bar, v in zip(bars, values):
            if v:
                ax.annotate(f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def plot_sps(data: dict, path: Path) -> Path | None:
    panels = []
    if "peers" in data and any(e["summary"] for e in data["peers"]["results"]):
        entries = [e for e in data["peers"]["results"] if e["summary"]]
        libs = list(dict.fromkeys(lib for e in entries for lib in e["summary"]))
        panels.append(([f"{e['env']}\n{e['algo'].upper()}" for e in entries],
                       {lib: [e["summary"].get(lib, {}).get("sps_median") for e in entries] for lib in libs},
                       "Training steps/s to threshold or budget (median)", False))
    if "envs_sps" in data and data["envs_sps"]["results"]:
        rows = data["envs_sps"]["results"]
        panels.append(([f"{r['env']}\nn={r['n_envs']}" for r in rows],
                       {b: [r["sps"].get(b, {}).get("median") for r in rows] for b in data["envs_sps"]["backends"]},
                       "Raw env steps/s, random actions (log scale)", True))
    if "train_sps" in data and data["train_sps"].get("end_to_end"):
        rows = data["train_sps"]["end_to_end"]
        names = list(dict.fromkeys(k for r in rows for k in r["sps"]))
        panels.append(([f"{r['env']}\n{r['setting']}" for r in rows],
                       {n: [r["sps"].get(n, {}).get("median") for r in rows] for n in names},
                       "End-to-end PPO steps/s (train_sps)", False))
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.6 * len(panels)), squeeze=False)
    for ax, (groups, series, title, log) in zip(axes[:, 0], panels):
        _bars(ax, groups, series, title, "steps/s", log)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_kernels(report: dict, path: Path) -> Path | None:
    kinds = list(dict.fromkeys(r["kernel"] for r in report["results"]))
    if not kinds:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        rows = [r for r in report["results"] if r["kernel"] == kind]
        shapes = list(dict.fromkeys((r["T"], r["N"]) for r in rows))
        impls = list(dict.fromkeys(r["impl"] for r in rows))
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            gbps = {(r["T"], r["N"]): r["gbps"] for r in rows if r["impl"] == impl}
            xs = [s + (i - (len(impls) - 1) / 2) * width for s in range(len(shapes))]
            ax.bar(xs, [gbps.get(shape, 0) for shape in shapes], width, label=impl)
        ax.axhline(report["copy_gbps"], color="black", linestyle="--", linewidth=1,
                   label=f"memory copy ({report['copy_gbps']:.1f} GB/s)")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"T={t}\nN={n}" for t, n in shapes], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("GB/s over required bytes (log)")
        ax.set_title(f"{kind.upper()} on {report.get('device', '?')}")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_plots(data: dict, plot_dir: Path) -> tuple[dict, str | None]:
    """Write the plots that ``data`` supports; returns (title -> path, why none were drawn or None)."""
    try:
        _pyplot()
    except ImportError:
        return {}, "matplotlib is not installed (pip install -e '.[bench]'); no plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    plots = {}
    if "peers" in data:
        plots["Learning curves, fastrl vs SB3"] = plot_learning_curves(data["peers"], plot_dir / "learning_curves.png")
    plots["Steps/s"] = plot_sps(data, plot_dir / "sps.png")
    if "kernels" in data:
        plots["Kernel bandwidth vs the copy limit"] = plot_kernels(data["kernels"], plot_dir / "kernels.png")
    return {title: p for title, p in plots.items() if p is not None}, None


# ---------------------------------------------------------------------------------------------- main
def machine_header(data: dict) -> str:
    for report in data.values():
        info = report.get("machine") if isinstance(report.get("machine"), dict) else report
        if "cpu_model" in info:
            return (f"{info.get('cpu_model')}, {info.get('cpu_count')} CPUs, torch {info.get('torch')}, "
                    f"Python {info.get('python')}")
    return ""


def render(results_dir: Path, out: Path, machines: list | None = None) -> tuple[str, list]:
    """The Markdown text and the plot paths for every machine directory under ``results_dir``."""
    tags = sorted(p.name for p in results_dir.iterdir() if p.is_dir()) if results_dir.is_dir() else []
    tags = [t for t in tags if not machines or t in machines]
    lines = ["# fastrl benchmark results", "",
             f"Generated by `python -m benchmarks.report` from `{os.path.relpath(results_dir, out.parent)}/` "
             f"on {time.strftime('%Y-%m-%d %H:%M')}. Run `python -m benchmarks.run [PART ...] [--quick]` "
             "(or `fastrl bench`) to refresh; numbers from a quick profile are smoke runs, not measurements.", ""]
    all_plots = []
    if not tags:
        lines.append(f"No results yet under `{results_dir}`.")
    for tag in tags:
        data, broken = load(results_dir / tag)
        if not data and not broken:
            continue
        lines += [f"## {tag}", ""]
        header = machine_header(data)
        if header:
            lines += [header, ""]
        plots, why = make_plots(data, results_dir / tag / "plots")
        if plots:
            links = ", ".join(f"[{title}]({os.path.relpath(p, out.parent)})" for title, p in plots.items())
            lines += [f"Plots: {links}", ""]
            for title, p in plots.items():
                lines += [f"![{title}]({os.path.relpath(p, out.parent)})", ""]
            all_plots += list(plots.values())
        elif why:
            lines += [why, ""]
        for part, (heading, builder) in SECTIONS.items():
            if part in broken:
                lines += [f"### {heading}", "", f"`{part}.json` could not be read: {broken[part]}", ""]
            if part not in data:
                continue
            try:
                body = builder(data[part])
            except (KeyError, TypeError, ValueError, IndexError) as e:  # another version of that script's schema
                print(f"report: {tag}/{part}.json: cannot summarise ({type(e).__name__}: {e})", file=sys.stderr)
                body = [f"`{part}.json` has a layout this report does not know ({type(e).__name__}: {e})."]
            lines += [f"### {heading}", "", *body, ""]
    return "\n".join(lines).rstrip() + "\n", all_plots


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(RESULTS_DIR), help="results directory (default benchmarks/results)")
    parser.add_argument("--out", default=str(OUT), help="Markdown file (default benchmarks/RESULTS.md)")
    parser.add_argument("--machine", nargs="+", default=None, help="only these machine tags (default: all)")
    args = parser.parse_args(argv)
    results_dir, out = Path(args.results).resolve(), Path(args.out).resolve()
    text, plots = render(results_dir, out, args.machine)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}" + "".join(f"\nwrote {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())

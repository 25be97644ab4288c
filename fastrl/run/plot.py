"""Learning curves from run directories: ``fastrl plot RUN [RUN ...]`` and the ``learning_curve.png`` of every run.

One PNG, two panels: the mean return of the last 100 training episodes (``charts/episodic_return``) against env
steps and against wall seconds (``time/elapsed_s``), with the evaluations (``eval/return_mean`` ±
``eval/return_std``, periodic and final) marked. Several runs of one env share the axes, one colour per run, named
in the legend; runs of different envs get a row of panels each. Reads ``metrics.jsonl`` (and ``summary.json`` for the title). matplotlib is imported only here, and only
its Agg canvas: no display is needed and the process-wide backend is left alone.
"""
from __future__ import annotations

from pathlib import Path

from fastrl.config import UserError, brief
from fastrl.errors import first_line, print_line
from fastrl.run.runfiles import read_metrics, read_record

# The training return's logged name, then its name before the CleanRL renaming (runs logged by older versions).
RETURN_KEYS = ("charts/episodic_return", "episode_return_mean")


def read_rows(run_dir: str | Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl``; malformed lines (a torn last line of a killed run, bad bytes, a
    global_step that is no number) are skipped, and counted in one stderr line."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir} holds no metrics.jsonl; pass run directories (runs/<run>)")
    return [row for _, row in read_metrics(path, "fastrl plot")[0]]


def curves(rows: list[dict]) -> dict:
    """``{"train": [(step, wall_s, return)], "eval": [(step, wall_s, mean, std)], "timed": bool}`` from metric rows.

    Wall seconds are ``time/elapsed_s``, made continuous across resumes (each attempt restarts its clock at 0,
    so a later attempt continues from where the rows before it ended). A row without a clock of its own (the
    final evaluation) takes that of the row before it. ``timed`` is False for rows without any clock.
    """
    train, evals = [], []
    offset = wall = 0.0
    timed = False
    for row in rows:
        elapsed = row.get("time/elapsed_s")
        if isinstance(elapsed, (int, float)):
            timed = True
            if elapsed + offset < wall:
                offset = wall
            wall = elapsed + offset
        step = row["global_step"]
        value = next((row[key] for key in RETURN_KEYS if isinstance(row.get(key), (int, float))), None)
        if value is not None:
            train.append((step, wall, float(value)))
        if isinstance(row.get("eval/return_mean"), (int, float)):
            std = row.get("eval/return_std")
            evals.append((step, wall, float(row["eval/return_mean"]), float(std) if isinstance(std, (int, float)) else 0.0))
    return {"train": train, "eval": evals, "timed": timed}


def member_bands(rows: list[dict]) -> dict:
    """A population's member rows (``member`` set) as ``{variant: [(member_step, wall_s, mean, low, high)]}``: per
    variant ("" for plain seeds), the mean return over its members at each logged step, and the min and max (the
    band). Steps are env steps per member. Empty for a single run."""
    by_step: dict = {}
    for row in rows:
        value = row.get("charts/episodic_return")
        if "member" not in row or not isinstance(value, (int, float)):
            continue
        key = (row.get("variant", ""), row.get("member_step", row["global_step"]))
        entry = by_step.setdefault(key, {"wall": row.get("time/elapsed_s"), "values": []})
        entry["values"].append(float(value))
    bands: dict = {}
    for (variant, step), entry in sorted(by_step.items(), key=lambda item: (item[0][0], item[0][1])):
        values = entry["values"]
        bands.setdefault(variant, []).append((step, entry["wall"], sum(values) / len(values), min(values), max(values)))
    return bands


def _draw_runs(by_steps, by_wall, data, bands, names, colors, color_index: int) -> tuple[int, bool]:
    """Draw runs on one pair of axes. Returns the next free colour index and whether evaluation points were drawn."""
    drew_eval = False
    for curve, name, color, run_bands in zip(data, names, colors, bands):
        if run_bands:  # a population: per variant, the members' mean with a min-max band; x = steps per member
            for variant, band in run_bands.items():
                band_color = color if len(run_bands) == 1 else f"C{color_index % 10}"
                color_index += len(run_bands) > 1
                label = f"{name} {variant}".strip() + " (member mean, band: min-max)"
                timed = curve["timed"] and all(b[1] is not None for b in band)
                for ax, x in ((by_steps, 0), (by_wall, 1))[:1 + timed]:
                    ax.plot([b[x] for b in band], [b[2] for b in band], color=band_color, lw=1.5,
                            label=label if x == 0 else None)
                    ax.fill_between([b[x] for b in band], [b[3] for b in band], [b[4] for b in band],
                                    color=band_color, alpha=0.2, lw=0)
            continue  # its evaluation rows count all members' steps, not a member's: not drawn on these axes
        for ax, x in ((by_steps, 0), (by_wall, 1))[:1 + curve["timed"]]:  # a run logged before time/elapsed_s: steps
            ax.plot([p[x] for p in curve["train"]], [p[2] for p in curve["train"]], color=color, lw=1.5, label=name)
            if curve["eval"]:
                drew_eval = True
                ax.errorbar([p[x] for p in curve["eval"]], [p[2] for p in curve["eval"]],
                            yerr=[p[3] for p in curve["eval"]], fmt="o", color=color, ms=5, capsize=3, lw=1)
    return color_index, drew_eval


def learning_curve_figure(run_dirs: list[str | Path]):
    """The matplotlib Figure (on an Agg canvas) of ``run_dirs``' learning curves: per env, one row of panels
    ``[by steps, by wall]`` (runs of different envs never share axes).

    Raises UserError for a directory without ``metrics.jsonl`` and ImportError when matplotlib is missing.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    run_dirs = [Path(p) for p in run_dirs]
    rows = [read_rows(p) for p in run_dirs]
    data = [curves([row for row in run_rows if "member" not in row]) for run_rows in rows]
    bands = [member_bands(run_rows) for run_rows in rows]
    names = [p.name for p in run_dirs]  # each run's directory name; their paths where two share one (a/run and b/run)
    names = [str(p) for p in run_dirs] if len(set(names)) < len(names) else names
    colors = [f"C{i % 10}" for i in range(len(run_dirs))]
    groups: dict = {}  # per env (its config.yaml's, written before the first metric; "": unknown), its runs
    for i, run_dir in enumerate(run_dirs):
        groups.setdefault(str(read_record(run_dir / "config.yaml").get("env") or ""), []).append(i)
    fig = Figure(figsize=(12, 4.5 * len(groups)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(groups), 2, sharey="row", squeeze=False)
    color_index = len(run_dirs)
    for (env, members), (by_steps, by_wall) in zip(groups.items(), axes):
        pick = lambda items: [items[i] for i in members]  # noqa: E731
        color_index, drew_eval = _draw_runs(by_steps, by_wall, pick(data), pick(bands), pick(names), pick(colors),
                                            color_index)
        by_steps.set_xlabel("env steps (per member, for a population)" if any(pick(bands)) else "env steps")
        by_wall.set_xlabel("wall time (s)")
        by_steps.set_ylabel("mean episode return (last 100 episodes)")
        for ax in (by_steps, by_wall):
            ax.grid(alpha=0.3)
        if len(groups) > 1:
            by_steps.set_title(env or "env unknown", loc="left")
        handles, labels = by_steps.get_legend_handles_labels()
        if drew_eval:
            handles.append(Line2D([], [], color="0.3", marker="o", ls="none", label="evaluation (mean ± std)"))
            labels.append("evaluation (mean ± std)")
        if handles:
            by_steps.legend(handles, labels, fontsize="small", loc="best")
    fig.suptitle(next(iter(groups)) or "learning curves" if len(groups) == 1 else "learning curves")
    return fig


def plot_runs(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Write the learning curves of ``run_dirs`` to the PNG ``out``. Returns its path.

    ``out`` an existing directory: ``out/learning_curves.png``; without an extension: ``out.png``. Raises UserError
    for a directory without ``metrics.jsonl`` or an extension matplotlib cannot write, and ImportError when matplotlib
    is missing.
    """
    out = Path(out)
    if out.is_dir():
        out = out / "learning_curves.png"
    elif not out.suffix:
        out = out.with_name(out.name + ".png")
    fig = learning_curve_figure(run_dirs)
    formats = fig.canvas.get_supported_filetypes()
    if out.suffix[1:].lower() not in formats:
        raise UserError(f"cannot write a plot to {brief(str(out))}: unsupported extension {brief(out.suffix)}; use "
                        f"one of {', '.join('.' + name for name in sorted(formats))}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def write_run_plot(run_dir: str | Path) -> Path | None:
    """``run_dir/learning_curve.png`` at the end of a run. Never raises: a run that trained is not failed by its
    plot; a missing matplotlib, or any other failure, is one warning line."""
    try:
        return plot_runs([run_dir], Path(run_dir) / "learning_curve.png")
    except ImportError:
        print_line("fastrl: warning: no learning_curve.png: matplotlib is not installed (pip install matplotlib, or "
                   "--plot false)")
    except Exception as e:  # noqa: BLE001  (the run's files are written; the plot is an extra)
        print_line(f"fastrl: warning: no learning_curve.png: {type(e).__name__}: {first_line(e)}")
    return None


def plot_main(argv: list[str]) -> int:
    """``fastrl plot RUN [RUN ...] [--out FILE]``."""
    from fastrl.errors import ArgParser
    parser = ArgParser(prog="fastrl plot", description="Plot the learning curves of one or more runs into one PNG: mean "
                    "episode return against env steps and against wall time, evaluations marked.")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directories (each holds metrics.jsonl)")
    parser.add_argument("--out", default=None, help="PNG to write (default: RUN/learning_curve.png for one run, "
                                                    "learning_curves.png in the current directory for several)")
    args = parser.parse_args(argv)
    out = args.out or (Path(args.runs[0]) / "learning_curve.png" if len(args.runs) == 1 else "learning_curves.png")
    try:
        path = plot_runs(args.runs, out)
    except ImportError:
        raise UserError("matplotlib is not installed; pip install matplotlib") from None
    except OSError as e:
        raise UserError(f"could not write {out}: {e.strerror or e}") from None
    print(path)
    return 0

"""Run outputs for people: metric names (one per figure, CleanRL's), the final evaluation in every sink,
``learning_curve.png`` and ``fastrl plot``, and ``--capture-video``."""
import json
import sys

import pytest

from conftest import train_main
from fastrl.config import make_config
from fastrl.run.plot import curves, learning_curve_figure, read_rows, write_run_plot

TINY = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-epochs", "1", "--torch-threads", "1",
        "--device", "cpu", "--wandb", "disabled", "--no-progress"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two short CartPole runs: "shown" (TensorBoard, periodic and final evaluation, the default plot, videos) and
    "bare" (no plot, no evaluation, no TensorBoard)."""
    root = tmp_path_factory.mktemp("runs")
    assert train_main(TINY + ["--total-steps", "512", "--eval-interval", "2", "--eval-episodes", "2",
                              "--eval-seeds", "1", "--capture-video", "--tensorboard", "--run-dir",
                              str(root / "shown")]) == 0
    assert train_main(TINY + ["--total-steps", "256", "--seed", "2", "--eval-episodes", "0", "--no-plot",
                              "--no-tensorboard", "--run-dir", str(root / "bare")]) == 0
    return root / "shown", root / "bare"


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------ metric names
def test_one_name_per_metric_and_the_final_evaluation_row(runs):
    shown, bare = runs
    rows = _rows(shown)
    training = [r for r in rows if "charts/SPS" in r]
    assert [r["global_step"] for r in training] == [128, 256, 384, 512]
    for row in training:
        assert {"charts/episodic_return", "charts/episodic_length", "charts/episodes", "charts/SPS",
                "charts/learning_rate", "time/elapsed_s", "losses/policy_loss"} <= row.keys(), row.keys()
        assert not {"sps", "episode_return_mean", "episode_length_mean", "episodes", "episode_window_full"} & row.keys()
        assert row["charts/episodic_return"] == row["charts/episodic_length"], "CartPole: +1 per step"
        # under 100 episodes the window holds every finished episode: their steps are a whole number, at most the
        # steps taken (the 4 envs' unfinished episodes hold the rest)
        assert not row["charts/episode_window_full"] and row["charts/episodes"] >= 1, row
        finished_steps = row["charts/episodes"] * row["charts/episodic_length"]
        assert finished_steps == pytest.approx(round(finished_steps)) and finished_steps <= row["global_step"], row
    episodes = [r["charts/episodes"] for r in training]
    assert episodes == sorted(episodes), "charts/episodes counts every episode finished so far"
    elapsed = [r["time/elapsed_s"] for r in training]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    assert [r["global_step"] for r in rows if "eval/return_mean" in r] == [256, 512, 512]  # periodic x2, final
    summary = json.loads((shown / "summary.json").read_text())
    assert rows[-1] == {"global_step": 512, "eval/return_mean": summary["eval_return_mean"],
                        "eval/return_std": summary["eval_return_std"]}
    assert all("eval/return_mean" not in r for r in _rows(bare)), "no evaluation asked, none logged"


def test_final_evaluation_reaches_tensorboard(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    shown, _ = runs
    events = EventAccumulator(str(shown / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "eval/return_mean"} <= tags
    assert not {"sps", "episode_return_mean"} & tags
    final = [e for e in events.Scalars("eval/return_mean") if e.step == 512]
    summary = json.loads((shown / "summary.json").read_text())
    assert final and final[-1].value == pytest.approx(summary["eval_return_mean"])


# ------------------------------------------------------------------------------------------ plots
def test_every_run_writes_its_learning_curve_unless_told_not_to(runs):
    shown, bare = runs
    png = (shown / "learning_curve.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    assert not (bare / "learning_curve.png").exists()


def test_curves_stitch_resumed_clocks_and_read_old_names(tmp_path):
    lines = [{"global_step": 100, "time/elapsed_s": 1.0, "charts/episodic_return": 10.0},
             {"global_step": 200, "time/elapsed_s": 2.0, "charts/episodic_return": 20.0, "eval/return_mean": 25.0,
              "eval/return_std": 1.5},
             {"global_step": 300, "time/elapsed_s": 0.5, "charts/episodic_return": 30.0},  # a resume: a new clock
             {"global_step": 300, "eval/return_mean": 40.0, "eval/return_std": 2.0},       # the final evaluation
             {"global_step": 400, "episode_return_mean": 50.0}]                           # a row of an older version
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + '\n{"global_step": 5')
    got = curves(read_rows(tmp_path))
    assert got["train"] == [(100, 1.0, 10.0), (200, 2.0, 20.0), (300, 2.5, 30.0), (400, 2.5, 50.0)]
    assert got["eval"] == [(200, 2.0, 25.0, 1.5), (300, 2.5, 40.0, 2.0)]
    assert got["timed"] is True


def test_figure_shares_axes_across_runs_with_a_legend_by_run_name(runs):
    shown, bare = runs
    fig = learning_curve_figure([shown, bare])
    by_steps, by_wall = fig.axes
    assert by_steps.get_xlabel() == "env steps" and by_wall.get_xlabel() == "wall time (s)"
    legend = [t.get_text() for t in by_steps.get_legend().get_texts()]
    assert legend == ["shown", "bare", "evaluation (mean ± std)"]
    train_lines = [line for line in by_steps.get_lines() if line.get_label() in ("shown", "bare")]
    assert [list(line.get_xdata()) for line in train_lines] == [[128, 256, 384, 512], [128, 256]]
    shown_rows = [r for r in _rows(shown) if "charts/SPS" in r]
    assert list(train_lines[0].get_ydata()) == [r["charts/episodic_return"] for r in shown_rows]
    wall_lines = [line for line in by_wall.get_lines() if line.get_label() == "shown"]
    assert list(wall_lines[0].get_xdata()) == [r["time/elapsed_s"] for r in shown_rows]
    marked = [(list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata())) for c in by_steps.containers]
    evals = [r for r in _rows(shown) if "eval/return_mean" in r]
    assert marked == [([r["global_step"] for r in evals], [r["eval/return_mean"] for r in evals])], "one run evaluated"


def test_runs_of_different_envs_get_their_own_axes(runs, tmp_path):
    """A run of another env is drawn on a row of its own; a row whose runs were not evaluated has no evaluation
    entry in its legend."""
    import shutil
    shown, bare = runs
    other = tmp_path / "other"
    shutil.copytree(bare, other)
    config = (other / "config.yaml").read_text()
    (other / "config.yaml").write_text(config.replace("env: CartPole-v1", "env: Acrobot-v1"))
    assert "env: Acrobot-v1" in (other / "config.yaml").read_text()
    fig = learning_curve_figure([shown, other, bare])
    assert len(fig.axes) == 4
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes[::2]]
    assert legends == [["shown", "bare", "evaluation (mean ± std)"], ["other"]]
    assert [ax.get_title(loc="left") for ax in fig.axes[::2]] == ["CartPole-v1", "Acrobot-v1"]


def test_a_population_gets_no_empty_evaluation_legend_entry(tmp_path):
    """A population's evaluation rows count all members' steps, so its axes (steps per member) show no evaluation
    points, and so no evaluation legend entry."""
    run = tmp_path / "pop"
    run.mkdir()
    rows = [{"global_step": 256 * k, "time/elapsed_s": float(k), "charts/episodic_return": 10.0 * k} for k in (1, 2)]
    rows += [{"global_step": 256 * k, "member": m, "member_step": 128 * k, "time/elapsed_s": float(k),
              "charts/episodic_return": 10.0 * k + m} for k in (1, 2) for m in (0, 1)]
    rows.append({"global_step": 512, "eval/return_mean": 30.0, "eval/return_std": 1.0})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    fig = learning_curve_figure([run])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["pop (member mean, band: min-max)"]


def test_fastrl_plot_command(runs, tmp_path, capsys):
    from fastrl.cli import main
    shown, bare = runs
    out = tmp_path / "both.png"
    assert main(["plot", str(shown), str(bare), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes().startswith(PNG_MAGIC)
    for argv, needle in ([["plot", str(tmp_path / "nothing")], "holds no metrics.jsonl"],
                         [["plot"], "required"]):
        assert main(argv) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith("fastrl plot: error:") and needle in err[0], err


def test_a_missing_matplotlib_is_one_warning_not_a_failure(runs, tmp_path, monkeypatch, capsys):
    from fastrl.cli import main
    shown, _ = runs
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib... raises ImportError
    target = tmp_path / "run"
    target.mkdir()
    (target / "metrics.jsonl").write_bytes((shown / "metrics.jsonl").read_bytes())
    assert write_run_plot(target) is None
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "matplotlib is not installed" in err[0], err
    assert not (target / "learning_curve.png").exists()
    assert main(["plot", str(target)]) == 2
    assert "pip install matplotlib" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ videos
def test_capture_video_records_the_first_evaluation_episodes(runs):
    imageio = pytest.importorskip("imageio")
    shown, bare = runs
    videos = sorted((shown / "videos").glob("*.mp4"))
    assert [p.name for p in videos] == ["episode_0.mp4", "episode_1.mp4"]  # min(3, eval_episodes=2)
    for path in videos:
        reader = imageio.get_reader(path)
        frames = [frame for frame in reader]
        assert reader.get_meta_data()["fps"] == 50  # CartPole's render_fps
        assert 2 <= len(frames) <= 501 and frames[0].shape == (400, 600, 3)
        assert any((frames[0] != f).any() for f in frames[1:]), "the cart never moved"
    assert not (bare / "videos").exists()


def test_video_episodes_are_the_deterministic_policy_on_the_eval_seeds(runs):
    """Replaying the run's final weights deterministically on Gymnasium's CartPole-v1 from the first eval seeds gives
    episodes exactly as long as the videos (a frame per step, plus the first)."""
    import gymnasium
    import imageio
    import torch

    from fastrl.run.checkpoint import load_checkpoint
    from fastrl.envs.batched import make_env
    from fastrl.run.evaluate import eval_seed
    from fastrl.learn.models import make_agent
    shown, _ = runs
    state = load_checkpoint(shown)
    cfg = make_config(state["config"])
    probe = make_env(cfg, n_envs=1, training=False)
    agent = make_agent(cfg, probe.observation_shape, probe.action_spec)
    probe.close()
    agent.load_state_dict(state["model"])
    agent.eval()
    env = gymnasium.make("CartPole-v1")
    for i in range(2):
        obs, _ = env.reset(seed=eval_seed(cfg.seed, 0) + i)
        steps, done = 0, False
        with torch.no_grad():
            while not done:
                action = int(agent.act_deterministic(torch.as_tensor(obs).unsqueeze(0))[0])
                obs, _, terminated, truncated, _ = env.step(action)
                steps, done = steps + 1, terminated or truncated
        assert imageio.get_reader(shown / "videos" / f"episode_{i}.mp4").count_frames() == steps + 1


def test_videos_say_in_one_line_why_they_cannot_be_made(tmp_path, monkeypatch, capsys):
    import dataclasses

    from fastrl.run.evaluate import record_videos
    cfg = make_config({})
    no_gymnasium_twin = dataclasses.replace(cfg, env="EnvPoolOnly-v5")
    assert record_videos(None, no_gymnasium_twin, None, tmp_path / "v", "cpu") == []
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "EnvPoolOnly-v5" in err[0] and "EnvPool envs do not render" in err[0], err
    monkeypatch.setitem(sys.modules, "imageio", None)
    assert record_videos(None, cfg, None, tmp_path / "v", "cpu") == []
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and 'pip install -e ".[video]"' in err[0], err
    assert not (tmp_path / "v").exists()


def test_a_render_failure_is_one_line_and_leaves_no_files(tmp_path, monkeypatch, capsys):
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    from fastrl.run.evaluate import record_videos

    def no_display(self):
        raise RuntimeError("no GL context\nsecond line")

    monkeypatch.setattr(CartPoleEnv, "render", no_display)
    assert record_videos(None, make_config({}), None, tmp_path / "v", "cpu") == []
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["fastrl: warning: no videos: CartPole-v1 cannot render: RuntimeError: no GL context"]
    assert not (tmp_path / "v").exists()


# Two user envs whose action mask leaves one valid action a step (push the cart the way the pole leans), so the
# masked deterministic policy's episode is known whatever its weights: a Dict observation with an ``action_mask``
# entry, and sb3-contrib's ``action_masks()`` method on a plain observation.
def _forced_action(state) -> int:
    return int(state[2] > 0)


def _forced_mask(state):
    import numpy as np
    mask = np.zeros(2, dtype=np.int8)
    mask[_forced_action(state)] = 1
    return mask


def _cartpole_class():
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv
    return CartPoleEnv


class DictMaskedCartPole(_cartpole_class()):
    def __init__(self, render_mode=None):
        import gymnasium
        super().__init__(render_mode=render_mode)
        self.observation_space = gymnasium.spaces.Dict({"observation": self.observation_space,
                                                        "action_mask": gymnasium.spaces.MultiBinary(2)})

    def _dict(self, obs):
        return {"observation": obs, "action_mask": _forced_mask(self.state)}

    def reset(self, **kwargs):
        obs, info = super().reset(**kwargs)
        return self._dict(obs), info

    def step(self, action):
        obs, *rest = super().step(action)
        return (self._dict(obs), *rest)


class MaskableCartPole(_cartpole_class()):
    def action_masks(self):
        return _forced_mask(self.state).astype(bool)


@pytest.mark.parametrize("env_class", [DictMaskedCartPole, MaskableCartPole])
def test_videos_of_a_user_env_class_with_action_masks(env_class, tmp_path):
    """A user's own env class renders too, its observations handed to the policy as training's are: each video is
    exactly the episode the only valid actions make (a frame per step, plus the first)."""
    import gymnasium
    import imageio

    import fastrl
    from fastrl.run.evaluate import eval_seed
    run = fastrl.train(env=env_class, total_steps=128, n_envs=4, n_steps=16, n_epochs=1, eval_episodes=2,
                       capture_video=True, run_dir=tmp_path / "run", progress=False, wandb="disabled",
                       tensorboard=False, plot=False, quiet=True)
    videos = sorted((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [p.name for p in videos] == ["episode_0.mp4", "episode_1.mp4"]
    env = gymnasium.wrappers.TimeLimit(_cartpole_class()(), 5_000)
    for i, path in enumerate(videos):
        env.reset(seed=eval_seed(run.agent.config.seed, 0) + i)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(_forced_action(env.unwrapped.state))
            steps, done = steps + 1, terminated or truncated
        assert 5 < steps < 5_000
        assert imageio.get_reader(path).count_frames() == steps + 1

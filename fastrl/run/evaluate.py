"""Evaluation on separate envs, batched: ``seeds`` x ``episodes`` episodes in one batched env, the policy's mode
(or samples); and videos of it.

Every evaluation is bounded: an episode still running after ``eval_max_episode_steps`` steps counts its return so
far, and the whole evaluation stops after ``eval_max_steps`` env steps (every env of the batch counts each step);
one line says what was cut. A stop signal (``should_stop``) ends it between two steps with ``EvaluationStopped``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fastrl.envs.batched import make_env
from fastrl.envs.masks import (env_action_masks, masked_observation, masked_observation_space,
                               with_action_mask)
from fastrl.envs.spaces import action_spec_of, observation_format, pack_observation
from fastrl.errors import first_line, print_line

VIDEO_EPISODES = 3  # episodes recorded by capture_video (fewer when eval_episodes is smaller)
PROGRESS_EVERY_S = 5.0  # a labelled evaluation prints a progress line this often


class EvaluationStopped(Exception):
    """A stop signal arrived while an evaluation was running; its episodes are abandoned."""


def eval_seed(run_seed: int, k: int = 0, episodes: int = 0) -> int:
    """The first env seed of evaluation seed group ``k`` (``episodes`` envs each); its env j is seeded
    ``eval_seed(run_seed, k, episodes) + j``. Disjoint from the training envs' seeds.

    The groups are contiguous so that one batched env of ``seeds * episodes`` envs holds them all: EnvPool seeds env
    i of a pool with ``seed + i`` and takes no per-env seed list. Group 0 (the videos' seeds) is what it was before
    evaluation was batched; groups k >= 1 were spaced 10,007 apart then, which one pool cannot reproduce.
    """
    return (run_seed * 100_003 + 700_000_000) % (2**31 - 1) + k * episodes


def _policy_action(agent, obs: torch.Tensor, device: torch.device, deterministic: bool, state=None,
                   episode_start=None) -> tuple:
    """``(action, state)``: a recurrent policy (``act``) carries ``state``, zeroed where ``episode_start``; others
    keep none (``state`` None)."""
    obs = obs.to(device, non_blocking=True)
    if hasattr(agent, "state_size"):
        action, state = agent.act(obs, state, None if episode_start is None else episode_start.to(device), deterministic)
        return action.cpu(), state
    action = agent.act_deterministic(obs) if deterministic else agent.get_action_and_value(obs)[0]
    return action.cpu(), None


def play_first_episodes(agent, env, device: torch.device, max_steps: int = 100_000,
                        deterministic: bool = True, max_total_steps: int | None = None, should_stop=None,
                        label: str | None = None) -> torch.Tensor:
    """Step every env of the batched ``env`` together until each has finished its first episode, for at most
    ``max_steps`` steps (the cap per episode) and ``max_total_steps`` env steps in all (``steps * n_envs``). Returns
    each env's first-episode return, float64 ``[env.n_envs]``; an episode still running at a cap counts its return
    so far.

    Per step: one policy forward over the whole batch, one env step, and masked bookkeeping on ``[N]`` CPU tensors
    (no per-env Python loop). Envs that finished early keep stepping with the rest (auto-reset), their later
    episodes masked out. ``should_stop()`` true between two steps raises ``EvaluationStopped``. ``label``: print a
    progress line every ``PROGRESS_EVERY_S`` seconds, and say what a cap cut, under that name (unlabelled, only the
    cut is said).
    """
    n_envs = env.n_envs
    if max_total_steps:
        max_steps = max(1, min(max_steps, max_total_steps // n_envs))
    obs = env.reset()
    state, episode_start = None, None  # a recurrent policy's; next-step auto-reset: see fastrl.run.recurrent
    finished = torch.zeros(n_envs, dtype=torch.bool)
    episode_return = torch.zeros(n_envs, dtype=torch.float64)
    start = next_report = time.perf_counter()
    next_report += PROGRESS_EVERY_S
    steps = 0
    while steps < max_steps:
        if should_stop is not None and should_stop():
            raise EvaluationStopped
        action, state = _policy_action(agent, obs, device, deterministic, state, episode_start)
        step = env.step(action)
        episode_start = ~step.valid
        steps += 1
        episode_return += step.reward.double() * ~finished
        finished |= step.done
        obs = step.observation
        if bool(finished.all()):
            break
        if label and time.perf_counter() >= next_report:
            next_report += PROGRESS_EVERY_S
            print(f"fastrl: {label}: {int(finished.sum())}/{n_envs} episodes done after {steps:,} steps "
                  f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    cut = n_envs - int(finished.sum())
    if cut:
        print(f"fastrl: {label or 'evaluation'}: cut {cut} of {n_envs} episodes at {steps:,} steps (the cap: "
              f"eval_max_episode_steps, and eval_max_steps over all envs); their returns so far count",
              file=sys.stderr, flush=True)
    return episode_return


def describe(cfg, episodes: int, seeds: int) -> str:
    """What an evaluation plays, in words: ``10 episodes (5 seeds x 2), deterministic policy, at most ...``."""
    rule = "deterministic policy" if cfg.eval_deterministic else "sampled actions"
    return (f"{seeds * episodes} episodes ({seeds} seed{'s' * (seeds != 1)} x {episodes}), {rule}, at most "
            f"{cfg.eval_max_episode_steps:,} steps each and {cfg.eval_max_steps:,} in all")


@torch.no_grad()
def evaluate(agent, cfg, normalizer_state: dict | None, episodes: int, seeds: int, device: torch.device,
             max_steps: int | None = None, deterministic: bool | None = None, max_total_steps: int | None = None,
             should_stop=None, label: str | None = None) -> torch.Tensor:
    """Play ``seeds`` x ``episodes`` episodes at once: one batched env of ``seeds * episodes`` envs, each
    contributing its first episode. Returns the returns, float64 ``[seeds * episodes]``, seed group by seed group
    (env ``k * episodes + j`` is seeded ``eval_seed(cfg.seed, k, episodes) + j``).

    ``deterministic``: the policy's mode (argmax / mean); False samples. ``max_steps`` (per episode) and
    ``max_total_steps`` (all envs together) cap the evaluation; None takes ``cfg.eval_deterministic``,
    ``cfg.eval_max_episode_steps`` and ``cfg.eval_max_steps``. ``should_stop``, ``label``: see
    ``play_first_episodes``. Its twin in tests/test_evaluate.py plays one seed group after another; for a
    deterministic policy both give the same returns.
    """
    from fastrl.envs.batched import probe_env
    from fastrl.run.footprint import check_eval_memory
    max_steps = cfg.eval_max_episode_steps if max_steps is None else max_steps
    deterministic = cfg.eval_deterministic if deterministic is None else deterministic
    max_total_steps = cfg.eval_max_steps if max_total_steps is None else max_total_steps
    shape, dtype, _ = probe_env(cfg)
    check_eval_memory(seeds * episodes, shape, dtype, f"an evaluation of {seeds} seeds x {episodes} episodes")
    env = make_env(cfg, n_envs=seeds * episodes, seed=eval_seed(cfg.seed), training=False)  # frozen normalizer
    if normalizer_state is not None:
        env.load_state_dict(normalizer_state)
    try:
        return play_first_episodes(agent, env, device, max_steps, deterministic, max_total_steps, should_stop, label)
    finally:
        env.close()


def _skip_video(reason: str) -> list:
    print_line(f"fastrl: warning: no videos: {reason}")
    return []


def _video_observation(obs, form, cfg, normalizer_state: dict | None, action_masks=None) -> torch.Tensor:
    """One Gymnasium observation as the batched env hands it to the policy: ``[1, *form.shape]`` (a Dict packed, an
    ``action_masks()`` env's mask appended, a MiniGrid or channels-last image channels first, float64 as float32),
    normalized with the frozen statistics like evaluation's. ``form``: the env's ``ObservationFormat``."""
    if action_masks is not None:
        obs = masked_observation(obs, with_action_mask({}, action_masks))
    if form.layout is not None:
        tensor = pack_observation(obs, form.layout, batched=False)
    elif form.image_key is not None:
        tensor = torch.from_numpy(np.asarray(obs[form.image_key])).permute(2, 0, 1)
    else:
        tensor = torch.from_numpy(np.atleast_1d(obs))  # a Discrete observation: its integer, as [1]
        tensor = tensor.permute(2, 0, 1) if form.hwc else tensor
        tensor = tensor.float() if tensor.dtype == torch.float64 else tensor
    tensor = tensor.unsqueeze(0)
    if cfg.normalize_obs and normalizer_state is not None:
        rms = normalizer_state["obs_rms"]
        tensor = ((tensor.double() - rms["mean"]) / torch.sqrt(rms["var"] + 1e-8)).clamp_(-cfg.obs_clip, cfg.obs_clip).float()
    return tensor


def _render_env(env_id: str):
    """``(env, None)``: a Gymnasium env of the run's ``env`` (an id, or a ``module:Name`` class or factory) in
    ``rgb_array`` mode; ``(None, why)`` where there is none."""
    import gymnasium
    from fastrl.envs.registry import resolve_env
    from fastrl.envs.torch_envs import TorchEnvSpec
    lookup_id, factory = resolve_env(env_id)
    if isinstance(factory, TorchEnvSpec):
        return None, f"{env_id} is a torch-native env (a TorchEnvSpec), which has no renderer"
    if factory is None and lookup_id not in gymnasium.registry:
        return None, f"{env_id} has no Gymnasium env of that id to render it (EnvPool envs do not render)"
    try:
        if factory is None:
            return gymnasium.make(lookup_id, render_mode="rgb_array"), None
        env = factory(render_mode="rgb_array")
    except (gymnasium.error.Error, ImportError, TypeError) as e:
        return None, f"Gymnasium could not build {env_id} to render it: {first_line(e, '?')}"
    if not isinstance(env, gymnasium.Env):  # a vector env's factory
        env.close()
        return None, f"{env_id} is a vector env, which fastrl does not render"
    return env, None


@torch.no_grad()
def record_videos(agent, cfg, normalizer_state: dict | None, video_dir, device: torch.device,
                  episodes: int | None = None, max_frames: int = 5_000) -> list[Path]:
    """Record the deterministic policy's first ``episodes`` evaluation episodes of the first eval seed (default
    ``min(3, eval_episodes)``, or 3) to ``video_dir/episode_<i>.mp4``; returns the files written.

    EnvPool envs do not render, so the frames come from a Gymnasium env of the same id (or the user's own
    ``module:Name`` class or factory, called with ``render_mode``) in ``rgb_array`` mode, its observations handed to
    the policy as training's batched env hands them (Dict observations packed, ``action_masks()`` read),
    reset with the seeds evaluation gives its Gymnasium envs (the same episodes as the final evaluation when it ran
    on Gymnasium). An episode longer than ``max_frames`` steps is cut there. When the env cannot render or
    imageio is not installed, prints one warning line and returns [] (never fails the run).
    """
    try:
        import imageio
        import imageio_ffmpeg  # noqa: F401  (imageio's mp4 writer)
    except ImportError:
        return _skip_video('imageio and imageio-ffmpeg are not installed; pip install -e ".[video]"')
    import gymnasium
    episodes = episodes or min(VIDEO_EPISODES, cfg.eval_episodes or VIDEO_EPISODES)
    # Off-screen rendering: no display, and no pygame banner on stdout. The caller's own settings win.
    saved = {key: os.environ.get(key) for key in ("SDL_VIDEODRIVER", "PYGAME_HIDE_SUPPORT_PROMPT")}
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    env = None
    try:
        env, why = _render_env(cfg.env)
        if env is None:
            return _skip_video(why)
        if "rgb_array" not in env.metadata.get("render_modes", []):
            return _skip_video(f"{cfg.env} cannot render rgb_array frames")
        space = env.action_space
        action_masks = env_action_masks(env)
        observation_space = (masked_observation_space(env.observation_space, action_spec_of(space))
                             if action_masks is not None else env.observation_space)
        form = observation_format(observation_space, cfg.env)
        video_dir = Path(video_dir)
        fps = env.metadata.get("render_fps") or 30
        written = []
        for i in range(episodes):
            obs, _ = env.reset(seed=eval_seed(cfg.seed, 0) + i)
            try:
                frame = env.render()
            except Exception as e:  # noqa: BLE001  (pygame missing, no GL context for MuJoCo, ...)
                return _skip_video(f"{cfg.env} cannot render: {type(e).__name__}: {first_line(e, '?')}")
            video_dir.mkdir(parents=True, exist_ok=True)
            path = video_dir / f"episode_{i}.mp4"
            writer = imageio.get_writer(path, fps=fps, macro_block_size=2)
            try:
                writer.append_data(np.asarray(frame))
                state = None  # a recurrent policy's, from zeros each episode
                for _ in range(max_frames):
                    policy_obs = _video_observation(obs, form, cfg, normalizer_state, action_masks).to(device)
                    action, state = _policy_action(agent, policy_obs, device, True, state)
                    action = action[0]
                    if isinstance(space, gymnasium.spaces.Discrete):
                        action = int(action)
                    else:
                        action = np.clip(action.numpy(), space.low, space.high).astype(space.dtype)
                    obs, _, terminated, truncated, _ = env.step(action)
                    writer.append_data(np.asarray(env.render()))
                    if terminated or truncated:
                        break
            except RuntimeError as e:  # e.g. a Gymnasium twin whose observations differ from the training env's
                writer.close()
                path.unlink(missing_ok=True)
                return _skip_video(f"the policy could not play Gymnasium's {cfg.env}: {first_line(e, '?')}")
            finally:
                writer.close()  # idempotent
            written.append(path)
        return written
    finally:
        if env is not None:
            env.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

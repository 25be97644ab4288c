"""Callbacks: user code the run loop calls after every iteration (``fastrl.train(..., callbacks=[...])``).

A callback is any callable ``callback(metrics, run) -> bool | None``:

- ``metrics``: this iteration's figures as plain Python numbers: the update's (``losses/policy_loss``,
  ``charts/learning_rate``, ...) and the episode ones, under the names the logs use (``charts/episodic_return`` and
  ``charts/episodic_length``: last-100-episode means; ``charts/episodic_return_last``: the last episode's own return;
  ``charts/episodes``; once an episode has ended). The callbacks of a run share one dict, in order, so a callback can add
  figures for the ones after it (``EvalCallback`` adds ``eval/return_mean`` on the iterations it evaluates).
- ``run``: a ``RunContext``:

  - ``agent``: the policy as it is now, as an ``fastrl.Agent`` (what ``fastrl.load`` and ``Run.agent`` give: ``act``,
    ``predict``, ``evaluate``, ``save``; a snapshot of the weights, taken on first access each iteration);
  - ``policy``: the live ``nn.Module`` being trained (``get_action_and_value``, ``act_deterministic``; member 0's);
  - ``trainer``: the run loop's ``fastrl.run.trainer.Trainer`` (``buffer``: this iteration's ``[T, N]`` rollout,
    ``next_obs``; ``fastrl.to_torchrl(run.trainer.buffer, run.trainer.next_obs)`` is it in TorchRL's layout);
  - ``cfg`` (the run's ``Config``), ``global_step``, ``iteration``, ``run_dir`` (a ``Path``), ``is_main`` (rank 0),
    ``start_step`` (the step a resumed run started from);
  - ``log(metrics)``, which writes a row to every logging sink at the current step.

A callback with another signature stops the run at its first call as a ``False`` would (the summary is written),
then raises ``CallbackError``, one line naming the signature expected.

Returning ``False`` stops the run cleanly: the loop leaves after this iteration and ends as at the end of its budget
(final checkpoint, final evaluation, ``summary.json`` with ``stopped_by_callback: true``). Under torchrun every rank
calls its callbacks, and rank 0's verdict holds for all ranks.
"""
from __future__ import annotations

import inspect
import math
import os
from pathlib import Path

from fastrl.config import UserError
from fastrl.distributed import torchrun

BEST_CHECKPOINT = "best.pt"  # never matches checkpoint.list_checkpoints, so keep-last-N pruning and resume skip it


def best_checkpoint_path(run_dir: str | Path) -> Path:
    """``run_dir/checkpoints/best.pt``: the weights of ``EvalCallback``'s best evaluation."""
    return Path(run_dir) / "checkpoints" / BEST_CHECKPOINT


class RunContext:
    """What a callback sees of the run in progress. ``trainer`` is the run loop's trainer (see ``fastrl.run.loop``)."""

    def __init__(self, trainer, run_dir: Path, logger, is_main: bool, start_step: int, agent_type):
        """``agent_type``: ``fastrl.api.Agent`` (passed in, so this module does not import the API on top of it)."""
        self.trainer, self.run_dir, self.is_main, self.start_step = trainer, Path(run_dir), is_main, start_step
        self._logger, self._agent_type = logger, agent_type
        self._agent = None  # (global_step, Agent)

    @property
    def agent(self):
        """The policy now, as a ``fastrl.Agent`` (a snapshot of member 0's weights and normalizer at this step)."""
        trainer = self.trainer
        if self._agent is None or self._agent[0] != trainer.global_step:
            self._agent = (trainer.global_step, self._agent_type(trainer.member_state(0), trainer.cfg, trainer.device))
        return self._agent[1]

    @property
    def policy(self):
        """The live policy ``nn.Module`` being trained (``act_deterministic``, ``get_action_and_value``)."""
        return self.trainer.agent

    @property
    def cfg(self):
        return self.trainer.cfg

    @property
    def global_step(self) -> int:
        return self.trainer.global_step

    @property
    def iteration(self) -> int:
        return self.trainer.iteration

    def log(self, metrics: dict) -> None:
        """Log ``metrics`` at the current step (metrics.jsonl, TensorBoard, wandb); a no-op on other ranks than 0."""
        self._logger.log(metrics, self.trainer.global_step)


def check_callbacks(callbacks) -> tuple:
    """``callbacks`` (one callable or an iterable of them) as a tuple, or a one-line UserError."""
    if callbacks is None:
        return ()
    if callable(callbacks):
        return (callbacks,)
    try:
        callbacks = tuple(callbacks)
    except TypeError:
        raise UserError(f"callbacks must be a callable or a list of callables, got {callbacks!r}") from None
    for callback in callbacks:
        if not callable(callback):
            raise UserError(f"callback {callback!r} is not callable; a callback is a function (metrics, run) -> bool")
    return callbacks


SIGNATURE = "callback(metrics: dict, run: fastrl.run.callbacks.RunContext) -> bool | None"


class CallbackError(UserError):
    """A callback that cannot be called as ``SIGNATURE``: the run stops there, writes its summary, then raises it."""


def _takes_metrics_and_run(callback, metrics: dict, run: RunContext) -> bool:
    try:
        inspect.signature(callback).bind(metrics, run)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): the TypeError was its own
        return True
    return True


def run_callbacks(callbacks, metrics: dict, run: RunContext) -> bool:
    """Call every callback (each one, even after a False); True to go on. Rank 0 decides for every rank. A callback
    whose signature does not take ``(metrics, run)`` raises ``CallbackError``."""
    keep_going = True
    for callback in callbacks:
        try:
            verdict = callback(metrics, run)
        except TypeError as e:
            if _takes_metrics_and_run(callback, metrics, run):
                raise  # a TypeError inside the callback: its own bug
            name = getattr(callback, "__qualname__", type(callback).__name__)
            raise CallbackError(f"callback {name} cannot be called as {SIGNATURE} ({e}); give it that signature "
                                "(return False to stop the run)") from None
        if verdict is False:
            keep_going = False
    return bool(torchrun.broadcast_object(keep_going))


class EvalCallback:
    """Deterministic evaluation during training, as Stable-Baselines3's ``EvalCallback``.

    Every ``every_steps`` env steps (default 10,000; or, if given, every ``every_iterations`` iterations) it plays
    ``episodes`` episodes on each of ``seeds`` fresh evaluation envs of the run's env with the policy's mode
    (``deterministic=False``: sampled actions); logs ``eval/return_mean``, ``eval/return_std`` and
    ``eval/best_return_mean``; and, when the mean is the best so far, writes the full checkpoint to
    ``run_dir/checkpoints/best.pt`` (or ``best_model_save_path/best.pt``; atomically; never from non-finite weights).
    Load it with ``fastrl.load(run_dir, best=True)`` or resume from it. ``results`` lists ``(global_step, mean, std)``.
    Rank 0 alone evaluates.

    SB3's names work too: ``eval_freq`` (as in SB3, counted in vectorized steps: every ``eval_freq * n_envs`` env
    steps), ``n_eval_episodes`` (``episodes``), ``best_model_save_path`` and ``deterministic``. There is no
    ``eval_env``: the evaluation envs are fresh envs of the run's own env, seeded apart from the training envs.
    """

    TAKES = ("every_steps, every_iterations, episodes, seeds, save_best, deterministic, and SB3's eval_freq, "
             "n_eval_episodes, best_model_save_path")

    def __init__(self, every_steps: int | None = None, every_iterations: int = 0, episodes: int = 10, seeds: int = 1,
                 save_best: bool = True, *, deterministic: bool = True, eval_freq: int | None = None,
                 n_eval_episodes: int | None = None, best_model_save_path: str | os.PathLike | None = None,
                 **unsupported):
        if unsupported:
            raise UserError(f"EvalCallback takes no {', '.join(sorted(unsupported))}; it takes {self.TAKES}")
        if n_eval_episodes is not None:
            episodes = n_eval_episodes
        for name, value in (("every_steps", every_steps), ("every_iterations", every_iterations),
                            ("eval_freq", eval_freq), ("episodes", episodes), ("seeds", seeds)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise UserError(f"EvalCallback {name} must be an int >= 0, got {value!r} (it evaluates on fresh envs "
                                f"of the run's own env: there is no eval_env; it takes {self.TAKES})")
        if every_steps is not None and eval_freq is not None:
            raise UserError("EvalCallback: give every_steps (env steps) or eval_freq (SB3's, vectorized steps), not both")
        if every_steps is None and eval_freq is None and not every_iterations:
            every_steps = 10_000
        if not (every_steps or eval_freq or every_iterations):
            raise UserError("EvalCallback needs every_steps, eval_freq or every_iterations > 0")
        if episodes <= 0 or seeds <= 0:
            raise UserError(f"EvalCallback episodes and seeds must be > 0, got {episodes} and {seeds}")
        self.every_steps, self.every_iterations, self.eval_freq = every_steps or 0, every_iterations, eval_freq
        self.episodes, self.seeds, self.save_best, self.deterministic = episodes, seeds, save_best, deterministic
        self.best_model_save_path = Path(best_model_save_path) if best_model_save_path is not None else None
        self.best_return, self.best_step = -math.inf, None
        self.results: list[tuple[int, float, float]] = []
        self._last_period = None

    def _due(self, run: RunContext) -> bool:
        if self.every_iterations:
            return run.iteration % self.every_iterations == 0
        if self.eval_freq and not self.every_steps:
            self.every_steps = self.eval_freq * run.cfg.n_envs  # SB3 counts a step of all n_envs envs as one
        if self._last_period is None:
            self._last_period = run.start_step // self.every_steps
        period = run.global_step // self.every_steps
        due, self._last_period = period > self._last_period, max(period, self._last_period)
        return due

    def __call__(self, metrics: dict, run: RunContext) -> bool:
        if not self._due(run) or not run.is_main:
            return True
        from fastrl.run.evaluate import evaluate
        trainer = run.trainer
        returns = evaluate(trainer.agent, trainer.cfg, trainer.normalizer_state(), self.episodes, self.seeds,
                           trainer.device, deterministic=self.deterministic)
        mean, std = returns.mean().item(), returns.std(unbiased=False).item()
        self.results.append((run.global_step, mean, std))
        if mean > self.best_return and trainer.weights_finite():
            self.best_return, self.best_step = mean, run.global_step
            if self.save_best:
                from fastrl.run.checkpoint import save_checkpoint
                target = (self.best_model_save_path / BEST_CHECKPOINT if self.best_model_save_path is not None
                          else best_checkpoint_path(run.run_dir))
                save_checkpoint(trainer.state_dict(), target)
        figures = {"eval/return_mean": mean, "eval/return_std": std, "eval/best_return_mean": self.best_return}
        metrics.update(figures)
        run.log(figures)
        return True


class StopOnReturn:
    """Stop the run once ``metrics[key]`` reaches ``threshold`` (default: the last-100-episode mean return; with an
    ``EvalCallback`` listed before it, ``key="eval/return_mean"`` stops on the evaluation instead)."""

    def __init__(self, threshold: float, key: str = "charts/episodic_return"):
        self.threshold, self.key = float(threshold), key

    def __call__(self, metrics: dict, run: RunContext) -> bool:
        value = metrics.get(self.key)
        return value is None or value < self.threshold

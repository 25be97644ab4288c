"""The compiled rollout step (fastrl/run/rollout.py): the same rollout as the eager loop, and guards that never fire."""
import pytest
import torch

from fastrl.config import make_config
from fastrl.run.trainer import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", plot=False)


def _collect(compile_mode: str, iterations: int = 2, **overrides):
    cfg = make_config(dict(env="CartPole-v1", n_envs=4, n_steps=16, total_steps=4 * 16 * 4, seed=3,
                           compile=compile_mode, **QUIET, **overrides))
    trainer = Trainer(cfg)
    buffers = []
    for _ in range(iterations):
        trainer.collect()
        buffers.append(trainer.buffer.clone())
    stats = trainer.env.stats.state_dict()
    trainer.close()
    return trainer, buffers, stats


def _assert_same_rollouts(eager, compiled):
    for a, b in zip(eager, compiled):
        for key in ("observation", "action", "valid", ("next", "reward"), ("next", "done"), ("next", "terminated"),
                    ("next", "truncated")):
            assert torch.equal(a[key], b[key]), key
        for key in ("sample_log_prob", "state_value", ("next", "state_value")):
            torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-5)


def test_compiled_rollout_step_equals_the_eager_loop():
    """Same seed, same weights: the compiled step (forward, sampling, buffer writes) takes the eager loop's actions,
    so the envs see the same trajectories; log-probs and values agree to float rounding. The second iteration runs
    with guards skipped."""
    _, eager, eager_stats = _collect("off")
    trainer, compiled, compiled_stats = _collect("default")
    assert trainer.rollout_step is not None and trainer.rollout_step.compiled
    _assert_same_rollouts(eager, compiled)
    assert eager_stats["count"] == compiled_stats["count"]
    torch.testing.assert_close(eager_stats["returns"], compiled_stats["returns"])


def test_compile_auto_plans_the_rollout_by_run_length():
    """compile auto on CPU: the rollout step compiles only when the run has enough rollout steps to repay the
    compile. That the plan ignores the cache, and CUDA's plan: tests/test_update.py; the whole iteration's plan:
    tests/test_iteration.py."""
    from fastrl.run.compile import CPU_ROLLOUT_COMPILE_MIN_STEPS, CompilePlan, compile_plan
    cpu = torch.device("cpu")
    unfused = CPU_ROLLOUT_COMPILE_MIN_STEPS
    assert compile_plan("auto", cpu, 0, rollout_steps=unfused - 1).rollout == "off"
    assert compile_plan("auto", cpu, 0, rollout_steps=unfused).rollout == "default"
    assert compile_plan("off", cpu, 10**9, rollout_steps=10**9) == CompilePlan("off", "off", 1)

"""Batched evaluation (``fastrl.run.evaluate``): exact agreement with its per-seed twin and with plain one-env episodes,
first episodes only, truncation at ``max_steps``. Exact checks: a fixed policy, no learning."""
import pytest
import torch

from conftest import ManualClock
from fastrl.config import make_config
from fastrl.envs.batched import make_env
from fastrl.run.evaluate import eval_seed, evaluate, play_first_episodes

CPU = torch.device("cpu")
BALANCING, DRIFTING = [0.0, 0.0, 1.0, 0.1], [0.5, 0.0, 1.0, 0.1]


class LeanPolicy(torch.nn.Module):
    """CartPole: push right when ``obs @ weights > 0``. BALANCING holds the pole until the env's 500-step time limit
    truncates the episode; DRIFTING lets the cart drift off the track after 150-500 steps, at times that differ
    between seeds (some reach the time limit)."""

    def __init__(self, weights):
        super().__init__()
        self.weights = torch.tensor(weights)

    def act_deterministic(self, obs):
        return (obs @ self.weights > 0).long()

    def get_action_and_value(self, obs):
        flip = torch.rand(obs.shape[0]) < 0.5
        action = self.act_deterministic(obs) ^ flip.long()
        return action, None, None, None


def _cfg(**overrides):
    return make_config(dict(env="CartPole-v1", seed=3, **overrides))


def _one_env_return(cfg, policy, seed: int, max_steps: int = 100_000) -> float:
    """The plainly right answer: one env of that seed, one episode, stepped by hand."""
    env = make_env(cfg, n_envs=1, seed=seed, training=False)
    obs, total = env.reset(), 0.0
    for _ in range(max_steps):
        step = env.step(policy.act_deterministic(obs))
        total += float(step.reward[0])
        obs = step.observation
        if bool(step.done[0]):
            break
    env.close()
    return total


@torch.no_grad()
def evaluate_per_seed(agent, cfg, episodes: int, seeds: int, max_steps: int | None = None) -> torch.Tensor:
    """``evaluate``'s reference twin: one env of ``episodes`` envs per seed group, the groups one after another."""
    results = []
    for k in range(seeds):
        env = make_env(cfg, n_envs=episodes, seed=eval_seed(cfg.seed, k, episodes), training=False)
        results.append(play_first_episodes(agent, env, CPU, cfg.eval_max_episode_steps if max_steps is None else
                                           max_steps, cfg.eval_deterministic))
        env.close()
    return torch.cat(results)


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_batched_equals_per_seed_twin_exactly(backend):
    cfg = _cfg(env_backend=backend)
    seeds, episodes = (3, 4) if backend == "envpool" else (2, 2)  # gymnasium: a worker process per env
    policy = LeanPolicy(DRIFTING)
    batched = evaluate(policy, cfg, None, episodes, seeds, CPU)
    twin = evaluate_per_seed(policy, cfg, episodes, seeds)
    assert batched.dtype == torch.float64 and batched.shape == (seeds * episodes,)
    assert torch.equal(batched, twin), (batched, twin)
    assert len(set(batched.tolist())) > 1, "precondition: episodes end at different times"


def test_each_env_contributes_its_first_episode():
    """Episodes of very different lengths: the short ones' envs auto-reset and play on while the long ones run; only
    each env's first episode counts, as a one-env run of the same seed gives it."""
    cfg = _cfg()
    seeds, episodes = 2, 3
    policy = LeanPolicy(DRIFTING)
    batched = evaluate(policy, cfg, None, episodes, seeds, CPU)
    expected = [_one_env_return(cfg, policy, eval_seed(cfg.seed, k, episodes) + j)
                for k in range(seeds) for j in range(episodes)]
    assert batched.tolist() == expected
    assert max(expected) >= 2 * min(expected), f"precondition: lengths differ enough to overlap resets: {expected}"
    assert 500.0 in expected, "precondition: an episode ends by the env's own time limit (truncated, not terminated)"


def test_first_group_keeps_the_pre_batching_seeds():
    assert eval_seed(7, 0, 10) == eval_seed(7) == (7 * 100_003 + 700_000_000) % (2**31 - 1)
    assert [eval_seed(7, k, 10) - eval_seed(7) for k in range(3)] == [0, 10, 20]


def test_truncation_at_max_steps():
    """Unfinished episodes count their return so far; finished ones keep theirs (CartPole: return = length)."""
    cfg = _cfg()
    drifting, balancing = LeanPolicy(DRIFTING), LeanPolicy(BALANCING)
    assert torch.equal(evaluate(balancing, cfg, None, 3, 2, CPU, max_steps=5), torch.full((6,), 5.0, dtype=torch.float64))
    full = evaluate(drifting, cfg, None, 3, 2, CPU)
    cut = int(full.median())
    assert full.min() < cut < full.max(), f"precondition: some episodes end before the cut, some after: {full}"
    truncated = evaluate(drifting, cfg, None, 3, 2, CPU, max_steps=cut)
    assert torch.equal(truncated, full.clamp(max=cut))
    assert torch.equal(truncated, evaluate_per_seed(drifting, cfg, 3, 2, max_steps=cut))


def test_sampled_actions_when_not_deterministic():
    """deterministic=False calls the policy's sampler (here: the lean rule with half the actions flipped), seeded by
    torch's global generator, so the same seed replays the same episodes."""
    cfg = _cfg()
    policy = LeanPolicy(BALANCING)
    torch.manual_seed(0)
    first = evaluate(policy, cfg, None, 4, 1, CPU, deterministic=False)
    torch.manual_seed(0)
    assert torch.equal(first, evaluate(policy, cfg, None, 4, 1, CPU, deterministic=False))
    assert first.max() < 500 and evaluate(policy, cfg, None, 4, 1, CPU).tolist() == [500.0] * 4, "flips drop the pole"


def test_play_first_episodes_counts_nothing_after_the_first_episode():
    """Two envs whose first episodes differ in length (one reaches the 500-step time limit): the shorter one's env
    plays on after its episode, and nothing it scores then counts."""
    cfg = _cfg()
    policy = LeanPolicy(DRIFTING)
    env = make_env(cfg, n_envs=2, seed=eval_seed(cfg.seed), training=False)
    returns = play_first_episodes(policy, env, CPU)
    env.close()
    assert returns.tolist() == [_one_env_return(cfg, policy, eval_seed(cfg.seed) + i) for i in range(2)]
    assert min(returns.tolist()) < 500.0 == max(returns.tolist()), returns


def test_per_evaluation_cap_cuts_every_env_and_says_so(capsys):
    """``max_total_steps`` counts every env of the batch: 60 steps over 6 envs are 10 steps each; a balancing pole
    (return = steps) scores exactly 10 everywhere, and one stderr line says what was cut."""
    cfg = _cfg()
    returns = evaluate(LeanPolicy(BALANCING), cfg, None, 3, 2, CPU, max_total_steps=60)
    assert returns.tolist() == [10.0] * 6
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "cut 6 of 6 episodes at 10 steps" in lines[0], lines


def test_caps_and_action_rule_default_to_the_config():
    """None takes ``eval_max_episode_steps``, ``eval_max_steps`` and ``eval_deterministic`` from the config."""
    policy = LeanPolicy(BALANCING)
    assert evaluate(policy, _cfg(eval_max_episode_steps=7), None, 2, 1, CPU).tolist() == [7.0, 7.0]
    assert evaluate(policy, _cfg(eval_max_steps=8), None, 2, 1, CPU).tolist() == [4.0, 4.0]
    torch.manual_seed(0)
    sampled = evaluate(policy, _cfg(eval_deterministic=False), None, 4, 1, CPU)
    torch.manual_seed(0)
    assert torch.equal(sampled, evaluate(policy, _cfg(), None, 4, 1, CPU, deterministic=False))
    assert sampled.max() < 500, "sampled actions (half flipped) drop the pole"


def test_stop_signal_ends_the_evaluation_between_two_steps():
    from fastrl.run.evaluate import EvaluationStopped
    asked = []

    def should_stop():
        asked.append(1)
        return len(asked) > 3

    with pytest.raises(EvaluationStopped):
        evaluate(LeanPolicy(BALANCING), _cfg(), None, 2, 1, CPU, should_stop=should_stop)
    assert len(asked) == 4, "checked before every step, stopped at the first true"


def test_a_labelled_evaluation_reports_progress(capsys, monkeypatch):
    import sys
    module = sys.modules["fastrl.run.evaluate"]
    monkeypatch.setattr(module, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(module, "time", ManualClock())  # no time passes: "(0 s)" whatever the machine's speed
    evaluate(LeanPolicy(BALANCING), _cfg(), None, 2, 1, CPU, max_steps=3, label="final evaluation")
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["fastrl: final evaluation: 0/2 episodes done after 1 steps (0 s)",
                         "fastrl: final evaluation: 0/2 episodes done after 2 steps (0 s)"], lines
    assert "cut 2 of 2 episodes at 3 steps" in lines[-1]

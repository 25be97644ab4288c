"""Recurrent policies (``recurrent: lstm | gru``): the model, the carried rollout state, column minibatches, the
update's unrolled forward, populations, the whole iteration, predict / evaluation / save-load.

Exact checks only: learning on position-only CartPole (LSTM against no memory) takes minutes on a CPU, so it is
benchmarks/recurrent.py's question.
"""
import copy

import numpy as np
import pytest
import torch
from conftest import one_line_error
from test_population import _assert_members_equal_single_runs, _one_iteration, aot_eager  # noqa: F401

import fastrl
from fastrl.config import make_config
from fastrl.learn.models import action_mode
from fastrl.learn.update import hand_gradient_applies, minibatch_index
from fastrl.run.trainer import Trainer

SMALL = {"env": "CartPole-v1", "total_steps": 4 * 64 * 3, "n_envs": 4, "n_steps": 64, "n_minibatches": 2,
         "n_epochs": 2, "recurrent": "lstm", "recurrent_size": 16, "hidden_sizes": [16], "compile": "off",
         "progress": False}

API_QUIET = {"wandb": "disabled", "tensorboard": False, "plot": False, "quiet": True}


def _collected(overrides: dict, iterations: int = 1) -> tuple:
    """A trainer after ``iterations`` iterations and one more rollout, and the agent that rolled it out (the whole
    iteration of the torch backend updates inside ``collect``)."""
    trainer = Trainer(make_config({**SMALL, **overrides}))
    for _ in range(iterations):
        trainer.collect()
        trainer.update()
    acting = trainer.layout.load_into(copy.deepcopy(trainer.agent), trainer.params[0].clone())
    trainer.collect()
    return trainer, acting


def _replay(trainer: Trainer, agent, columns: torch.Tensor):
    """The update's forward over the buffer's rollout of env ``columns``: whole T-step sequences from the stored start
    state, unrolled with the stored episode starts (rows time-major, as a minibatch holds them)."""
    buffer, n = trainer.buffer, trainer.buffer.shape[1]
    rows = (torch.arange(buffer.shape[0])[:, None] * n + columns[None]).reshape(-1)
    flat = {key: buffer[key].flatten(0, 1)[rows] for key in
            ("observation", "action", "episode_start", "recurrent_state", "sample_log_prob", "state_value")}
    state = flat["recurrent_state"][:len(columns)]
    with torch.no_grad():
        _, logp, _, value, _ = agent.get_action_and_value(flat["observation"], flat["action"], None, state,
                                                                  flat["episode_start"])
    return logp, value, flat


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["envpool", "torch"])
def test_unrolled_update_forward_reproduces_the_rollout_across_episode_boundaries(kind, backend):
    """Second rollout (a carried, non-zero start state), columns in a shuffled order: the unrolled forward's
    log-probabilities and values equal the step-by-step rollout's, episode starts inside the segment included. The
    torch backend's rollout is the whole iteration's (fastrl.run.iteration)."""
    trainer, acting = _collected({"recurrent": kind, "env_backend": backend}, iterations=1)
    assert (trainer.iteration_call is not None) == (backend == "torch")
    buffer = trainer.buffer
    assert bool(buffer["episode_start"][1:].any()), "no episode starts inside the segment: lengthen n_steps"
    assert float(buffer["recurrent_state"][0].abs().max()) > 0  # carried over from the first rollout
    logp, value, flat = _replay(trainer, acting, torch.tensor([2, 0, 3]))
    torch.testing.assert_close(logp, flat["sample_log_prob"], atol=1e-6, rtol=0)
    torch.testing.assert_close(value, flat["state_value"], atol=1e-6, rtol=0)
    # Without the resets the replay differs: the check can fail.
    _, no_reset, _ = acting.get_action_and_value(flat["observation"], flat["action"], None,
                                                        flat["recurrent_state"][:3])[:3]
    assert not torch.allclose(no_reset, flat["sample_log_prob"], atol=1e-4)


@pytest.mark.parametrize("env", ["fastrl_space_envs:PixelMatchSmall", "fastrl_space_envs:DictMatch"])
def test_conv_and_dict_encoders_replay_their_rollout(env):
    """A CNN encoder (small_cnn) and a Dict one (conv + MLP) under the core: the same exact replay (Gymnasium envs,
    8-step episodes, so episodes start inside the 16-step segment)."""
    trainer, acting = _collected({"env": env, "n_steps": 16, "total_steps": 4 * 16 * 3}, iterations=1)
    assert type(acting.base).__name__ == ("PixelActorCritic" if "Pixel" in env else "DictActorCritic")
    assert bool(trainer.buffer["episode_start"][1:].any())
    logp, value, flat = _replay(trainer, acting, torch.tensor([1, 3]))
    trainer.close()
    torch.testing.assert_close(logp, flat["sample_log_prob"], atol=1e-6, rtol=0)
    torch.testing.assert_close(value, flat["state_value"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", ["envpool", "torch"])
def test_episode_start_marks_each_episodes_first_observation(backend):
    """episode_start[t] = ~valid[t - 1] (the step before was the reset step), row 0 from the previous rollout's last
    row and all True on the first; the flagged observations are CartPole's fresh starts (every entry within 0.05)."""
    trainer = Trainer(make_config({**SMALL, "env_backend": backend}))
    trainer.collect()
    first = trainer.buffer.clone()
    assert bool(first["episode_start"][0].all())
    trainer.update()
    trainer.collect()
    buffer = trainer.buffer
    starts, valid = buffer["episode_start"], buffer["valid"]
    assert torch.equal(starts[1:], ~valid[:-1]) and torch.equal(starts[0], ~first["valid"][-1])
    assert int(starts[1:].sum()) > 0
    assert float(buffer["observation"][starts].abs().max()) <= 0.05
    assert float(buffer["observation"][~starts].abs().max()) > 0.05


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_state_is_zeroed_exactly_where_an_episode_starts(kind):
    """A step flagged episode_start computes from a zero state whatever the state given; unflagged, it does not."""
    torch.manual_seed(0)
    agent = Trainer(make_config({**SMALL, "recurrent": kind})).agent
    obs, state = torch.randn(3, 4), torch.randn(3, agent.state_size)
    starts = torch.tensor([True, False, True])
    _, logp, _, value, new = agent.get_action_and_value(obs, torch.tensor([0, 1, 1]), None, state, starts)
    _, logp0, _, value0, new0 = agent.get_action_and_value(obs, torch.tensor([0, 1, 1]), None, None, None)
    assert torch.equal(new[starts], new0[starts]) and torch.equal(value[starts], value0[starts])
    assert not torch.allclose(new[1], new0[1])


def test_minibatches_are_whole_env_columns():
    """Each minibatch is N / n_minibatches whole columns, their T rows time-major; an epoch covers every column once."""
    t, n, m = 5, 6, 3
    index = minibatch_index(t * n, 2, m, torch.Generator().manual_seed(0), "cpu", sequence_length=t)
    assert index.shape == (2 * m, t * n // m)
    for epoch in range(2):
        seen = []
        for rows in index[epoch * m:(epoch + 1) * m]:
            grid = rows.view(t, n // m)
            columns = grid[0] % n
            assert torch.equal(grid, torch.arange(t)[:, None] * n + columns[None])
            seen += columns.tolist()
        assert sorted(seen) == list(range(n))


def test_recurrent_refusals_are_one_line():
    assert "must divide n_envs" in one_line_error(Trainer, make_config({**SMALL, "n_envs": 6, "n_minibatches": 4}))
    assert "env-mode sync" in one_line_error(Trainer, make_config({**SMALL, "env_mode": "async"}))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_population_never_takes_the_hand_derived_gradient(kind):
    """Members autograd; an LSTM over an MLP as batched matmuls (``members_lstm``, which the member-equals-single-run
    tests below cover), a GRU under vmap."""
    pop = Trainer(make_config({**SMALL, "recurrent": kind, "n_seeds": 2}))
    assert not hand_gradient_applies(pop.spec, pop.layout, pop.autocast)
    assert pop.update_fn.path == "members_autograd"
    assert pop.layout.batched == (kind == "lstm")


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_every_member_equals_its_single_run(algo):
    """K = 2 (vmapped members, carried states [K * N, S]) against each member's single run, after one iteration."""
    a2c = {"algo": "a2c", "n_minibatches": 1, "n_epochs": 1} if algo == "a2c" else {}
    pop = _one_iteration(make_config({**SMALL, **a2c, "seed": 3, "n_seeds": 2}))
    _assert_members_equal_single_runs(pop, rollout_atol=1e-6)


def test_whole_iteration_members_equal_their_single_runs():
    """env_backend torch: the recurrent state rides in the whole iteration's carry, members vmapped (eager loops)."""
    pop = _one_iteration(make_config({**SMALL, "env_backend": "torch", "seed": 4, "n_seeds": 2}))
    assert pop.iteration_call is not None
    _assert_members_equal_single_runs(pop, atol=1e-5, rollout_atol=1e-5)


def test_compiled_whole_iteration_reproduces_its_rollout(aot_eager):  # noqa: F811
    """Compiled (scans in one graph), the iteration's stored rollout is what the unrolled forward gives."""
    trainer, acting = _collected({"env_backend": "torch", "compile": "default", "n_steps": 8, "n_epochs": 1,
                                  "total_steps": 4 * 8 * 3}, iterations=1)
    assert trainer.iteration_call.compiled
    logp, value, flat = _replay(trainer, acting, torch.arange(4))
    torch.testing.assert_close(logp, flat["sample_log_prob"], atol=1e-5, rtol=0)
    torch.testing.assert_close(value, flat["state_value"], atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def recurrent_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("recurrent")
    return fastrl.train(env="CartPole-v1", **{k: v for k, v in SMALL.items() if k != "env"}, run_dir=str(out / "run"),
                        eval_episodes=2, **API_QUIET)


def test_save_load_and_predict_carries_the_state(recurrent_run, tmp_path):
    """The loaded agent has the trained weights; predict's state round trip over a batch equals the model unrolled
    over the same sequence, episode_start resetting rows; a saved and reloaded agent acts the same."""
    agent = fastrl.load(recurrent_run.run_dir)
    for key, value in recurrent_run.agent.policy.state_dict().items():
        assert torch.equal(agent.policy.state_dict()[key], value), key
    torch.manual_seed(1)
    obs = torch.randn(6, 3, 4)
    starts = torch.zeros(6, 3, dtype=torch.bool)
    starts[3, 1] = True
    state, actions = None, []
    for t in range(6):
        action, state = agent.predict(obs[t].numpy(), state, starts[t].numpy())
        actions.append(torch.as_tensor(action))
    assert isinstance(state, tuple) and len(state) == 2 and state[0].shape == (3, 16)
    policy = agent.policy
    with torch.no_grad():
        out, last = policy.unroll(obs.flatten(0, 1), policy.initial_state(3), starts.flatten())
        expected = action_mode(policy.base.policy_head(out), policy.action_spec).view(6, 3)
    assert torch.equal(torch.stack(actions), expected)
    np.testing.assert_allclose(np.concatenate(state, axis=1), last.numpy(), atol=1e-6)
    agent.save(tmp_path / "agent.pt")
    again = fastrl.load(tmp_path / "agent.pt")
    assert np.array_equal(again.predict(obs[0].numpy())[0], agent.predict(obs[0].numpy())[0])


def test_evaluation_and_resume_of_a_recurrent_run(recurrent_run):
    returns = fastrl.evaluate(recurrent_run.run_dir, episodes=2)
    assert returns.shape == (2,) and (returns >= 1).all()
    resumed = fastrl.train(resume=str(recurrent_run.run_dir), total_steps=SMALL["total_steps"] * 2, eval_episodes=0,
                           **API_QUIET)
    assert resumed.summary["resumed_from_step"] == SMALL["total_steps"]
    assert resumed.summary["total_steps"] >= SMALL["total_steps"] * 2


@pytest.mark.parametrize("backend", ["envpool", "gymnasium", "torch"])
def test_position_only_cartpole_is_cartpole_without_velocities(backend):
    """CartPoleNoVel-v1 on each backend: CartPole-v1's observations (same seed, same actions), entries x and theta."""
    from fastrl.envs.batched import BatchedEnv
    novel, full = (BatchedEnv(env_id, 3, seed=5, backend=backend) for env_id in ("CartPoleNoVel-v1", "CartPole-v1"))
    assert novel.observation_shape == (2,) and novel.backend == backend
    observations = [(novel.reset(), full.reset())]
    for t in range(40):
        action = torch.tensor([t % 2, 1, 0])
        observations.append((novel.step(action).observation, full.step(action).observation))
    for position_only, state in observations:
        assert torch.equal(position_only, state[:, [0, 2]])
    novel.close()
    full.close()


def test_benchmark_runs_tiny_and_writes_its_json(tmp_path):
    """benchmarks/recurrent.py end to end on its fastrl contenders at a tiny budget (sb3-contrib is the lead's run)."""
    import json

    from benchmarks.recurrent import main
    out = tmp_path / "recurrent.json"
    main(["--n-seeds", "2", "--steps", "512", "--eval-episodes", "1", "--libs", "fastrl[lstm],fastrl[none]",
          "--out", str(out)])
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["fastrl[lstm]", "fastrl[none]"]
    for r in results.values():  # both seeds from one population call: one wall time
        assert [run["seed"] for run in r["runs"]] == [1, 2] and all(run["steps"] == 512 for run in r["runs"])
        assert r["median_eval_return"] >= 1 and len({run["wall_s"] for run in r["runs"]}) == 1

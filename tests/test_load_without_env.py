"""A saved agent acts without its env: the checkpoint carries the observation and action spaces as plain data, so
``fastrl.load(run).predict(obs)`` works in a process that never imports the env's code (an env class defined in a
script's ``__main__``, or a ``module:Id`` whose module is importable but must not be imported on a file's word).
Stepping an env (``evaluate``) still needs the env named; checkpoints without spaces load as before."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import fastrl
from conftest import one_line_error

REPO = Path(__file__).resolve().parent.parent

WALK = """
    import gymnasium
    import numpy as np


    class Walk(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
        action_space = gymnasium.spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

        def step(self, action):
            self.t += 1
            return self.np_random.uniform(-1, 1, 3).astype(np.float32), float(action == 1), self.t >= 10, False, {}
"""
# Trains a few hundred steps on argv[2] (Walk itself when absent: __main__:Walk) and prints the env's name and the
# actions for OBS.
TRAIN = WALK + """

    if __name__ == "__main__":
        import json
        import sys
        import fastrl
        env = sys.argv[2] if len(sys.argv) > 2 else Walk
        run = fastrl.train(env=env, total_steps=384, n_envs=2, n_steps=64, eval_episodes=0, run_dir=sys.argv[1],
                           wandb="disabled", tensorboard=False, progress=False, plot=False, quiet=True)
        obs = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3)
        print(json.dumps({"env": run.agent.config.env, "actions": run.agent.predict(obs)[0].tolist()}))
"""
WALK_MODULE = WALK + """

    gymnasium.register("WalkModule-v0", entry_point=Walk, max_episode_steps=10)
"""
# Loads argv[1] and acts, then tries to evaluate without naming the env; prints what it saw.
LOAD = """
    import json
    import sys
    import numpy as np
    import fastrl
    agent = fastrl.load(sys.argv[1])
    obs = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3)
    actions = agent.predict(obs)[0]
    seen = {"actions": actions.tolist(), "again": agent.predict(obs)[0].tolist(),
            "one": agent.predict(obs[0])[0].tolist(), "valid": all(agent.action_space.contains(int(a)) for a in actions),
            "observation_space": repr(agent.observation_space), "action_space": repr(agent.action_space),
            "imported": sorted(name for name in ("walk_module", "train_walk") if name in sys.modules),
            "walk_here": hasattr(sys.modules["__main__"], "Walk")}
    try:
        agent.evaluate(episodes=1)
    except fastrl.config.UserError as e:
        seen["evaluate"] = str(e)
    print(json.dumps(seen))
"""


def _python(args: list, cwd: Path) -> dict:
    """Run ``python args`` in ``cwd`` (which, and this checkout, are on PYTHONPATH); its last stdout line as JSON."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), str(cwd), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env, saved_name", [(None, "__main__:Walk"), ("walk_module:WalkModule-v0", None)])
def test_a_saved_agent_predicts_in_a_process_that_never_imports_its_env(env, saved_name, tmp_path):
    (tmp_path / "train_walk.py").write_text(textwrap.dedent(TRAIN))
    (tmp_path / "walk_module.py").write_text(textwrap.dedent(WALK_MODULE))
    (tmp_path / "load_walk.py").write_text(textwrap.dedent(LOAD))
    trained = _python(["train_walk.py", str(tmp_path / "run"), *([env] if env else [])], tmp_path)
    assert trained["env"] == (saved_name or env)
    loaded = _python(["load_walk.py", str(tmp_path / "run")], tmp_path)  # walk_module is importable from here
    assert loaded["imported"] == [] and not loaded["walk_here"]
    assert loaded["actions"] == trained["actions"] == loaded["again"] and loaded["one"] == trained["actions"][0]
    assert loaded["valid"] and len(loaded["actions"]) == 8
    assert loaded["observation_space"] == "Box(-1.0, 1.0, (3,), float32)" and loaded["action_space"] == "Discrete(3)"
    assert "would import and run code" in loaded["evaluate"]  # stepping the env needs it named


def test_the_spaces_travel_in_the_checkpoint_and_older_checkpoints_still_load(tmp_path):
    from fastrl.run.checkpoint import load_checkpoint, save_checkpoint
    run = fastrl.train(env="FrozenLake-v1", env_backend="gymnasium", total_steps=128, n_envs=2, n_steps=64,
                       eval_episodes=0, run_dir=tmp_path / "run", wandb="disabled", tensorboard=False, progress=False,
                       plot=False, quiet=True)
    state = load_checkpoint(run.run_dir)
    assert state["spaces"] == {"observation": {"type": "Discrete", "n": 16, "start": 0, "dtype": "int64"},
                               "action": {"type": "Discrete", "n": 4, "start": 0, "dtype": "int64"}}
    agent = fastrl.load(run.run_dir)
    older = {key: value for key, value in state.items() if key != "spaces"}  # as written before spaces were saved
    save_checkpoint(older, tmp_path / "older.pt")
    from_older = fastrl.load(tmp_path / "older.pt")  # the spaces of one env built from its config
    assert from_older.observation_space == agent.observation_space and from_older.action_space == agent.action_space
    states = np.arange(16)
    assert np.array_equal(from_older.predict(states)[0], agent.predict(states)[0])
    assert load_checkpoint(agent.save(tmp_path / "saved.pt"))["spaces"] == state["spaces"]
    from_older.save(tmp_path / "upgraded.pt")
    assert load_checkpoint(tmp_path / "upgraded.pt")["spaces"] == state["spaces"]
    broken = {**state, "spaces": {"observation": {"type": "Box"}, "action": state["spaces"]["action"]}}
    save_checkpoint(broken, tmp_path / "broken.pt")
    assert "malformed spaces" in one_line_error(fastrl.load, tmp_path / "broken.pt")
    batch = agent.predict(torch.tensor([[0], [15]]))[0]  # Discrete observations as [B, 1] too, a tensor out
    assert torch.is_tensor(batch) and batch.tolist() == agent.predict([0, 15])[0].tolist()

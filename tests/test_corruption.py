"""Corruption detected: checkpoints verify (zip CRCs and a sha256 of their contents) and a corrupt one names the newest
older checkpoint that verifies, or says none does; crafted checkpoints (weights that do not fit, a config that is a
string) are one line in fastrl eval; malformed metrics rows are skipped with a count by plot and resume; a damaged
study.db is one line; summary.json is strict JSON; fastrl plot --out says what it wrote."""
import json
import shutil

import pytest
import torch
from gymnasium.envs.classic_control import CartPoleEnv

import fastrl
from conftest import QUIET, one_line_error, train_main
from fastrl.cli import main as cli
from fastrl.config import make_config
from fastrl.run.checkpoint import checkpoint_path, contents_digest, list_checkpoints, load_checkpoint, save_checkpoint


def _state(step: int) -> dict:
    torch.manual_seed(step)
    return {"model": {"w": torch.randn(64, 64), "b": torch.zeros(4, dtype=torch.bfloat16), "flag": torch.ones(3) > 0},
            "global_step": step, "config": make_config().to_dict(), "rng": {"python": [1, 2, 3]}, "ratio": 0.5}


def _flip_tensor_bytes(path, tensor: torch.Tensor) -> None:
    """Flip 200 bytes inside ``tensor``'s data in the file, as a bad disk would; the zip stays readable."""
    data = bytearray(path.read_bytes())
    at = data.find(tensor.numpy().tobytes())
    assert at > 0
    data[at + 8:at + 208] = bytes(b ^ 0xFF for b in data[at + 8:at + 208])
    path.write_bytes(bytes(data))


def _rewrite(path, change) -> None:
    """A consistent zip whose contents no longer match the checksum written with them."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


@pytest.fixture
def three(tmp_path):
    paths = [save_checkpoint(_state(step), checkpoint_path(tmp_path, step)) for step in (100, 200, 300)]
    return paths


def test_a_checkpoint_carries_the_checksum_of_its_contents(three):
    state = torch.load(three[-1], weights_only=True)
    assert state["checksum"] == contents_digest(state) == contents_digest(_state(300))
    assert load_checkpoint(three[-1])["global_step"] == 300


def test_flipped_tensor_bytes_name_the_older_checkpoint_that_verifies(three):
    _flip_tensor_bytes(three[-1], _state(300)["model"]["w"])
    message = one_line_error(load_checkpoint, three[-1])
    assert str(three[-1]) in message and f"verifies is {three[1]}" in message, message


def test_a_checksum_mismatch_skips_corrupt_older_checkpoints(three):
    _rewrite(three[2], lambda s: s["model"]["w"].mul_(2))
    _rewrite(three[1], lambda s: s.update(global_step=7))
    message = one_line_error(load_checkpoint, three[2])
    assert "do not match the checksum" in message and f"verifies is {three[0]}" in message, message
    assert load_checkpoint(three[0])["global_step"] == 100


def test_when_every_checkpoint_is_corrupt_the_error_says_so(three):
    for path in three:
        _flip_tensor_bytes(path, torch.load(path, weights_only=True)["model"]["w"])
    message = one_line_error(load_checkpoint, three[-1])
    assert "none of the 2 older checkpoints" in message and "verifies either" in message, message
    assert str(three[0]) not in message and str(three[1]) not in message


def test_a_checkpoint_written_before_checksums_still_loads(tmp_path):
    path = checkpoint_path(tmp_path, 5)
    path.parent.mkdir(parents=True)
    torch.save(_state(5), path)
    assert load_checkpoint(path)["global_step"] == 5


@pytest.fixture
def run_copy(one_iteration_run, tmp_path):
    return shutil.copytree(one_iteration_run, tmp_path / "run")


@pytest.mark.parametrize("craft, needle", [
    (lambda s: s["config"].update(hidden_sizes=[32]), "do not fit the model its config builds"),
    (lambda s: s.update(config="ppo on CartPole"), "not a fastrl checkpoint"),
])
def test_a_crafted_checkpoint_is_one_line_in_eval(run_copy, capsys, craft, needle):
    ckpt = list_checkpoints(run_copy / "checkpoints")[-1]
    _rewrite(ckpt, lambda s: (craft(s), s.pop("checksum")))
    assert cli(["eval", str(run_copy), "--episodes", "1", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err, err


def _spoil_metrics(run_dir) -> None:
    with open(run_dir / "metrics.jsonl", "ab") as f:
        f.write(b'{"global_step": "abc", "charts/episodic_return": 1}\n\xff\xfe not utf-8\n[1, 2]\n')


def test_plot_skips_malformed_metrics_rows_with_a_count(run_copy, capsys):
    _spoil_metrics(run_copy)
    assert cli(["plot", str(run_copy), "--out", str(run_copy / "curve.png")]) == 0
    captured = capsys.readouterr()
    assert "skipped 3 malformed rows" in captured.err and (run_copy / "curve.png").stat().st_size > 0


def test_resume_skips_malformed_metrics_rows_with_a_count(run_copy, capsys):
    _spoil_metrics(run_copy)
    assert train_main(["--resume", str(run_copy), "--total-steps", "256", *QUIET]) == 0
    assert "skipped 3 malformed rows" in capsys.readouterr().err
    rows = [json.loads(line) for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(isinstance(row["global_step"], int) for row in rows) and rows[-1]["global_step"] == 256


@pytest.mark.parametrize("content", [b"SQLite format 3\x00" + b"\x00" * 40, bytes(range(256)) * 64])
def test_a_damaged_study_database_is_one_line_naming_it(tmp_path, capsys, content):
    pytest.importorskip("optuna")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "study.db").write_bytes(content)
    (tmp_path / "space.yaml").write_text("lr: {type: loguniform, low: 1.0e-4, high: 1.0e-2}\n")
    assert cli(["tune", "--space", str(tmp_path / "space.yaml"), "--dir", str(tmp_path / "study")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path / "study" / "study.db") in err, err


class NaNReward(CartPoleEnv):
    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, float("nan"), terminated, truncated, info


def test_nan_rewards_leave_a_strict_json_summary(tmp_path):
    run = fastrl.train(env=NaNReward, total_steps=256, n_envs=2, n_steps=32, n_minibatches=1, n_epochs=1,
                       compile="off", eval_episodes=0, wandb="disabled", tensorboard=False, progress=False, plot=False,
                       quiet=True, run_dir=str(tmp_path / "run"))

    def refuse(constant):
        raise ValueError(f"bare {constant} in summary.json")
    summary = json.loads((run.run_dir / "summary.json").read_text(), parse_constant=refuse)
    assert "episode_return_mean" in summary and summary["episode_return_mean"] is None


def test_plot_out_with_an_unsupported_extension_is_one_line(run_copy, capsys):
    assert cli(["plot", str(run_copy), "--out", str(run_copy / "x.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unsupported extension '.txt'" in err and ".png" in err, err


@pytest.mark.parametrize("existing", [False, True])
def test_plot_out_prints_the_path_it_wrote(run_copy, tmp_path, capsys, existing):
    out = tmp_path / "plots"
    if existing:
        out.mkdir()
    assert cli(["plot", str(run_copy), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    written = out / "learning_curves.png" if existing else tmp_path / "plots.png"
    assert printed == str(written) and written.is_file()

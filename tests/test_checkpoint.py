"""Checkpoints: weights_only round trip, keep-last-N, corrupted/truncated files, code-carrying pickles."""
import os
import shlex

import pytest
import torch

from fastrl.config import UserError, make_config
from fastrl.run.checkpoint import (checkpoint_path, contents_digest, list_checkpoints, load_checkpoint,
                                   resolve_checkpoint, save_checkpoint)


def _state(step=0):
    torch.manual_seed(step)
    return {"model": {"w": torch.randn(3, 4), "b": torch.zeros(4, dtype=torch.float64)},
            "optimizer": {"state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.randn(3)}}, "param_groups": [
                {"lr": 1e-3, "params": [0]}]},
            "global_step": step, "iteration": step // 8, "config": make_config().to_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": [1, 2, 3]}, "note": "plain data", "ratio": 0.5}


def _assert_same(a, b):
    assert type(a) is type(b) or (torch.is_tensor(a) and torch.is_tensor(b))
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif torch.is_tensor(a):
        assert a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b


def test_round_trip_weights_only(tmp_path):
    state = _state(1024)
    path = save_checkpoint(state, checkpoint_path(tmp_path, 1024))
    assert path == tmp_path / "checkpoints" / "ckpt_000000001024.pt"
    saved = torch.load(path, weights_only=True)
    assert saved.pop("checksum") == contents_digest(state)  # the sha256 of the rest, verified on load
    _assert_same(saved, state)
    _assert_same(load_checkpoint(path), state)
    _assert_same(load_checkpoint(tmp_path), state)  # a run dir resolves to its newest checkpoint
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "no temporary files left behind"


def test_keep_last_n(tmp_path):
    for step in (100, 200, 300, 400, 1000):
        save_checkpoint(_state(step), checkpoint_path(tmp_path, step), keep=2)
    names = [p.name for p in list_checkpoints(tmp_path / "checkpoints")]
    assert names == ["ckpt_000000000400.pt", "ckpt_000000001000.pt"]  # numeric order, not lexical surprises
    assert resolve_checkpoint(tmp_path).name == "ckpt_000000001000.pt"
    assert load_checkpoint(tmp_path)["global_step"] == 1000
    save_checkpoint(_state(2000), checkpoint_path(tmp_path, 2000), keep=0)  # 0 keeps all
    assert len(list_checkpoints(tmp_path / "checkpoints")) == 3


@pytest.mark.parametrize("damage", [
    "truncate",
    "empty",
    "garbage",
])
def test_corrupted_checkpoint_names_the_older_one(tmp_path, damage):
    older = save_checkpoint(_state(100), checkpoint_path(tmp_path, 100))
    newest = save_checkpoint(_state(200), checkpoint_path(tmp_path, 200))
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        newest.write_bytes(os.urandom(len(data)))
    else:
        newest.write_bytes(b"")
    with pytest.raises(UserError) as info:
        load_checkpoint(tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert newest.name in message and str(older) in message
    assert load_checkpoint(older)["global_step"] == 100  # the older one is still good


def test_corrupted_only_checkpoint(tmp_path):
    path = save_checkpoint(_state(100), checkpoint_path(tmp_path, 100))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match="corrupted or truncated"):
        load_checkpoint(path)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = checkpoint_path(tmp_path, 100)
    path.parent.mkdir(parents=True)
    torch.save({"model": {}, "config": {}, "payload": _Evil(marker)}, path)
    assert not marker.exists()
    with pytest.raises(UserError) as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value) and "refus" in str(info.value)
    assert not marker.exists(), "loading must never execute code from the file"


def test_not_a_fastrl_checkpoint(tmp_path):
    path = tmp_path / "ckpt_000000000001.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(UserError, match="not a fastrl checkpoint"):
        load_checkpoint(path)
    torch.save([1, 2, 3], path)
    with pytest.raises(UserError, match="not a fastrl checkpoint"):
        load_checkpoint(path)


def test_missing_targets(tmp_path):
    with pytest.raises(UserError, match="not found"):
        resolve_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(UserError, match="no checkpoint found"):
        resolve_checkpoint(tmp_path / "empty_run")

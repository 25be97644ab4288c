"""A run directory holds only what fastrl wrote: ``--overwrite`` deletes only the files fastrl recorded, no write goes
through a symbolic link, and ``--resume A --run-dir B`` never mixes one run into another's directory."""
import json

import pytest

from conftest import QUIET, train_main
from fastrl.run.checkpoint import list_checkpoints
from fastrl.run.runfiles import MANIFEST

TINY = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-epochs", "1", "--n-minibatches", "2",
        "--torch-threads", "1", "--device", "cpu", "--eval-episodes", "0", "--checkpoint-interval", "1", *QUIET]


def _train(run_dir, steps, *extra) -> int:
    return train_main(TINY + ["--total-steps", str(steps), "--run-dir", str(run_dir), *extra])


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastrl: error:"), err
    return err[0]


def _snapshot(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".fastrl-lock"}


def test_the_record_lists_fastrl_files_with_sizes_and_hashes(tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir, 256, "--tensorboard", "true") == 0
    entries = json.loads((run_dir / MANIFEST).read_text())
    checkpoints = [p.name for p in list_checkpoints(run_dir / "checkpoints")]
    assert checkpoints and {f"checkpoints/{name}" for name in checkpoints} <= set(entries)
    last = entries[f"checkpoints/{checkpoints[-1]}"]
    assert last["size"] == (run_dir / "checkpoints" / checkpoints[-1]).stat().st_size and len(last["sha256"]) == 64
    assert {"config.yaml", "metrics.jsonl", "summary.json"} <= set(entries)
    assert any(name.startswith("tb/") for name in entries), entries


def test_overwrite_deletes_only_what_fastrl_wrote(tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir, 256, "--tensorboard", "true") == 0
    old_events = [p for p in (run_dir / "tb").iterdir()]
    assert old_events
    mine = {"checkpoints/my_model.pt": b"weights", "tb/events.user": b"events", "notes.txt": b"notes"}
    for rel, data in mine.items():
        (run_dir / rel).write_bytes(data)
    assert _train(run_dir, 128, "--overwrite", "true") == 0
    assert all((run_dir / rel).read_bytes() == data for rel, data in mine.items())
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["ckpt_000000000128.pt"]
    assert not any(p.exists() for p in old_events)
    assert [json.loads(line)["global_step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [128]


def test_overwrite_keeps_a_recorded_file_whose_content_someone_replaced(tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir, 256) == 0
    replaced = list_checkpoints(run_dir / "checkpoints")[-1]  # step 256: the new run stops at 128
    replaced.write_bytes(b"someone else's file now")
    assert _train(run_dir, 128, "--overwrite", "true") == 0
    assert replaced.read_bytes() == b"someone else's file now"


def test_overwrite_of_a_run_without_a_record_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _train(run_dir, 128) == 0
    (run_dir / MANIFEST).unlink()
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert _train(run_dir, 128, "--overwrite", "true") == 2
    assert "no record of the files fastrl wrote" in _one_error(capsys)
    assert _snapshot(run_dir) == before


def test_a_linked_lock_file_is_refused_and_its_target_kept(tmp_path, capsys):
    run_dir, outside = tmp_path / "run", tmp_path / "precious.txt"
    run_dir.mkdir()
    outside.write_text("do not truncate me")
    (run_dir / ".fastrl-lock").symlink_to(outside)
    assert _train(run_dir, 128) == 2
    assert ".fastrl-lock is a symbolic link" in _one_error(capsys)
    assert outside.read_text() == "do not truncate me"


@pytest.mark.parametrize("name", ["config.yaml", "metrics.jsonl", "checkpoints"])
def test_planted_links_in_a_resumed_run_dir_are_refused(tmp_path, capsys, name):
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    assert _train(run_dir, 128) == 0
    (run_dir / name).rename(outside)  # the real file (or checkpoints/) now lies outside, behind a link
    (run_dir / name).symlink_to(outside)
    before = {p: p.read_bytes() for p in ([outside] if outside.is_file() else sorted(outside.iterdir()))}
    capsys.readouterr()
    assert train_main(TINY + ["--total-steps", "256", "--resume", str(run_dir)]) == 2
    assert f"{name} is a symbolic link" in _one_error(capsys)
    after = {p: p.read_bytes() for p in ([outside] if outside.is_file() else sorted(outside.iterdir()))}
    assert after == before


def test_resume_into_another_runs_dir_is_refused(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    assert _train(first, 128) == 0
    assert _train(second, 256) == 0
    before = _snapshot(second)
    capsys.readouterr()
    assert train_main(TINY + ["--total-steps", "256", "--resume", str(first), "--run-dir", str(second)]) == 2
    assert "is neither that checkpoint's run directory nor empty" in _one_error(capsys)
    assert _snapshot(second) == before


def test_resume_into_an_empty_dir_or_its_own_is_accepted(tmp_path):
    first, empty = tmp_path / "first", tmp_path / "empty"
    assert _train(first, 128) == 0
    empty.mkdir()
    assert train_main(TINY + ["--total-steps", "256", "--resume", str(first), "--run-dir", str(empty)]) == 0
    assert [p.name for p in list_checkpoints(empty / "checkpoints")] == ["ckpt_000000000256.pt"]
    assert train_main(TINY + ["--total-steps", "256", "--resume", str(first), "--run-dir", str(first)]) == 0


def test_overwrite_into_a_new_or_empty_dir_just_starts(tmp_path):
    assert _train(tmp_path / "new", 128, "--overwrite", "true") == 0
    (tmp_path / "empty").mkdir()
    assert _train(tmp_path / "empty", 128, "--overwrite", "true") == 0
    assert list_checkpoints(tmp_path / "empty" / "checkpoints")

"""Shared test set-up: offline, quiet wandb; no gymnasium Box-precision noise; small helpers."""
import os
import warnings

import pytest

os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.setdefault("WANDB_DISABLE_GIT", "true")

warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32.*")

# Flags every training test passes unless it is testing those outputs.
QUIET = ["--wandb", "disabled", "--tensorboard", "false", "--progress", "false"]


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:.*precision lowered by casting to float32.*:UserWarning")


@pytest.fixture
def quiet_flags():
    return list(QUIET)

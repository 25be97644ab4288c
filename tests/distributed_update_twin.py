"""Run by tests/test_distributed.py under ``torchrun --nproc_per_node=2`` (gloo, CPU): ``python
distributed_update_twin.py COMPILE OUT_DIR``.

Every rank builds the trainer of one config (``compile`` = COMPILE) and takes one update, through
``Trainer.minibatch_steps``, on its half of a fixed global batch of 2 x 64 rows; then a one-process trainer (eager)
takes the update of the whole batch, whose minibatch j is the two ranks' minibatch j side by side. Rank 0's rows carry
behaviour log-probs one nat below the policy's (approx_kl about 0.72), rank 1's the policy's own (about 0): only
their mean crosses target_kl = 0.1, so the early stop after the first epoch is the same on both ranks only if approx_kl
is averaged across ranks. Writes ``OUT_DIR/rank{R}.pt``.
"""
import sys

import torch

from fastrl.config import make_config
from fastrl.distributed import torchrun
from fastrl.learn.update import LOSS_KEYS, minibatch_index
from fastrl.run.trainer import Trainer

ROWS = 64  # per rank
# EnvPool's CartPole: a torch-native env would take the whole-iteration path (fastrl.iteration), not the update calls
# this twin drives.
CONFIG = {"env": "CartPole-v1", "env_backend": "envpool", "n_envs": 8, "n_steps": 16, "n_epochs": 2,
          "n_minibatches": 2, "norm_adv": False, "target_kl": 0.1, "progress": False,
          # long enough that a compiled update runs 2 steps (one epoch) per call (fastrl.run.compile.target_steps_per_call)
          "total_steps": 8 * 16 * 20_000}


def global_batch(trainer: Trainer) -> tuple:
    """The ``LOSS_KEYS`` inputs of both ranks' rows, ``[1, 2 * ROWS, ...]`` (rank r's rows ``r * ROWS ...``)."""
    generator = torch.Generator().manual_seed(0)
    observation = torch.randn(1, 2 * ROWS, 4, generator=generator)
    action = torch.randint(0, 2, (1, 2 * ROWS), generator=generator)
    with torch.no_grad():
        _, logp, _, _ = trainer.agent.get_action_and_value(observation[0], action[0])
    below = torch.cat([torch.ones(ROWS), torch.zeros(ROWS)])  # rank 0's rows one nat below, rank 1's none
    rows = {"observation": observation, "action": action, "sample_log_prob": (logp - below)[None],
            "advantage": torch.randn(1, 2 * ROWS, generator=generator),
            "state_value": torch.randn(1, 2 * ROWS, generator=generator),
            "value_target": torch.randn(1, 2 * ROWS, generator=generator),
            "valid": torch.ones(1, 2 * ROWS, dtype=torch.bool)}
    return tuple(rows[key].to(trainer.buffer[key].dtype) for key in LOSS_KEYS)


def rank_index(rank: int, spec) -> torch.Tensor:
    """Rank ``rank``'s minibatch rows ``[1, n_epochs * n_minibatches, ROWS / n_minibatches]``."""
    generator = torch.Generator().manual_seed(100 + rank)
    return minibatch_index(ROWS, spec.n_epochs, spec.n_minibatches, generator, "cpu")[None]


def one_update(trainer: Trainer, inputs: tuple, index: torch.Tensor) -> dict:
    initial = trainer.params[0].clone()
    trainer._set_hyperparameters()
    sums = trainer.minibatch_steps(inputs, index)
    return {"initial": initial, "params": trainer.params[0].clone(), "n_updates": float(sums["n_updates"][0]),
            "compiled": trainer.update_call.compiled, "steps_per_call": trainer.steps_per_call,
            "step_path": trainer.update_fn.path}


def main(compile_mode: str, out_dir: str) -> None:
    info, device = torchrun.setup("cpu")
    assert info.world_size == 2
    cfg = make_config({**CONFIG, "compile": compile_mode})
    ranks = Trainer(cfg, info, device)
    inputs = global_batch(ranks)
    indices = [rank_index(r, ranks.spec) for r in range(2)]
    mine = slice(info.rank * ROWS, (info.rank + 1) * ROWS)
    result = {"torchrun": one_update(ranks, tuple(x[:, mine] for x in inputs), indices[info.rank])}
    ranks.close()
    single = Trainer(make_config({**CONFIG, "compile": "off"}), torchrun.DistInfo(), device)
    result["single"] = one_update(single, inputs, torch.cat([indices[0], indices[1] + ROWS], dim=-1))
    single.close()
    torch.save(result, f"{out_dir}/rank{info.rank}.pt")
    torchrun.cleanup(finished=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

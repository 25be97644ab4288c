"""PPO and policy-gradient losses: values, stats and gradients against the composed-torch twins."""
import pytest
import torch

from fastrl import kernels
from fastrl.kernels.testing import (
    INPUT_OPTIONS, PPO_OPTIONS, check_pg, check_ppo, gradcheck_pg, gradcheck_ppo, loss_inputs, ppo_args, pg_args,
)


@pytest.mark.parametrize("opts", PPO_OPTIONS)
@pytest.mark.parametrize("inp", INPUT_OPTIONS)
def test_ppo_loss_matches_reference(opts, inp):
    check_ppo(None, opts, inp)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("inp", INPUT_OPTIONS)
def test_pg_loss_matches_reference(normalize, inp):
    check_pg(None, normalize, inp)


@pytest.mark.parametrize("opts", PPO_OPTIONS)
def test_ppo_loss_gradcheck(opts):
    gradcheck_ppo(None, opts)


def test_pg_loss_gradcheck():
    gradcheck_pg(None)


def test_ppo_loss_hand_computed():
    # two samples, one masked out: ratio 1.5 with A > 0 is clipped at 1.2
    new_logp = torch.tensor([1.5, 9.0]).log().requires_grad_()
    old_logp = torch.zeros(2)
    advantage = torch.tensor([2.0, -5.0])
    value = torch.tensor([1.0, 0.0], requires_grad=True)
    loss, stats = kernels.ppo_loss(new_logp, old_logp, advantage, value, value.detach(), torch.tensor([3.0, 0.0]),
                                   torch.tensor([0.7, 0.1]), torch.tensor([True, False]), 0.2, 0.5, 0.1,
                                   normalize_advantage=False)
    torch.testing.assert_close(stats["policy_loss"], torch.tensor(-2.0 * 1.2))
    torch.testing.assert_close(stats["value_loss"], torch.tensor(0.5 * 4.0))
    torch.testing.assert_close(stats["clipfrac"], torch.tensor(1.0))
    torch.testing.assert_close(stats["approx_kl"], torch.tensor(0.5 - torch.tensor(1.5).log().item()))
    torch.testing.assert_close(loss, torch.tensor(-2.4 - 0.07 + 1.0))
    loss.backward()
    torch.testing.assert_close(new_logp.grad, torch.zeros(2))  # clipped branch carries no gradient


def test_loss_compiles_without_graph_break():
    x = loss_inputs(seed=9)

    @torch.compile(fullgraph=True, backend="eager")
    def f(*args):
        return kernels.ppo_loss(*args, 0.2, 0.5, 0.01)

    loss, stats = f(*ppo_args(x))
    want_loss, _ = kernels.ppo_loss_reference(*ppo_args(x), 0.2, 0.5, 0.01)
    torch.testing.assert_close(loss, want_loss)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda x: x.update(old_logp=x["old_logp"][:-1]), "`old_logp` has shape"),
        (lambda x: x.update(advantage=x["advantage"].long()), "`advantage` has dtype"),
        (lambda x: x.update(valid=x["valid"].float()), "`valid` has dtype"),
        (lambda x: x.update(value_target=None), "`value_target` must be a torch.Tensor"),
        (lambda x: x.update(new_value=x["new_value"].detach().to("meta")), "`new_value` is on meta"),
    ],
)
def test_loss_errors_name_the_argument(change, match):
    x = loss_inputs()
    change(x)
    with pytest.raises(ValueError, match=match):
        kernels.ppo_loss(*ppo_args(x), 0.2, 0.5, 0.01)
    if "old_" not in match:  # pg_loss has no old_* inputs and calls new_value `value`
        with pytest.raises(ValueError, match=match.replace("new_value", "value")):
            kernels.pg_loss(*pg_args(x), 0.5, 0.01)


def test_loss_scalar_errors():
    x = loss_inputs()
    with pytest.raises(ValueError, match="`clip_coef` must be a Python float"):
        kernels.ppo_loss(*ppo_args(x), None, 0.5, 0.01)
    with pytest.raises(ValueError, match="`backend` must be one of"):
        kernels.pg_loss(*pg_args(x), 0.5, 0.01, backend="cpu")

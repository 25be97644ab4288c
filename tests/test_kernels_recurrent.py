"""``kernels.lstm_sequence`` against its twin (the loop through autograd) and ``nn.LSTMCell``: outputs, last state
and every gradient, with episode starts inside the sequence, under vmap over members, torch.func.grad and compile."""
import pytest
import torch
from torch import nn

from fastrl.kernels.recurrent import lstm_sequence, lstm_sequence_reference


def _inputs(t=9, b=5, h=4, members=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    lead = () if members is None else (members,)
    gates_x = torch.randn(*lead, t, b, 4 * h, generator=g, dtype=dtype)
    h0 = torch.randn(*lead, b, h, generator=g, dtype=dtype)
    c0 = torch.randn(*lead, b, h, generator=g, dtype=dtype)
    weight = torch.randn(*lead, 4 * h, h, generator=g, dtype=dtype) / h ** 0.5
    keep = (torch.rand(*lead, t, b, 1, generator=g) > 0.3).to(dtype)
    keep[..., 0, 0, :] = 0  # a start at step 0 too
    assert 0 < keep.sum() < keep.numel()
    return gates_x, h0, c0, weight, keep


def _outputs_and_grads(fn, gates_x, h0, c0, weight, keep, seed=1):
    leaves = [x.detach().clone().requires_grad_(True) for x in (gates_x, h0, c0, weight)]
    hidden, (h_last, c_last) = fn(*leaves, keep)
    g = torch.Generator().manual_seed(seed)
    loss = (hidden * torch.randn(hidden.shape, generator=g, dtype=hidden.dtype)).sum() + (h_last ** 2).sum() \
        + (c_last * 0.5).sum()
    grads = torch.autograd.grad(loss, leaves)
    return (hidden, h_last, c_last), grads


@pytest.mark.parametrize("with_keep", [True, False])
def test_outputs_and_gradients_equal_the_autograd_loop(with_keep):
    gates_x, h0, c0, weight, keep = _inputs()
    keep = keep if with_keep else None
    out, grads = _outputs_and_grads(lstm_sequence, gates_x, h0, c0, weight, keep)
    ref_out, ref_grads = _outputs_and_grads(lstm_sequence_reference, gates_x, h0, c0, weight, keep)
    for a, b in zip(out + grads, ref_out + ref_grads):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert grads[0].abs().sum() > 0 and grads[3].abs().sum() > 0


def test_a_zero_keep_restarts_the_row_from_the_zero_state():
    gates_x, h0, c0, weight, keep = _inputs(t=4, b=2)
    keep = torch.ones_like(keep)
    keep[2, 1] = 0
    hidden, _ = lstm_sequence(gates_x, h0, c0, weight, keep)
    fresh, _ = lstm_sequence(gates_x[2:, 1:], torch.zeros_like(h0[1:]), torch.zeros_like(c0[1:]), weight)
    torch.testing.assert_close(hidden[2:, 1:], fresh, rtol=0, atol=0)
    # and the state before the start gets no gradient from the steps after it
    (_, grads) = _outputs_and_grads(lambda *a: (lstm_sequence(*a)[0][2:], (h0[:0], c0[:0])), gates_x, h0, c0, weight,
                                    keep)
    assert grads[0][:2, 1].abs().sum() == 0 and grads[0][:2, 0].abs().sum() > 0


def test_matches_nn_lstm_cell():
    torch.manual_seed(0)
    cell = nn.LSTMCell(3, 6).double()
    x = torch.randn(7, 4, 3, dtype=torch.float64)
    h, c = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    gates_x = x @ cell.weight_ih.t() + cell.bias_ih + cell.bias_hh
    hidden, (h_last, c_last) = lstm_sequence(gates_x, h, c, cell.weight_hh)
    for t in range(7):
        h, c = cell(x[t], (h, c))
        torch.testing.assert_close(hidden[t], h)
    torch.testing.assert_close((h_last, c_last), (h, c))


def test_vmap_over_members_and_func_grad_equal_each_member_alone():
    gates_x, h0, c0, weight, keep = _inputs(members=3, dtype=torch.float32)

    def member_loss(weight, gates_x, h0, c0, keep):
        hidden, (h_last, c_last) = lstm_sequence(gates_x, h0, c0, weight, keep)
        return (hidden.sin().sum() + c_last.sum())

    batched = torch.func.vmap(torch.func.grad(member_loss))(weight, gates_x, h0, c0, keep)
    for m in range(3):
        leaves = weight[m].clone().requires_grad_(True)
        hidden, (_, c_last) = lstm_sequence_reference(gates_x[m], h0[m], c0[m], leaves, keep[m])
        (expected,) = torch.autograd.grad(hidden.sin().sum() + c_last.sum(), [leaves])
        torch.testing.assert_close(batched[m], expected, rtol=1e-5, atol=1e-5)


def test_compiled_equals_eager():
    gates_x, h0, c0, weight, keep = _inputs(t=3, b=2, h=2, dtype=torch.float32)
    compiled = torch.compile(lstm_sequence, backend="aot_eager", fullgraph=True)
    out, grads = _outputs_and_grads(compiled, gates_x, h0, c0, weight, keep)
    ref_out, ref_grads = _outputs_and_grads(lstm_sequence, gates_x, h0, c0, weight, keep)
    for a, b in zip(out + grads, ref_out + ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("members", [None, 3])
def test_torchscript_loops_equal_their_python_source(members):
    """Eagerly the forward and the backward's recurrence run as TorchScript (``_scripted``); a compiler traces their
    Python source. Both must compute the same floats, with and without a member axis."""
    from fastrl.kernels.recurrent import _backward_loop, _forward, _scripted
    gates_x, h0, c0, weight, keep = _inputs(members=members, dtype=torch.float32)
    for python_out, script_out in zip(_forward(gates_x, h0, c0, weight, keep),
                                      _scripted(_forward)(gates_x, h0, c0, weight, keep)):
        assert torch.equal(python_out, script_out)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(*gates_x.shape[:-1], h0.shape[-1], generator=g)
    args = (hidden, torch.randn(h0.shape, generator=g), torch.rand(hidden.shape, generator=g),
            torch.randn(gates_x.shape, generator=g), weight, keep, torch.rand(hidden.shape, generator=g))
    for python_out, script_out in zip(_backward_loop(*args), _scripted(_backward_loop)(*args)):
        assert torch.equal(python_out, script_out)

"""An LSTM over a time-major sequence whose rows restart where an episode starts, with its backward in one pass.

    hidden, (h_T, c_T) = kernels.lstm_sequence(gates_x, h0, c0, weight_hh, keep)

- ``gates_x [T, B, 4H]``: each step's input projection with both biases, ``x W_ih^T + b_ih + b_hh``, gates in
  ``nn.LSTMCell``'s order (i, f, g, o);
- ``h0, c0 [B, H]``: the state before step 0; ``weight_hh [4H, H]``;
- ``keep [T, B, 1]`` (float 0/1, or None: all ones): a row's state is multiplied by ``keep[t]`` before step t, so
  0 restarts that row from the zero state (an episode start);
- returns ``hidden [T, B, H]`` (the h of every step) and the last ``(h_T, c_T)``.

Step t, with ``h', c' = keep[t] * (h, c)``:  ``i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of gates_x[t] + h' W_hh^T``;
``c = f c' + i g``; ``h = o tanh(c)``. ``lstm_sequence_reference`` is that loop through autograd, the twin.

Why a kernel: on a CPU at RL sizes (B = 8 to a few hundred, H = 64 to 256) each step of the loop is ~10 small ops and
autograd records and replays each; the per-op overhead, not the math, is the cost. Here the forward runs without
recording, keeps what the backward needs in ``[T, ...]`` tensors, and turns every per-step factor of the backward
into one vectorized op after the loop, so that each backward step is 7 small ops and the weight gradient one matmul:

    dc_t  += dh_t * o_t (1 - tanh(c_t)^2)
    dz_t   = [dc_t, dc_t, dc_t, dh_t] * [g_t, c'_t, i_t, tanh(c_t)] * act'(z_t)          (z: the pre-activations)
    dh_{t-1} = keep[t] * dz_t W_hh,   dc_{t-1} = keep[t] * f_t dc_t,   dW_hh = sum_t dz_t^T h'_t,   d gates_x = dz

Works under ``torch.func`` transforms (``vmap`` over a population's members, ``grad``) and ``torch.compile``.
"""
import functools
import warnings
from typing import List, Optional

import torch
from torch import Tensor


def _forward(gates_x: Tensor, h: Tensor, c: Tensor, weight_hh: Tensor, keep: Optional[Tensor]):
    """The loop without autograd: ``(hidden, c_T, acts, prev_h, prev_c, tanh_c)``, time at dim -3. TorchScript-able
    (``_scripted``), as is ``_backward_loop``."""
    size = h.shape[-1]
    # tanh(x) = 2 sigmoid(2x) - 1: with the g gate's pre-activation doubled (its input projection and its columns of
    # W_hh^T, once), one sigmoid covers all four gates, and i * g = 2 i sigmoid(2 z_g) - i; g itself after the loop.
    double_g = torch.ones(4 * size, dtype=gates_x.dtype, device=gates_x.device)
    double_g[2 * size:3 * size] = 2.0
    gates_x = gates_x * double_g
    weight_t = weight_hh.transpose(-1, -2) * double_g
    hidden: List[Tensor] = []
    acts: List[Tensor] = []
    prev_h: List[Tensor] = []
    prev_c: List[Tensor] = []
    tanh_c: List[Tensor] = []
    for t in range(gates_x.shape[-3]):
        if keep is not None:
            h, c = h * keep.select(-3, t), c * keep.select(-3, t)
        prev_h.append(h)
        prev_c.append(c)
        gates_t = gates_x.select(-3, t)
        z = torch.addmm(gates_t, h, weight_t) if h.dim() == 2 else torch.baddbmm(gates_t, h, weight_t)
        act = torch.sigmoid(z)
        i, f, g_half, o = act.chunk(4, dim=-1)
        c = torch.addcmul(f * c, i, g_half, value=2.0) - i
        tc = torch.tanh(c)
        h = o * tc
        acts.append(act)
        tanh_c.append(tc)
        hidden.append(h)
    stack = torch.stack
    activations = stack(acts, -3)
    g = activations.narrow(-1, 2 * size, size)
    g.mul_(2.0).sub_(1.0)  # sigmoid(2 z_g) -> tanh(z_g), for the backward
    return stack(hidden, -3), c, activations, stack(prev_h, -3), stack(prev_c, -3), stack(tanh_c, -3)


def _backward_loop(d_hidden: Tensor, d_c_last: Tensor, c_from_h: Tensor, factor: Tensor, weight_hh: Tensor,
                   keep: Optional[Tensor], carry_c: Tensor):
    """The backward's recurrence (see the module docstring): ``(d_z [..., T, B, 4H], dh_0, dc_0)``."""
    d_z: List[Tensor] = []
    dh, dc = torch.zeros_like(d_hidden.select(-3, 0)), d_c_last
    steps = d_hidden.shape[-3]
    for back in range(steps):
        t = steps - 1 - back
        dh = dh + d_hidden.select(-3, t)
        dc = torch.addcmul(dc, dh, c_from_h.select(-3, t))
        dz = torch.cat([dc, dc, dc, dh], dim=-1) * factor.select(-3, t)
        d_z.append(dz)
        dh = torch.matmul(dz, weight_hh)
        if keep is not None:
            dh = dh * keep.select(-3, t)
        dc = dc * carry_c.select(-3, t)
    d_z.reverse()
    return torch.stack(d_z, -3), dh, dc


@functools.cache
def _scripted(function):
    """``function`` compiled by TorchScript, once: its loop then runs in the TorchScript interpreter instead of
    Python. Figure (2-core AMD EPYC, 2026-12-07; 3 members, T = 32, B = 8, H = 64): forward 3.8 -> 2.8 ms, backward
    loop 2.6 -> 1.8 ms. ``torch.compile`` and TorchScript traces take the Python function itself."""
    with warnings.catch_warnings():  # torch 2.13 marks torch.jit.script deprecated; it is what runs a loop fastest here
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(function)


def _run(function, *args):
    """``function`` (``_forward`` / ``_backward_loop``) as TorchScript eagerly, as Python where a tracer records it."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return function(*args)
    return _scripted(function)(*args)


class _LSTMSequence(torch.autograd.Function):
    """Inputs as ``lstm_sequence``'s, each with at most one more leading (member) axis; ``vmap`` moves a vmapped
    axis there, so a population's members run as one batch of matmuls instead of under vmap's per-op rules."""

    @staticmethod
    def forward(gates_x, h0, c0, weight_hh, keep):
        return _run(_forward, gates_x, h0, c0, weight_hh, keep)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, _, weight_hh, keep = inputs
        _, _, acts, prev_h, prev_c, tanh_c = output
        ctx.save_for_backward(weight_hh, keep, acts, prev_h, prev_c, tanh_c)
        ctx.mark_non_differentiable(acts, prev_h, prev_c, tanh_c)

    @staticmethod
    def backward(ctx, d_hidden, d_c_last, *_):
        weight_hh, keep, acts, prev_h, prev_c, tanh_c = ctx.saved_tensors
        i, f, g, o = acts.chunk(4, dim=-1)
        # Every per-step factor at once: the activations' derivatives times what multiplies each gate.
        slope = torch.cat([i * (1 - i), f * (1 - f), 1 - g * g, o * (1 - o)], dim=-1)
        factor = torch.cat([g, prev_c, i, tanh_c], dim=-1) * slope
        c_from_h = o * (1 - tanh_c * tanh_c)
        carry_c = f if keep is None else f * keep
        d_z, dh, dc = _run(_backward_loop, d_hidden, d_c_last, c_from_h, factor, weight_hh, keep, carry_c)
        d_weight = d_z.flatten(-3, -2).transpose(-1, -2) @ prev_h.flatten(-3, -2)
        return d_z, dh, dc, d_weight, None

    @staticmethod
    def vmap(info, in_dims, gates_x, h0, c0, weight_hh, keep):
        def batched(x, dim):
            if x is None:
                return None
            return x.unsqueeze(0).expand(info.batch_size, *x.shape) if dim is None else x.movedim(dim, 0)

        args = [batched(x, dim) for x, dim in zip((gates_x, h0, c0, weight_hh, keep), in_dims)]
        return _LSTMSequence.apply(*args), (0,) * 6


def lstm_sequence(gates_x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, weight_hh: torch.Tensor,
                  keep: torch.Tensor | None = None):
    """See the module docstring: ``(hidden [T, B, H], (h_T, c_T))``."""
    # A TorchScript trace cannot record a Python autograd.Function: it records the forward loop (no gradient there).
    run = _forward if torch.jit.is_tracing() else _LSTMSequence.apply
    hidden, c_last, *_ = run(gates_x, h0, c0, weight_hh, keep)
    return hidden, (hidden[..., -1, :, :], c_last)


def lstm_sequence_reference(gates_x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, weight_hh: torch.Tensor,
                            keep: torch.Tensor | None = None):
    """``lstm_sequence``'s twin: the plain loop, differentiated by autograd."""
    h, c, outputs = h0, c0, []
    for t in range(gates_x.shape[0]):
        if keep is not None:
            h, c = h * keep[t], c * keep[t]
        i, f, g, o = (gates_x[t] + h @ weight_hh.t()).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs), (h, c)

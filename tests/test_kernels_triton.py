"""The Triton kernels under TRITON_INTERPRET=1 on CPU tensors, so CI tests them without a GPU.

Triton reads TRITON_INTERPRET when it is imported (its own ``tl`` helpers are decorated then), so unless
this process already runs under the interpreter, one test re-runs this module in a subprocess that
does. Shapes are small: the interpreter runs Python per op.
"""
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from fastrl import kernels  # noqa: E402
from fastrl.kernels._backend import interpreting  # noqa: E402
from fastrl.kernels.testing import (  # noqa: E402
    PPO_OPTIONS, check_pg, check_ppo, gae_args, gradcheck_pg, gradcheck_ppo, scan_inputs, strided, to_float64,
    transposed, vtrace_args,
)

GAMMA, LAM = 0.97, 0.9
TOL = dict(rtol=1e-5, atol=1e-5)
in_interpreter = pytest.mark.skipif(not interpreting(), reason="runs in the TRITON_INTERPRET=1 subprocess")


@pytest.mark.skipif(interpreting(), reason="already under the interpreter")
def test_triton_kernels_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", "-x"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, proc.stdout[-2000:]


def _check(got, want):
    for g, w in zip(got, want):
        assert g.dtype == torch.float32 and g.shape == w.shape
        torch.testing.assert_close(g.double(), w, **TOL)


CASES = [((1, 1), 0.2), ((1, 5), 0.5), ((9, 1), 0.2), ((11, 6), 0.2), ((7, 4), 1.0), ((8, 3), 0.0),
         ((5, 2, 3), 0.3), ((6, 150), 0.1)]


@in_interpreter
@pytest.mark.parametrize("shape,p_done", CASES)
def test_triton_scans_match_reference(shape, p_done):
    x = scan_inputs(shape, p_done, seed=sum(shape))
    _check(kernels.gae(*gae_args(x), GAMMA, LAM, backend="triton"),
           kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM))
    _check(kernels.vtrace(*vtrace_args(x), GAMMA, 1.5, 0.9, 0.8, backend="triton"),
           kernels.vtrace_reference(*to_float64(vtrace_args(x)), GAMMA, 1.5, 0.9, 0.8))


@in_interpreter
@pytest.mark.parametrize("layout", [transposed, strided])
@pytest.mark.parametrize("dtype,flag_dtype", [(torch.float32, torch.bool), (torch.bfloat16, torch.float32),
                                              (torch.float16, torch.bool)])
def test_triton_layouts_and_dtypes(layout, dtype, flag_dtype):
    x = scan_inputs((7, 3, 2), 0.3, dtype=dtype, flag_dtype=flag_dtype, seed=2)
    y = layout(x)
    _check(kernels.gae(*gae_args(y), GAMMA, LAM, backend="triton"),
           kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM))
    _check(kernels.vtrace(*vtrace_args(y), GAMMA, backend="triton"),
           kernels.vtrace_reference(*to_float64(vtrace_args(x)), GAMMA))


@in_interpreter
@pytest.mark.parametrize("opts", PPO_OPTIONS)
@pytest.mark.parametrize("inp", [dict(), dict(valid=False, entropy=False), dict(shape=(1,)), dict(p_valid=0.0),
                                 dict(shape=(3, 700))])
def test_triton_ppo_loss(opts, inp):
    check_ppo("triton", opts, inp)


@in_interpreter
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("inp", [dict(), dict(valid=False, entropy=False), dict(shape=(3, 700))])
def test_triton_pg_loss(normalize, inp):
    check_pg("triton", normalize, inp)


@in_interpreter
def test_triton_loss_bf16_inputs():
    check_ppo("triton", {}, {}, dtype=torch.bfloat16, tol=1e-2)


@in_interpreter
@pytest.mark.parametrize("opts", PPO_OPTIONS)
def test_triton_ppo_loss_gradcheck(opts):
    gradcheck_ppo("triton", opts)


@in_interpreter
def test_triton_pg_loss_gradcheck():
    gradcheck_pg("triton")


def test_triton_backend_needs_cuda_or_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = scan_inputs((3, 2))
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        kernels.gae(*gae_args(x), GAMMA, LAM, backend="triton")

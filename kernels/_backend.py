"""Backend selection: Triton on CUDA, the C library on CPU, a torch loop anywhere else."""
import functools
import os

import torch

BACKENDS = (None, "auto", "reference", "torch", "cpu", "triton")


@functools.lru_cache(maxsize=None)
def triton_available():
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def interpreting():
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_module():
    from . import _triton

    return _triton


def resolve(op, backend, device):
    """Name the backend that runs ``op`` for tensors on ``device``: "reference", "torch", "cpu" or "triton"."""
    if backend in (None, "auto"):
        if device.type == "cuda" and triton_available():
            return "triton"
        if device.type == "cpu":
            from . import _cpu

            return "cpu" if _cpu.lib() is not None else "torch"
        return "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError(f"{op}: backend='triton' needs the triton package")
        if device.type != "cuda" and not (device.type == "cpu" and interpreting()):
            raise ValueError(f"{op}: backend='triton' needs CUDA tensors (or CPU tensors with TRITON_INTERPRET=1)")
    if backend == "cpu":
        if device.type != "cpu":
            raise ValueError(f"{op}: backend='cpu' needs CPU tensors, got {device}")
        from . import _cpu

        if _cpu.lib() is None:
            return "torch"
    return backend


def compiling():
    return torch.compiler.is_compiling()

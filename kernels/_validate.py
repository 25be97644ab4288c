"""Argument checks shared by every kernel: one clear ``ValueError`` that names the argument."""
import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
FLAG_DTYPES = (torch.bool, torch.uint8) + FLOAT_DTYPES


def check_tensors(op, tensors, float_names, flag_names=()):
    """Check that every named tensor has one shape ``[T, *B]`` (T >= 1), one device and a supported dtype.

    ``tensors`` is an ordered dict-like ``{name: tensor}``; the first entry sets the expected shape and device.
    Returns ``(shape, device)``.
    """
    first_name, first = None, None
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{op}: `{name}` must be a torch.Tensor, got {type(x).__name__}")
        if first is None:
            first_name, first = name, x
            if x.dim() < 1 or x.shape[0] < 1:
                raise ValueError(
                    f"{op}: `{name}` has shape {tuple(x.shape)}; expected time-major [T, *B] with T >= 1"
                )
            continue
        if x.shape != first.shape:
            raise ValueError(
                f"{op}: `{name}` has shape {tuple(x.shape)} but `{first_name}` has {tuple(first.shape)}; "
                "all inputs must share one time-major shape [T, *B]"
            )
        if x.device != first.device:
            raise ValueError(
                f"{op}: `{name}` is on {x.device} but `{first_name}` is on {first.device}; "
                "move all inputs to one device"
            )
    for name in float_names:
        dt = tensors[name].dtype
        if dt not in FLOAT_DTYPES:
            raise ValueError(f"{op}: `{name}` has dtype {dt}; expected float32, bfloat16 or float16")
    for name in flag_names:
        dt = tensors[name].dtype
        if dt not in FLAG_DTYPES:
            raise ValueError(f"{op}: `{name}` has dtype {dt}; expected bool or 0/1 floats")
    return first.shape, first.device


def to_time_major(op, tensors, time_dim):
    """``tensors`` (``{name: tensor}``) with axis ``time_dim`` moved to the front (views; unchanged for 0).

    ``time_dim`` must be an int within the first tensor's dims (anything else is a ValueError); TorchRL's
    batch-first ``[N, T, 1]`` layout is ``time_dim=1`` (or ``-2``).
    """
    first = next(iter(tensors.values()))
    if time_dim == 0 or not isinstance(first, torch.Tensor):  # a non-tensor is refused by check_tensors
        return tensors
    ndim = first.dim()
    if isinstance(time_dim, bool) or not isinstance(time_dim, int) or not -ndim <= time_dim < ndim:
        raise ValueError(f"{op}: `time_dim` must be an int in [{-ndim}, {ndim}) (the axis of time), got {time_dim!r}")
    return {name: x.movedim(time_dim, 0) if isinstance(x, torch.Tensor) and x.dim() == ndim else x
            for name, x in tensors.items()}


def scalar(op, name, x):
    """A Python float or a 0-d tensor, as a Python float (a 0-d CUDA tensor costs one sync)."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"{op}: `{name}` must be a Python float or a 0-d tensor, got shape {tuple(x.shape)}")
        return float(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    raise ValueError(f"{op}: `{name}` must be a Python float or a 0-d tensor, got {type(x).__name__}")


def coefficient(op, name, x):
    """A Python float, or a 0-d tensor kept as a tensor (no sync; lets compiled losses take it as an input)."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"{op}: `{name}` must be a Python float or a 0-d tensor, got shape {tuple(x.shape)}")
        return x.reshape(())
    return scalar(op, name, x)


def check_backend(op, backend, choices):
    if backend not in choices:
        raise ValueError(f"{op}: `backend` must be one of {choices}, got {backend!r}")


def check_range(op, name, x, low, high=None, low_open=False):
    """Refuse a Python-float ``x`` outside ``[low, high]`` (``(low, high]`` with ``low_open``; no upper bound if
    ``high`` is None); NaN is refused too. 0-d tensors pass unread: checking one would cost a host sync."""
    if isinstance(x, torch.Tensor):
        return
    above = x > low if low_open else x >= low
    if not (above and (high is None or x <= high)):
        if high is not None:
            where = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        else:
            where = f"{'>' if low_open else '>='} {low:g}"
        raise ValueError(f"{op}: `{name}` must be {where}, got {x!r}")

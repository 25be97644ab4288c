"""Mixed precision: the context a model forward runs in.

``autocast_factory(device, amp)`` returns a zero-argument callable giving the context (``torch.autocast`` for
bf16/fp16, ``nullcontext`` otherwise), always entered with ``with``. Losses, advantages and optimizer state stay
float32: models return float32 log-probs and values, and the autocast region covers only the forward. The update of
every algorithm scales fp16 losses itself (``fastrl.learn.update``, dynamic loss scaling as tensors).
"""
from __future__ import annotations

import functools
from contextlib import nullcontext

import torch

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_factory(device: torch.device, amp: str):
    if amp == "off":
        return nullcontext
    if amp == "fp16" and device.type != "cuda":
        raise ValueError("amp=fp16 needs a CUDA device; use amp=bf16 on CPU")
    return functools.partial(torch.autocast, device_type=device.type, dtype=_AMP_DTYPES[amp])


"""Gymnasium spaces as fastrl reads them: the action spec, how an observation space becomes the tensors a model takes,
and spaces as plain data (for checkpoints, so a saved agent acts without its env's code).

Observations as the batched env hands them out (``observation_format``), per env:
- ``Box``: its shape and dtype (float64 as float32); a 3-D channels-last image ``[H, W, C]`` as ``[C, H, W]``;
  a scalar Box as ``[1]``.
- ``Discrete``: the integer itself, ``[1]``; ``MultiDiscrete``: its integers as they are. The model one-hot encodes
  them (``one_hot``: component i takes ``n_i`` values from ``start_i``), so the rollout buffer keeps the integers.
- ``Dict``: every entry packed into one float32 vector (``pack_observation``; a Discrete entry as its integer, one-hot
  encoded by the model); MiniGrid's Dict(image, direction, mission): its image, channels first. An ``action_mask``
  entry (``MASK_KEY``) is the action mask, packed last (``fastrl.envs.masks``).

``space_to_data`` / ``space_from_data``: Box, Discrete, MultiDiscrete, MultiBinary, Text, Dict and Tuple as nested
dicts, lists, strings and numbers (no pickle, no code), and back.
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium
import numpy as np
import torch

from fastrl.config import UserError

MASK_KEY = "action_mask"  # a Dict observation's action mask (PettingZoo's and RLlib's name)


@dataclass(frozen=True)
class ActionSpec:
    """``discrete``: actions are int64 ``[N]`` in ``[0, n)``; with ``nvec`` (MultiDiscrete, MultiBinary as all 2s),
    int64 ``[N, len(nvec)]``, component i in ``[0, nvec[i])``, and ``n = sum(nvec)`` logits. ``continuous``: float32
    ``[N, *shape]`` in ``[low, high]``."""
    kind: str
    n: int = 0
    shape: tuple = ()
    low: tuple = ()
    high: tuple = ()
    nvec: tuple = ()


def action_spec_of(space) -> ActionSpec:
    """The ``ActionSpec`` of a Gymnasium action space (a one-line UserError for one fastrl cannot act in)."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return ActionSpec("discrete", n=int(space.n))
    if isinstance(space, (gymnasium.spaces.MultiDiscrete, gymnasium.spaces.MultiBinary)):
        binary = isinstance(space, gymnasium.spaces.MultiBinary)
        nvec = np.full(space.shape, 2) if binary else np.asarray(space.nvec)
        if nvec.ndim != 1 or (not binary and np.any(np.asarray(space.start) != 0)):
            raise UserError(f"action space {type(space).__name__} of shape {space.shape} is not supported: fastrl "
                            "handles 1-D MultiDiscrete (starting at 0) and MultiBinary actions; wrap the env to flatten "
                            "them")
        nvec = tuple(int(v) for v in nvec)
        return ActionSpec("discrete", n=sum(nvec), shape=(len(nvec),), nvec=nvec)
    if isinstance(space, gymnasium.spaces.Box):
        return ActionSpec("continuous", shape=tuple(space.shape), low=tuple(np.asarray(space.low, np.float64).ravel().tolist()),
                          high=tuple(np.asarray(space.high, np.float64).ravel().tolist()))
    raise UserError(f"action space {str(space).splitlines()[0]} is not supported; fastrl handles Discrete, "
                    "MultiDiscrete, MultiBinary and Box actions")


def one_hot_sizes(space) -> tuple[tuple, tuple] | None:
    """``(sizes, starts)`` of a Discrete (one component) or MultiDiscrete (flattened) space: component i takes the
    values ``starts[i] .. starts[i] + sizes[i] - 1``. None for any other space."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return (int(space.n),), (int(space.start),)
    if isinstance(space, gymnasium.spaces.MultiDiscrete):
        return (tuple(int(n) for n in np.ravel(space.nvec)),
                tuple(int(s) for s in np.ravel(np.broadcast_to(space.start, np.shape(space.nvec)))))
    return None


@dataclass(frozen=True)
class ObservationPart:
    """One entry of a Dict observation space as fastrl packs it: ``key``, its ``shape`` as stored (an image
    ``[C, H, W]``, channels first; anything else flattened to ``[D]``), whether it is an ``image``, and whether
    the env gives it channels-last (``hwc``); ``scale`` turns it into floats of order 1 (1/255 for uint8 images).
    A Discrete or MultiDiscrete entry has ``one_hot`` (``one_hot_sizes``): its ``[D]`` integers are one-hot
    encoded by the model. ``mask``: the action mask (``MASK_KEY``), last in a layout, never a network input."""
    key: str
    shape: tuple
    image: bool
    hwc: bool = False
    scale: float = 1.0
    one_hot: tuple | None = None
    mask: bool = False


def channels_last(shape: tuple) -> bool:
    """A 3-D shape that reads as ``[H, W, C]``: at most 4 channels last, and fewer than the first side (so a
    channels-first ``[3, 64, 64]`` or ``[4, 84, 84]`` stays as it is; a cube such as ``[3, 3, 3]`` too)."""
    return len(shape) == 3 and shape[2] <= 4 and shape[2] < shape[0]


def dict_layout(space) -> tuple[ObservationPart, ...]:
    """The packing of a gymnasium Dict space: its entries in the space's key order (``MASK_KEY`` last); 3-D Boxes are
    images."""
    parts = []
    for key, sub in sorted(space.spaces.items(), key=lambda item: item[0] == MASK_KEY):
        shape = tuple(getattr(sub, "shape", None) or ())
        if getattr(sub, "shape", None) is None or not hasattr(sub, "dtype"):
            raise UserError(f"Dict observation entry {key!r} is {sub}; fastrl packs Box, Discrete, MultiDiscrete and "
                            "MultiBinary entries only: wrap the env to turn it into one of them")
        sizes = one_hot_sizes(sub)
        if len(shape) == 3 and sizes is None:
            hwc = channels_last(shape)
            parts.append(ObservationPart(key, (shape[2], shape[0], shape[1]) if hwc else shape, True, hwc,
                                         1 / 255 if np.dtype(sub.dtype) == np.uint8 else 1.0))
        else:
            parts.append(ObservationPart(key, (max(1, int(np.prod(shape))),), False, one_hot=sizes,
                                         mask=key == MASK_KEY))
    return tuple(parts)


def pack_observation(obs: dict, layout: tuple[ObservationPart, ...], batched: bool = True) -> torch.Tensor:
    """A Dict observation (numpy arrays or tensors, ``[N, ...]`` per entry, or unbatched) as one float32 tensor
    ``[N, D]`` (``[D]`` unbatched): each entry flattened (images channels first), concatenated in layout order."""
    pieces = []
    for part in layout:
        value = obs[part.key]
        value = value if torch.is_tensor(value) else torch.from_numpy(np.ascontiguousarray(value))
        if not batched:
            value = value.unsqueeze(0)
        if part.hwc:
            value = value.movedim(-1, -3)
        pieces.append(value.reshape(value.shape[0], -1).float())
    packed = torch.cat(pieces, dim=1)
    return packed if batched else packed[0]


@dataclass(frozen=True)
class ObservationFormat:
    """What one env's observation becomes (see the module docstring): ``shape`` and ``dtype`` as handed out,
    ``scale`` (the factor a pixel model applies), ``layout`` (a packed Dict's entries), ``image_key`` (MiniGrid's
    image entry), ``hwc`` (a channels-last image, transposed) and ``one_hot`` (a Discrete or MultiDiscrete space's
    ``one_hot_sizes``); ``mask``: the width of the action mask in the last columns (0: none)."""
    shape: tuple
    dtype: torch.dtype
    scale: float = 1.0
    layout: tuple | None = None
    image_key: str | None = None
    hwc: bool = False
    one_hot: tuple | None = None
    mask: int = 0


def observation_format(space, env_id: str) -> ObservationFormat:
    """How fastrl hands out the observations of ``space`` (one env's), or a one-line UserError naming ``env_id``."""
    spaces = getattr(space, "spaces", None)
    if isinstance(spaces, dict) and {"image", "mission"} <= set(spaces):
        height, width, channels = spaces["image"].shape
        return ObservationFormat((channels, height, width), _torch_dtype(spaces["image"].dtype), 0.1,
                                 image_key="image")  # codes: objects < 11, colours < 6, states < 3
    if isinstance(spaces, dict):
        layout = dict_layout(space)
        shape = (sum(int(np.prod(part.shape)) for part in layout),)
        return ObservationFormat(shape, torch.float32, layout=layout,  # the Dict model scales its image parts itself
                                 mask=layout[-1].shape[0] if layout[-1].mask else 0)
    if getattr(space, "shape", None) is None or getattr(space, "dtype", None) is None:
        raise UserError(f"{env_id!r} has observation space {space}; fastrl handles Box, Discrete, MultiDiscrete and "
                        "MultiBinary observations, Dict observations of them and MiniGrid images: wrap the env to "
                        "flatten its observations")
    shape, dtype = tuple(space.shape), np.dtype(space.dtype)
    hwc = channels_last(shape)
    shape = (shape[2], shape[0], shape[1]) if hwc else shape or (1,)
    scale = 1.0 / 255.0 if dtype == np.uint8 else 1.0
    return ObservationFormat(shape, _torch_dtype(dtype), scale, hwc=hwc, one_hot=one_hot_sizes(space))


def _torch_dtype(dtype) -> torch.dtype:
    """The torch dtype observations of numpy ``dtype`` are handed out in: float64 as float32, the others as they are."""
    return torch.float32 if np.dtype(dtype) == np.float64 else torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def _array_data(value) -> float | int | list:
    """A Box bound as one number when it is the same everywhere, else as a flat list."""
    flat = np.asarray(value).ravel()
    return flat[0].item() if flat.size and np.all(flat == flat[0]) else flat.tolist()


def space_to_data(space) -> dict:
    """``space`` as plain data: dicts, lists, strings and numbers (a ValueError for a kind of space it cannot hold)."""
    import gymnasium.spaces as s
    if isinstance(space, s.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": _array_data(space.low), "high": _array_data(space.high)}
    if isinstance(space, s.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": str(space.dtype)}
    if isinstance(space, s.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist(),
                "start": np.asarray(space.start).tolist(), "dtype": str(space.dtype)}
    if isinstance(space, s.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, s.Text):
        return {"type": "Text", "max_length": int(space.max_length), "min_length": int(space.min_length),
                "charset": space.characters}
    if isinstance(space, s.Dict):
        return {"type": "Dict", "spaces": [[key, space_to_data(sub)] for key, sub in space.spaces.items()]}
    if isinstance(space, s.Tuple):
        return {"type": "Tuple", "spaces": [space_to_data(sub) for sub in space.spaces]}
    raise ValueError(f"no plain-data form for the space {space}")


def space_from_data(data: dict):
    """The Gymnasium space ``space_to_data`` wrote (a KeyError, TypeError or ValueError for malformed data)."""
    import gymnasium.spaces as s
    kind = data["type"]
    if kind == "Box":
        shape = tuple(data["shape"])
        bound = (lambda v: np.reshape(np.asarray(v), shape) if isinstance(v, list) else v)
        return s.Box(bound(data["low"]), bound(data["high"]), shape, np.dtype(data["dtype"]))
    if kind == "Discrete":
        return s.Discrete(int(data["n"]), start=int(data["start"]), dtype=np.dtype(data["dtype"]))
    if kind == "MultiDiscrete":
        return s.MultiDiscrete(np.asarray(data["nvec"]), np.dtype(data["dtype"]), start=np.asarray(data["start"]))
    if kind == "MultiBinary":
        return s.MultiBinary(data["n"])
    if kind == "Text":
        return s.Text(int(data["max_length"]), min_length=int(data["min_length"]), charset=str(data["charset"]))
    if kind == "Dict":
        return s.Dict({str(key): space_from_data(sub) for key, sub in data["spaces"]})
    if kind == "Tuple":
        return s.Tuple([space_from_data(sub) for sub in data["spaces"]])
    raise ValueError(f"unknown space type {kind!r}")


def spaces_to_data(observation_space, action_space) -> dict | None:
    """``{"observation": ..., "action": ...}`` as ``space_to_data`` writes them; None when either has no such form."""
    try:
        return {"observation": space_to_data(observation_space), "action": space_to_data(action_space)}
    except ValueError:
        return None

"""Checkpoints: atomic writes (tmp + fsync + rename), keep-last-N, safe loading (``weights_only=True``), corruption
detected.

A checkpoint is a dict of tensors, numbers, strings, lists and dicts only, so ``torch.load`` never
has to unpickle arbitrary objects: a file carrying code is refused. Its ``checksum`` entry is the sha256 of the rest
(``contents_digest``), checked on load along with the zip's CRCs; a file without one (written before checksums) is
still loaded. A corrupt checkpoint is refused naming the newest older checkpoint of its directory that verifies.
"""
from __future__ import annotations

import hashlib
import io
import pickle
import random
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from fastrl.config import CODE_KEYS, Config, UserError, brief, make_config

_NAME = re.compile(r"^ckpt_(\d{12})\.pt$")


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"ckpt_{step:012d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in ``directory``, oldest first."""
    return sorted(p for p in Path(directory).glob("ckpt_*.pt") if _NAME.match(p.name))  # none: a missing directory


def save_checkpoint(state: dict, path: Path, keep: int = 0) -> Path:
    """Write ``state`` atomically to ``path`` (``fastrl.run.storage.atomic_write``: a full disk is a one-line
    UserError, the partial file removed and the earlier checkpoints untouched); then delete all but the newest
    ``keep`` (0 keeps all) and any temporary file a killed writer left."""
    from fastrl.run.storage import atomic_write
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = io.BytesIO()
    torch.save({**state, "checksum": contents_digest(state)}, data)
    atomic_write(path, data.getbuffer(), "checkpoint", " (earlier checkpoints are intact)")
    if keep > 0:
        for old in list_checkpoints(path.parent)[:-keep]:
            old.unlink(missing_ok=True)
    for leftover in path.parent.glob(".ckpt_*.tmp.*"):  # a kill -9 mid-write; the run dir's lock makes them stale
        leftover.unlink(missing_ok=True)
    return path


def checkpoint_config(state: dict, where: str, given: dict | None = None) -> Config:
    """The ``Config`` a checkpoint was trained with, the code names the user passed in ``given`` (its ``CODE_KEYS``:
    ``env``, which may also be a class or factory, and ``policy``) replacing the checkpoint's own.

    A checkpoint never makes fastrl import or call code: a saved code key whose value names code (``module:Name``) is
    refused unless the user passes that key in this process (``--env``, ``--policy``, ``env=``, ``policy=``)."""
    from fastrl.envs.registry import env_name, is_process_local
    from fastrl.names import names_code
    saved = state["config"]
    mine = {key: value for key, value in (given or {}).items() if key in CODE_KEYS and value is not None}
    if "env" in mine:
        mine["env"] = env_name(mine["env"])
    for key in CODE_KEYS:
        value = saved.get(key)
        if key in mine or not names_code(value) or (key == "env" and is_process_local(value)):
            continue
        raise UserError(f"{where} names the {key} {brief(value)}, which would import and run code from "
                        f"{brief(value.rpartition(':')[0], 60)}; loading never does that on a file's word: pass it "
                        f"yourself (--{key} {value[:80]}, or {key}=... in Python) if you trust it")
    return make_config({**saved, **mine}, where=where)


def resolve_checkpoint(target: str | Path) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory."""
    target = Path(target)
    if target.is_file():
        return target
    if target.is_dir():
        found = list_checkpoints(target / "checkpoints") or list_checkpoints(target)
        if found:
            return found[-1]
        raise UserError(f"no checkpoint found in {str(target)!r}; pass a run directory that holds checkpoints/ckpt_*.pt")
    raise UserError(f"checkpoint {str(target)!r} not found; pass an existing checkpoint file or run directory")


def contents_digest(state: dict) -> str:
    """sha256 (hex) over ``state`` without its ``checksum`` entry: every key, plain value and tensor (dtype, shape and
    bytes), in order."""
    digest = hashlib.sha256()
    _feed(digest, {key: value for key, value in state.items() if key != "checksum"})
    return digest.hexdigest()


def _feed(digest, value) -> None:
    if torch.is_tensor(value):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        digest.update(b"D%d" % len(value))
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, (list, tuple)):  # weights_only loading may turn one into the other
        digest.update(b"L%d" % len(value))
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


class CorruptCheckpoint(UserError):
    """A checkpoint file whose bytes are damaged (truncated, bit flips, a checksum that does not match)."""


def _read_verified(path: Path) -> dict:
    """The state in ``path``, or ``CorruptCheckpoint`` / a UserError (code-carrying or foreign file)."""
    try:
        with zipfile.ZipFile(path) as archive:  # torch.save always writes a zip archive, with CRCs torch.load skips
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError):
        raise CorruptCheckpoint("not a readable zip archive") from None
    if bad is not None:
        raise CorruptCheckpoint(f"its entry {bad} fails its CRC check")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        message = str(e)
        if "Weights only load failed" in message or "Unsupported global" in message:
            raise UserError(f"refusing to load {path}: it holds objects other than tensors and plain data, "
                            "which could run code; only load checkpoints you trust with other tools") from None
        raise CorruptCheckpoint("its pickle is damaged") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError):
        raise CorruptCheckpoint("torch.load cannot read it") from None
    if not isinstance(state, dict) or ("model" not in state and "members" not in state) or \
            not isinstance(state.get("config"), dict):
        raise UserError(f"{path} is not a fastrl checkpoint (no model entry, or no config mapping)")
    if "checksum" in state and state.pop("checksum") != contents_digest(state):
        raise CorruptCheckpoint("its contents do not match the checksum written with them")
    return state


def load_checkpoint(target: str | Path) -> dict:
    """Load safely and verify. A corrupt (truncated, damaged, checksum mismatch) file raises a one-line UserError
    naming the newest older checkpoint of its directory that verifies, or saying that none does; a code-carrying or
    foreign file is refused in one line too."""
    path = resolve_checkpoint(target)
    try:
        return _read_verified(path)
    except CorruptCheckpoint as e:
        why = str(e)
    older = [p for p in list_checkpoints(path.parent) if p.name < path.name]
    for candidate in reversed(older):
        try:
            _read_verified(candidate)
        except UserError:
            continue
        raise UserError(f"checkpoint {path} is corrupted or truncated ({why}); the newest older checkpoint that "
                        f"verifies is {candidate}: pass that one instead (or delete the corrupt file)")
    others = f"none of the {len(older)} older checkpoints in {path.parent} verifies either" if older else \
        "there is no older checkpoint beside it"
    raise UserError(f"checkpoint {path} is corrupted or truncated ({why}), and {others}: start a new run")


def misfit(error: BaseException) -> str:
    """The line of a ``load_state_dict`` error that says what does not fit (a size mismatch, a missing key)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return next((line for line in lines if "mismatch" in line or "key" in line.lower()), lines[0])


def load_weights(model: torch.nn.Module, weights, where: str) -> None:
    """``model.load_state_dict(weights)``, or a one-line UserError when the checkpoint's weights do not fit the model
    its config builds."""
    try:
        model.load_state_dict(weights)
    except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as e:
        raise UserError(f"the weights of {where} do not fit the model its config builds ({misfit(e)[:200]}): the "
                        "file was altered or comes from another program; use another checkpoint") from None


def select_member(state: dict, member: int | None, where) -> dict:
    """One agent's checkpoint state: ``state`` itself for a single run, ``state["members"][member]`` for a population
    (``--n-seeds``/``--vary``), whose checkpoint holds every member in the single-run format."""
    if "members" not in state:
        if member not in (None, 0):
            raise UserError(f"{where} holds one agent, not a population: drop the member number")
        return state
    count = len(state["members"])
    if member is None:
        raise UserError(f"{where} holds a population of {count} members: pick one with member=M "
                        f"(fastrl eval --member M), M in 0..{count - 1}")
    if not 0 <= member < count:
        raise UserError(f"member {member} is not in {where}: it holds members 0..{count - 1}")
    return state["members"][member]


def rng_state(generator: torch.Generator) -> dict:
    """Torch, sampling-generator, Python and NumPy RNG states as tensors and lists (weights_only-safe)."""
    return {"torch": torch.get_rng_state(), "sample": generator.get_state(),
            "python": list(random.getstate()[1]), "numpy": torch.from_numpy(np.random.get_state()[1].copy())}


def load_rng_state(state: dict, generator: torch.Generator) -> None:
    """Restore what ``rng_state`` captured."""
    torch.set_rng_state(state["torch"])
    generator.set_state(state["sample"])
    version, _, gauss = random.getstate()
    random.setstate((version, tuple(int(x) for x in state["python"]), gauss))
    np_state = np.random.get_state()
    np.random.set_state((np_state[0], state["numpy"].numpy().astype(np.uint32), *np_state[2:]))


def env_spaces(cfg: Config) -> dict | None:
    """The ``spaces`` entry of a checkpoint of ``cfg``'s env: its observation and action spaces as plain data
    (``fastrl.envs.spaces.spaces_to_data``), so ``fastrl.load`` builds the policy and acts without the env; None where a
    space has no such form."""
    from fastrl.envs.batched import probe_spaces
    from fastrl.envs.spaces import spaces_to_data
    return spaces_to_data(*probe_spaces(cfg))


def checkpoint_spaces(state: dict, where: str) -> tuple | None:
    """``(observation_space, action_space)``, Gymnasium spaces, from a checkpoint's ``spaces`` entry; None for a
    checkpoint without one (older ones, or an env whose spaces have no plain-data form)."""
    from fastrl.envs.spaces import space_from_data
    entry = state.get("spaces")
    if entry is None:
        return None
    try:
        return space_from_data(entry["observation"]), space_from_data(entry["action"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{where} holds malformed spaces ({type(e).__name__}: {e}); it was not written by fastrl") from None

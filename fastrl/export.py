"""The deployed policy: raw observations in, the env's actions out, exactly as ``Agent.predict(obs,
deterministic=True)`` gives them. ``RawPolicy`` is that function as one ``nn.Module`` (``Agent.act`` runs it);
``export`` writes it, with the env's raw inputs in front, to a file that onnxruntime or libtorch runs alone::

    agent.export("policy.onnx")                        # or fastrl export RUN --format onnx --out policy.onnx
    session = onnxruntime.InferenceSession("policy.onnx")
    action = session.run(["action"], {"obs": obs_batch})[0]

The file's inputs, batch first (any batch size): ``obs`` ``[B, *shape]`` in the env's dtype (float64 as float32),
``shape`` as one env hands it out (a channels-last image as ``[H, W, C]``, a Discrete observation as ``[B]``, with the
time feature appended when the run used one); a Dict observation gives one input per key, named by the key, in the
order fastrl packs them (``fastrl.envs.spaces.dict_layout``; TorchScript: positional, in that order), each entry
reaching the policy as it does in training, whatever its key; MiniGrid's Dict, its ``image``. The output ``action``:
int64 ``[B]`` (Discrete), ``[B, k]`` (MultiDiscrete, MultiBinary) or float32 ``[B, *action_shape]`` within the Box
bounds. A recurrent policy (``recurrent: lstm | gru``) takes two more inputs, ``state`` float32 ``[B, S]`` (zeros to
start; an LSTM's ``(h, c)`` side by side, as ``predict`` returns them concatenated) and ``episode_start`` bool ``[B]``
(rows whose state is zeroed first), and gives two outputs: ``action`` and ``next_state``, the next step's ``state``
(ONNX names are unique).
"""
from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import torch
from torch import nn

from fastrl.config import UserError
from fastrl.envs.spaces import observation_format, pack_observation
from fastrl.envs.stats import normalize_observation

FORMATS = ("onnx", "torchscript")


class RawPolicy(nn.Module):
    """``policy`` between raw observations and the env's actions. ``observation(x [B, *shape])``: cast to
    the env's ``dtype`` and, when the run normalized observations, normalized by its saved statistics (``obs_rms``:
    the checkpoint's dict, whose ``mean`` and ``var`` become buffers here) and clipped to ``[-clip, clip]``;
    ``action(a)``: continuous actions clamped to ``bounds`` (``(low, high)``, each ``[*action_shape]``).
    ``forward(x)``: the deterministic action between the two (the policy's ``act_deterministic``); a pixel model
    scales its frames itself (``obs_scale``).

    ``install()`` hooks it around ``policy.forward``, so ``policy(obs)`` is ``forward(obs)`` of raw observations, one
    ``[*shape]`` (its batch axis dropped after) or a batch."""

    def __init__(self, policy: nn.Module, shape: tuple, dtype: torch.dtype, obs_rms=None, clip: float = 10.0,
                 bounds: tuple | None = None):
        super().__init__()
        self.policy, self.obs_ndim, self.obs_dtype, self.clip, self.single = policy, len(shape), dtype, clip, False
        self.normalized, self.clamped = obs_rms is not None, bounds is not None
        if obs_rms is not None:  # normalize_observation reads .mean and .var: this module stands in for obs_rms
            self.register_buffer("mean", obs_rms["mean"].clone())
            self.register_buffer("var", obs_rms["var"].clone())
        if bounds is not None:
            self.register_buffer("low", bounds[0])
            self.register_buffer("high", bounds[1])

    def observation(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.obs_dtype)
        return normalize_observation(x, self, self.clip) if self.normalized else x

    def action(self, action: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(action.float(), self.high), self.low) if self.clamped else action

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.action(self.policy.act_deterministic(self.observation(x)))

    def step(self, x: torch.Tensor, state: torch.Tensor | None = None, episode_start: torch.Tensor | None = None,
             deterministic: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(action, state)`` between raw observations and the env's actions: a recurrent policy's step
        (``RecurrentActorCritic.act``) from ``state [B, S]`` (None: zeros), zeroed first where ``episode_start [B]``;
        another policy's action (its mode, or a sample), with ``state`` None."""
        obs = self.observation(x)
        if hasattr(self.policy, "state_size"):
            action, state = self.policy.act(obs, state, episode_start, deterministic)
        else:
            action = self.policy.act_deterministic(obs) if deterministic else self.policy.get_action_and_value(obs)[0]
        return self.action(action), state

    def install(self) -> None:
        self.policy.register_forward_pre_hook(self._before)
        self.policy.register_forward_hook(self._after)

    def _before(self, module, args):
        x = args[0]
        self.single = x.dim() == self.obs_ndim  # what _after must undo (the calls of one forward never interleave)
        return (self.observation(x.unsqueeze(0) if self.single else x), *args[1:])

    def _after(self, module, args, action):
        action = self.action(action)
        return action[0] if self.single else action


class EnvInputs(nn.Module):
    """``raw`` (a ``RawPolicy``) over the env's own observations: ``forward(*inputs)``, one tensor per input, batch
    first, as the module docstring describes; a Dict's entries are packed here as the env packs them
    (``pack_observation``), so every entry, whatever its key, reaches the policy as it does in training."""

    def __init__(self, raw: RawPolicy, layout: tuple | None, hwc: bool, scalar: bool):
        super().__init__()
        self.raw, self.layout, self.hwc, self.scalar = raw, layout, hwc, scalar
        self.recurrent = hasattr(raw.policy, "state_size")

    def forward(self, *inputs: torch.Tensor):
        if self.recurrent:  # the last two inputs: state [B, S] and episode_start [B] (bool)
            inputs, (state, episode_start) = inputs[:-2], inputs[-2:]
        if self.layout is not None:
            obs = pack_observation({part.key: x for part, x in zip(self.layout, inputs)}, self.layout)
        else:
            obs = inputs[0].movedim(-1, -3) if self.hwc else inputs[0].unsqueeze(-1) if self.scalar else inputs[0]
        return self.raw.step(obs, state, episode_start) if self.recurrent else self.raw(obs)


def exportable(agent) -> tuple[EnvInputs, dict[str, torch.Tensor]]:
    """The exportable module of ``agent`` (a ``fastrl.api.Agent``), on the CPU, and an example batch of two zeros per
    input name, in the inputs' dtypes."""
    space, shape = agent.observation_space, agent.observation_shape
    form = observation_format(space, agent.config.env)
    raw = copy.deepcopy(agent.raw_policy).cpu().requires_grad_(False)  # so a traced module's action needs no grad
    if form.layout is not None:
        entries = {part.key: space.spaces[part.key] for part in form.layout}
        example = {key: torch.zeros(2, *sub.shape, dtype=observation_format(sub, key).dtype)
                   for key, sub in entries.items()}
        model = EnvInputs(raw, form.layout, False, False)
    else:
        hwc = form.hwc or form.image_key is not None
        scalar = not hwc and getattr(space, "shape", None) == ()
        raw_shape = (shape[1], shape[2], shape[0]) if hwc else () if scalar else shape
        example = {form.image_key or "obs": torch.zeros(2, *raw_shape, dtype=agent.observation_dtype)}
        model = EnvInputs(raw, None, hwc, scalar)
    if model.recurrent:
        example.update(state=torch.zeros(2, raw.policy.state_size), episode_start=torch.zeros(2, dtype=torch.bool))
    return model.eval(), example


def export_target(path: str | os.PathLike, format: str) -> Path:
    """``path`` as a Path, once ``format`` is known, the packages it needs are installed and ``path``'s directory
    exists (else a one-line UserError)."""
    if format not in FORMATS:
        raise UserError(f"unknown export format {format!r}; pick one of {', '.join(FORMATS)}")
    missing = [name for name in ("onnx", "onnxscript") if format == "onnx" and importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"ONNX export needs {' and '.join(missing)}: pip install 'fastrl[export]'")
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"cannot write {str(path)!r}: its directory {str(path.parent)!r} does not exist; create it "
                        "or pick another path")
    return path


def export(agent, path: str | os.PathLike, format: str = "onnx") -> Path:
    """Write ``agent``'s deterministic policy of raw observations (see the module docstring) to ``path``:
    ``format`` "onnx" (inputs named as described, output ``action``, the batch axis dynamic; needs onnx and
    onnxscript: ``pip install 'fastrl[export]'``) or "torchscript" (``torch.jit.trace``, saved by ``torch.jit.save``;
    ``torch.jit.load`` runs it; torch 2.13 marks TorchScript deprecated, which is why ONNX is the default). Returns
    the path."""
    path = export_target(path, format)
    model, example = exportable(agent)
    args = tuple(example.values())
    with torch.no_grad():
        if format == "torchscript":
            torch.jit.save(torch.jit.trace(model, args), str(path))
            return path
        batch = torch.export.Dim("batch")
        # forward(*inputs) takes one argument, the tuple of inputs: one spec per input, in a tuple of its own
        outputs = ["action", "next_state"] if model.recurrent else ["action"]
        torch.onnx.export(model, args, str(path), input_names=list(example), output_names=outputs, dynamo=True,
                          verbose=False, dynamic_shapes=(({0: batch},) * len(args),), external_data=False)
    return path

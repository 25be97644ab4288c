"""Actor-critic models: encoders, policy/value heads and the action distributions they need.

API (CleanRL's): ``get_value(obs) -> [B]`` and
``get_action_and_value(obs, action=None) -> (action, logp [B], entropy [B], value [B])``.
Discrete actions are int64 ``[B]``; continuous actions are float32 ``[B, *action_shape]``.

Encoders: an MLP for flat observations (``ActorCritic``), and for images a shared convolutional trunk
(``PixelActorCritic``): ``NatureCNN`` (Atari), ``ImpalaResNet`` and ``MiniGridCNN`` (7x7 grids). Image
observations arrive in their native dtype (uint8 frames) and become floats, times ``obs_scale``, only inside
the model.

Recurrent policies (``RecurrentActorCritic``): any of those encoders, then one LSTM or GRU layer, then the heads.
The recurrent state of B env columns is one float32 tensor ``[B, S]``: LSTM ``(h, c)`` side by side (S = 2H), GRU
``h`` (S = H); with a population's member axis the rollout holds ``[K * B, S]``, member-major like every per-env
tensor. ``episode_start [B]`` (bool) zeroes a row's state before its step, so the first observation of an episode
sees a zero state (when the rollout sets it: ``fastrl.run.recurrent``). One method serves the rollout step and the
update: ``get_action_and_value(obs [T * B, ...], action, noise, state [B, S], episode_start [T * B])`` unrolls the
core over T time-major steps (T = 1 when acting) from ``state`` and returns ``(action, logp, entropy, value,
state)``: ``[T * B]`` rows and the state after the last step, the same ops in the same order whatever T, so the
update's unrolled forward reproduces the rollout's step by step.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fastrl.config import UserError
from fastrl.envs.registry import is_procgen
from fastrl.envs.spaces import ActionSpec, observation_format
from fastrl.kernels.recurrent import lstm_sequence
from fastrl.learn.masking import action_mask, masked_logits

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
GSDE_EPSILON = 1e-6  # added to gSDE's variance before its square root (SB3's StateDependentNoiseDistribution's)


def orthogonal_init(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden_sizes: list, activation: str) -> nn.Sequential:
    layers, dim = [], in_dim
    for width in hidden_sizes:
        layers += [orthogonal_init(nn.Linear(dim, width)), ACTIVATIONS[activation]()]
        dim = width
    return nn.Sequential(*layers)


# What each of ACTIVATIONS' modules computes in its forward, as a function.
_ACTIVATION_FUNCTIONS = {nn.Tanh: torch.tanh, nn.ReLU: F.relu, nn.ELU: F.elu, nn.SiLU: F.silu}


def run_mlp(trunk: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``trunk(x)`` for an ``mlp`` stack (or a single ``nn.Linear``), op for op, without nn.Module's per-call dispatch:
    at the sizes of a small MLP that dispatch is about a quarter of an eager forward's cost. Weights are read from
    the modules at each call, so ``torch.func.functional_call`` and bound flat weights see their own."""
    for layer in (trunk if isinstance(trunk, nn.Sequential) else (trunk,)):
        kind = type(layer)
        if kind is nn.Linear:
            x = F.linear(x, layer.weight, layer.bias)
        elif kind in _ACTIVATION_FUNCTIONS:
            x = _ACTIVATION_FUNCTIONS[kind](x)
        else:
            x = layer(x)
    return x


def categorical_logp_entropy(logits: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [B, A]``, ``action [B]`` int64 -> ``logp [B]``, ``entropy [B]``."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    logp = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def categorical_sample(logits: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """Gumbel-max sampling: no host sync, compiles cleanly. ``[B, A] -> [B]`` int64.

    ``uniform [B, A]``: the U(0, 1) draws to use (default: ``torch.rand_like`` from the global generator)."""
    uniform = (torch.rand_like(logits, dtype=torch.float32) if uniform is None else uniform).clamp(1e-20, 1.0)
    return torch.argmax(logits.float() - torch.log(-torch.log(uniform)), dim=-1)


def gaussian_logp_entropy(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor):
    """Diagonal Gaussian, state-independent ``log_std [A]``. ``mean, action [B, A]`` -> ``logp [B]``, ``entropy [B]``."""
    mean = mean.float()
    z = (action - mean) * torch.exp(-log_std)
    logp = (-0.5 * z.square() - log_std - LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + LOG_SQRT_2PI + log_std).sum(-1).expand(mean.shape[:-1])
    return logp, entropy


def gsde_distribution(latent: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor | None = None):
    """Generalized state-dependent exploration (gSDE, Raffin et al. 2021; SB3's ``use_sde`` with ``full_std``): the
    action is ``mean + latent @ (std * eps)``, ``eps`` N(0, 1) weights ``[L, A]`` per env, held for several steps, so
    the noise is a smooth function of the state. Given the latent, each action dim is Gaussian with variance
    ``latent^2 @ std^2``.

    ``latent [..., B, L]`` (the policy trunk's last hidden layer; detached here: the noise does not train the trunk),
    ``log_std [..., L, A]`` (a member axis in front, or none), ``noise [..., B, L * A]`` (the ``eps``, optional) ->
    ``(row_log_std [..., B, A], exploration [..., B, A] or None)``: each row's log-std and the term added to the mean."""
    latent = latent.detach().float()
    std = log_std.exp()
    row_log_std = 0.5 * torch.log(torch.matmul(latent.square(), std.square()) + GSDE_EPSILON)
    exploration = None
    if noise is not None:
        eps = noise.reshape(*latent.shape, std.shape[-1])
        exploration = (latent.unsqueeze(-1) * std.unsqueeze(-3) * eps).sum(-2)
    return row_log_std, exploration


def action_logp_entropy(out: torch.Tensor, spec: ActionSpec, log_std, action: torch.Tensor | None,
                        noise: torch.Tensor | None, exploration: torch.Tensor | None = None, mask=None):
    """The policy head's output ``out [B, A]`` as a distribution: sample ``action`` when None (``noise``: U(0, 1)
    ``[B, n]`` for discrete, N(0, 1) ``[B, A]`` for continuous; default from the global generator), and return
    ``(action, logp [B], entropy [B])``. MultiDiscrete (``spec.nvec``): one categorical per component over its slice
    of the logits, log-probabilities and entropies summed. gSDE (``gsde_distribution``): ``log_std`` is per row
    ``[B, A]`` and a sampled action is ``out + exploration``. ``mask [B, n]`` (bool, discrete actions): the valid
    actions (``fastrl.learn.masking``); the others get probability zero."""
    if mask is not None:
        out = masked_logits(out, mask)
    if spec.kind == "discrete" and spec.nvec:
        slices = torch.split(out, list(spec.nvec), dim=-1)
        uniform = torch.split(noise, list(spec.nvec), dim=-1) if noise is not None else [None] * len(slices)
        if action is None:
            action = torch.stack([categorical_sample(z, u) for z, u in zip(slices, uniform)], dim=-1)
        action = action.view(-1, len(spec.nvec))
        parts = [categorical_logp_entropy(z, action[:, i]) for i, z in enumerate(slices)]
        return action, sum(p[0] for p in parts), sum(p[1] for p in parts)
    if spec.kind == "discrete":
        if action is None:
            action = categorical_sample(out, noise)
        logp, entropy = categorical_logp_entropy(out, action)
        return action, logp, entropy
    if action is None and exploration is not None:
        action = out.float() + exploration
    elif action is None:
        draws = torch.randn_like(out, dtype=torch.float32) if noise is None else noise
        action = out.float() + draws * log_std.exp()
    action = action.view(out.shape)
    logp, entropy = gaussian_logp_entropy(out, log_std, action)
    return action.view(-1, *spec.shape), logp, entropy


def action_mode(out: torch.Tensor, spec: ActionSpec, mask=None) -> torch.Tensor:
    """The policy's mode: argmax (per component for MultiDiscrete; over the valid actions, given ``mask``), or the mean
    for continuous actions."""
    if mask is not None:
        out = masked_logits(out, mask)
    if spec.kind == "discrete" and spec.nvec:
        return torch.stack([z.argmax(-1) for z in torch.split(out, list(spec.nvec), dim=-1)], dim=-1)
    if spec.kind == "discrete":
        return out.argmax(-1)
    return out.float().view(-1, *spec.shape)


def _head_width(spec: ActionSpec) -> int:
    return spec.n if spec.kind == "discrete" else math.prod(spec.shape)


class OneHot(nn.Module):
    """Integer observations ``[..., k]`` (component i takes ``sizes[i]`` values from ``starts[i]``) as float32 one-hot
    ``[..., sum(sizes)]``; a value out of range encodes as zeros. Elementwise compares with constant buffers: no host
    sync, and it runs under ``vmap`` and ``torch.compile``."""

    def __init__(self, sizes: tuple, starts: tuple):
        super().__init__()
        widest = max(sizes)
        self.register_buffer("starts", torch.tensor(starts, dtype=torch.int64), persistent=False)
        self.register_buffer("values", torch.arange(widest), persistent=False)
        columns = [i * widest + j for i, size in enumerate(sizes) for j in range(size)]
        self.register_buffer("columns", torch.tensor(columns), persistent=False)  # each component's own values
        self.width = len(columns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hot = (x.long() - self.starts).unsqueeze(-1) == self.values  # [..., k, widest]
        return hot.flatten(-2)[..., self.columns].float()


class ActorCriticHeads(nn.Module):
    """Policy and value heads over an encoder's features, and the API of every built-in actor-critic (CleanRL's,
    see the module docstring). A subclass defines ``_features(obs) -> [B, F]`` (one vector for both heads) or
    ``_actor_critic(obs) -> (actor, critic)`` features, and builds its heads with ``_build_heads``; ``mask_width``
    as ``ActorCritic``'s."""
    mask_width = 0
    use_sde = False

    def _build_heads(self, action_spec: ActionSpec, policy_width: int, value_width: int, init_log_std: float,
                     sde_width: int = 0) -> None:
        """The policy head (gain 0.01), the value head (gain 1) and, for continuous actions, ``log_std`` ``[A]`` (gSDE:
        ``[sde_width, A]``)."""
        self.action_spec = action_spec
        self.discrete = action_spec.kind == "discrete"
        out_dim = _head_width(action_spec)
        self.policy_head = orthogonal_init(nn.Linear(policy_width, out_dim), gain=0.01)
        self.value_head = orthogonal_init(nn.Linear(value_width, 1), gain=1.0)
        if not self.discrete:
            shape = (sde_width, out_dim) if sde_width else (out_dim,)
            self.log_std = nn.Parameter(torch.full(shape, float(init_log_std)))

    def _actor_critic(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self._features(obs)
        return features, features

    def _critic(self, obs: torch.Tensor) -> torch.Tensor:
        return self._actor_critic(obs)[1]

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return run_mlp(self.value_head, self._critic(obs)).squeeze(-1).float()

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None,
                             noise: torch.Tensor | None = None):
        """``noise [B, noise_width]`` (optional, when sampling): U(0, 1) draws for discrete actions, N(0, 1) for
        continuous ones (gSDE: the exploration weights); default: drawn from torch's global generator."""
        actor, critic = self._actor_critic(obs)
        out = run_mlp(self.policy_head, actor)
        value = run_mlp(self.value_head, critic).squeeze(-1).float()
        log_std, exploration = getattr(self, "log_std", None), None
        if self.use_sde:  # continuous actions: no mask
            if action is None and noise is None:
                noise = torch.randn(actor.shape[0], self.noise_width, device=actor.device)
            log_std, exploration = gsde_distribution(actor, self.log_std, None if action is not None else noise)
            noise = None
        action, logp, entropy = action_logp_entropy(out, self.action_spec, log_std, action, noise, exploration,
                                                    action_mask(obs.flatten(1), self.mask_width))
        return action, logp, entropy, value

    @torch.no_grad()
    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode of the policy: argmax for discrete, the mean for continuous actions."""
        return action_mode(run_mlp(self.policy_head, self._actor_critic(obs)[0]), self.action_spec,
                           action_mask(obs.flatten(1), self.mask_width))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``act_deterministic``: what ``policy(obs)`` gives, e.g. inside TorchRL's ``TensorDictModule``."""
        return self.act_deterministic(obs)


class ActorCritic(ActorCriticHeads):
    """MLP actor-critic over flat observations, with a shared trunk or separate policy/value trunks (``pi_sizes`` /
    ``vf_sizes``: their widths, each defaulting to ``hidden_sizes``).

    Continuous actions: a Gaussian with a state-independent ``log_std [A]``, or with ``use_sde`` gSDE
    (``gsde_distribution``): ``log_std [L, A]`` over the policy trunk's last hidden layer (``L`` units), and the
    sampling noise ``[B, L * A]`` (``noise_width``) holds each env's exploration weights.

    ``one_hot`` (``fastrl.envs.spaces.one_hot_sizes``): the observations are Discrete or MultiDiscrete integers, one-hot
    encoded before the trunks (``OneHot``).

    ``mask_width``: the observation's last ``mask_width`` columns are the action mask (``fastrl.learn.masking``), split
    off before the trunks."""

    def __init__(self, obs_shape: tuple, action_spec: ActionSpec, hidden_sizes=(64, 64), activation: str = "tanh",
                 shared_trunk: bool = False, init_log_std: float = 0.0, pi_sizes=(), vf_sizes=(),
                 use_sde: bool = False, one_hot: tuple | None = None, mask_width: int = 0):
        super().__init__()
        if use_sde and action_spec.kind == "discrete":
            raise UserError("use_sde (gSDE) is for continuous actions, and this env's are discrete: drop use_sde")
        self.one_hot = OneHot(*one_hot) if one_hot else None
        self.mask_width = mask_width
        in_dim = self.one_hot.width if one_hot else math.prod(obs_shape) - mask_width
        pi_sizes, vf_sizes = list(pi_sizes or hidden_sizes), list(vf_sizes or hidden_sizes)
        self.shared_trunk = shared_trunk
        self.actor_trunk = mlp(in_dim, pi_sizes, activation)
        self.critic_trunk = self.actor_trunk if shared_trunk else mlp(in_dim, vf_sizes, activation)
        self.use_sde = bool(use_sde)
        self._build_heads(action_spec, pi_sizes[-1], (pi_sizes if shared_trunk else vf_sizes)[-1], init_log_std,
                          pi_sizes[-1] if self.use_sde else 0)

    @property
    def noise_width(self) -> int:
        """Columns of the sampling noise ``get_action_and_value`` takes: ``L * A`` under gSDE, else the head's."""
        return self.log_std.numel() if self.use_sde else _head_width(self.action_spec)

    def trunk_input(self, flat_obs: torch.Tensor) -> torch.Tensor:
        """Flattened observations ``[..., D]`` as the trunks take them: float32 ``[..., in_dim]``."""
        if self.mask_width:
            flat_obs = flat_obs[..., :-self.mask_width]
        return flat_obs.float() if self.one_hot is None else self.one_hot(flat_obs)

    def _actor_critic(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk_input(obs.flatten(1))
        actor = run_mlp(self.actor_trunk, x)
        critic = actor if self.shared_trunk else run_mlp(self.critic_trunk, x)
        return actor, critic

    def _critic(self, obs: torch.Tensor) -> torch.Tensor:
        return run_mlp(self.critic_trunk, self.trunk_input(obs.flatten(1)))


# ---------------------------------------------------------------------------------------------- pixel encoders
class _ConvEncoder(nn.Module):
    """A conv trunk (ending in Flatten) and a ReLU fc of ``features``; the fc's input size is probed once."""

    def __init__(self, convs: nn.Sequential, obs_shape: tuple, features: int):
        super().__init__()
        self.convs = convs
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(orthogonal_init(nn.Linear(flat, features)), nn.ReLU())
        self.out_dim = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(x))


class NatureCNN(_ConvEncoder):
    """Mnih et al. (2015): 32x8x8/4, 64x4x4/2, 64x3x3/1, then a 512 fc; ReLU. ``[B, C, 84, 84] -> [B, 512]``."""

    def __init__(self, obs_shape: tuple, features: int = 512):
        super().__init__(nn.Sequential(
            orthogonal_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
            orthogonal_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            orthogonal_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten()), obs_shape, features)


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaResNet(_ConvEncoder):
    """Espeholt et al. (2018): 3 stacks of (conv 3x3, max-pool 3x3/2, 2 residual blocks), channels 16/32/32,
    then ReLU and a 256 fc. ``[B, C, H, W] -> [B, 256]``."""

    def __init__(self, obs_shape: tuple, channels=(16, 32, 32), features: int = 256):
        layers, in_ch = [], obs_shape[0]
        for out_ch in channels:
            layers += [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       _ResidualBlock(out_ch), _ResidualBlock(out_ch)]
            in_ch = out_ch
        super().__init__(nn.Sequential(*layers, nn.ReLU(), nn.Flatten()), obs_shape, features)


class MiniGridCNN(_ConvEncoder):
    """Small grids (MiniGrid's 7x7 view): 16/32/64 channels of 2x2 convs with one 2x2 max-pool, then a 64 fc.
    Cheap enough to learn on a CPU in CI. ``[B, 3, 7, 7] -> [B, 64]``."""

    def __init__(self, obs_shape: tuple, features: int = 64):
        super().__init__(nn.Sequential(
            orthogonal_init(nn.Conv2d(obs_shape[0], 16, 2)), nn.ReLU(), nn.MaxPool2d(2),
            orthogonal_init(nn.Conv2d(16, 32, 2)), nn.ReLU(),
            orthogonal_init(nn.Conv2d(32, 64, 2)), nn.ReLU(), nn.Flatten()), obs_shape, features)


class SmallCNN(_ConvEncoder):
    """Images of any size, small ones too (32x32 RGB, a 5x5 grid): 3x3 convs with padding, 32 channels at stride 1,
    then 64 at stride 2 twice, then a 256 fc. ``[B, C, H, W] -> [B, 256]``."""

    def __init__(self, obs_shape: tuple, features: int = 256):
        super().__init__(nn.Sequential(
            orthogonal_init(nn.Conv2d(obs_shape[0], 32, 3, padding=1)), nn.ReLU(),
            orthogonal_init(nn.Conv2d(32, 64, 3, stride=2, padding=1)), nn.ReLU(),
            orthogonal_init(nn.Conv2d(64, 64, 3, stride=2, padding=1)), nn.ReLU(), nn.Flatten()), obs_shape, features)


ENCODERS = {"nature_cnn": NatureCNN, "impala_resnet": ImpalaResNet, "minigrid_cnn": MiniGridCNN, "small_cnn": SmallCNN}
NATURE_CNN_MIN_SIDE = 36  # 8x8/4, 4x4/2, 3x3/1 leave one pixel at 36


def resolve_encoder(name: str, obs_shape: tuple, env_id: str = "") -> str:
    """``auto``: MLP for flat observations; for images ``[C, H, W]``: ImpalaResNet for Procgen (``env_id`` an EnvPool
    Procgen id, as in Cobbe et al. 2020), MiniGridCNN for grids from 7x7 to under 16x16, NatureCNN from 36x36 up,
    and SmallCNN for the sizes between and below, which the others do not take."""
    if name != "auto":
        return name
    if len(obs_shape) != 3:
        return "mlp"
    if env_id and is_procgen(env_id):
        return "impala_resnet"
    side = min(obs_shape[1:])
    if 7 <= side < 16:
        return "minigrid_cnn"
    return "nature_cnn" if side >= NATURE_CNN_MIN_SIDE else "small_cnn"


class PixelActorCritic(ActorCriticHeads):
    """A convolutional trunk shared by the policy and value heads; same API as ``ActorCritic``.

    ``obs [B, C, H, W]`` in any dtype (uint8 frames) is cast to float and scaled by ``obs_scale`` here, so
    frames travel and are stored as uint8. ``channels_last`` puts activations in NHWC (faster convs on CUDA).
    """

    def __init__(self, obs_shape: tuple, action_spec: ActionSpec, encoder: str = "nature_cnn", obs_scale: float = 1 / 255,
                 init_log_std: float = 0.0, channels_last: bool = False):
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"PixelActorCritic needs [C, H, W] observations, got shape {obs_shape}")
        # A buffer, so a checkpoint carries the scale its model was trained with.
        self.register_buffer("obs_scale", torch.tensor([float(obs_scale)]))  # [1]: 0-d breaks byte views
        self.channels_last = channels_last
        self.encoder = ENCODERS[encoder](tuple(obs_shape))
        self._build_heads(action_spec, self.encoder.out_dim, self.encoder.out_dim, init_log_std)
        if channels_last:
            self.to(memory_format=torch.channels_last)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() * self.obs_scale
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.encoder(x)


class DictActorCritic(ActorCriticHeads):
    """Dict observations, packed by the env into one float32 vector ``[B, D]`` (see ``fastrl.envs.spaces.pack_observation``):
    each image entry through its own conv encoder (chosen by its size, as ``encoder: auto`` chooses; scaled by its
    ``scale``, 1/255 for uint8), the vector entries (Discrete ones one-hot encoded) together through an MLP trunk, the
    features concatenated and shared by
    the policy and value heads; an action-mask entry (``ObservationPart.mask``, packed last) only masks the policy.
    Same API as ``ActorCritic``."""

    def __init__(self, layout: tuple, action_spec: ActionSpec, hidden_sizes=(64, 64), activation: str = "tanh",
                 init_log_std: float = 0.0):
        super().__init__()
        self.layout = layout
        self.sizes = [math.prod(part.shape) for part in layout]
        self.mask_width = self.sizes[-1] if layout[-1].mask else 0
        self.images = nn.ModuleDict({part.key: ENCODERS[resolve_encoder("auto", part.shape)](part.shape)
                                     for part in layout if part.image})
        self.one_hots = nn.ModuleDict({part.key: OneHot(*part.one_hot) for part in layout if part.one_hot})
        vector_dim = sum(self.one_hots[part.key].width if part.one_hot else size
                         for size, part in zip(self.sizes, layout) if not (part.image or part.mask))
        self.vector_trunk = mlp(vector_dim, list(hidden_sizes), activation) if vector_dim else None
        width = sum(encoder.out_dim for encoder in self.images.values()) + (hidden_sizes[-1] if vector_dim else 0)
        self._build_heads(action_spec, width, width, init_log_std)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        pieces, vectors = [], []
        for part, chunk in zip(self.layout, torch.split(obs.float(), self.sizes, dim=1)):
            if part.mask:
                continue
            if part.image:
                pieces.append(self.images[part.key](chunk.view(-1, *part.shape) * part.scale))
            else:
                vectors.append(self.one_hots[part.key](chunk) if part.one_hot else chunk)
        if vectors:
            pieces.append(self.vector_trunk(torch.cat(vectors, dim=1)))
        return torch.cat(pieces, dim=1)


# ---------------------------------------------------------------------------------------------- recurrent cores
CORES = {"lstm": nn.LSTMCell, "gru": nn.GRUCell}


class RecurrentActorCritic(nn.Module):
    """``base`` (an ``ActorCritic`` with a shared trunk, or a ``PixelActorCritic`` / ``DictActorCritic``) gives the
    encoder (its ``_features``), the action distribution and its heads, rebuilt over the core's ``size`` outputs."""

    def __init__(self, base: nn.Module, kind: str, size: int):
        super().__init__()
        if getattr(base, "mask_width", 0):
            raise UserError("recurrent policies do not take action masks yet: drop --recurrent, or the env's "
                            "action_mask / action_masks()")
        self.base, self.kind, self.hidden_size = base, kind, size
        self.core = CORES[kind](base.policy_head.in_features, size)
        for name, param in self.core.named_parameters():  # CleanRL's LSTM init: orthogonal weights, zero biases
            nn.init.orthogonal_(param) if name.startswith("weight") else nn.init.zeros_(param)
        base.policy_head = orthogonal_init(nn.Linear(size, base.policy_head.out_features), gain=0.01)
        base.value_head = orthogonal_init(nn.Linear(size, 1), gain=1.0)
        self.state_size = 2 * size if kind == "lstm" else size
        self.action_spec, self.discrete = base.action_spec, base.discrete

    def initial_state(self, rows: int, device=None) -> torch.Tensor:
        """The zero state ``[rows, S]``."""
        return torch.zeros(rows, self.state_size, device=device)

    def unroll(self, obs: torch.Tensor, state: torch.Tensor | None, episode_start: torch.Tensor | None):
        """The core's outputs ``[T * B, H]`` over time-major ``obs [T * B, ...]`` from ``state [B, S]`` (None: zeros,
        B = the rows of ``obs``), zeroing a row's state where ``episode_start [T * B]``; and the last state."""
        features = self.base._actor_critic(obs)[0]  # a shared trunk's: the actor's features are the critic's
        state = self.initial_state(obs.shape[0], obs.device) if state is None else state
        b, h, core = state.shape[0], self.hidden_size, self.core
        lstm = self.kind == "lstm"
        # The input projection of every step at once (for the LSTM with both biases); only the recurrence is stepped.
        bias = core.bias_ih + core.bias_hh if lstm else core.bias_ih
        inputs = F.linear(features, core.weight_ih, bias).view(-1, b, core.weight_ih.shape[0])
        keep = None if episode_start is None else (~episode_start.bool()).view(-1, b, 1).to(inputs.dtype)
        if lstm:
            dtype = inputs.dtype
            out, (hidden, cell) = lstm_sequence(inputs, state[:, :h].to(dtype), state[:, h:].to(dtype),
                                                core.weight_hh.to(dtype), keep)
            return out.reshape(-1, h), torch.cat([hidden, cell], dim=-1).float()
        hidden, weight_hh, outputs = state, core.weight_hh.t(), []
        for t, x_t in enumerate(inputs.unbind(0)):  # nn.GRUCell's equations
            if keep is not None:
                hidden = hidden * keep[t]
            x_r, x_z, x_n = x_t.chunk(3, dim=-1)
            h_r, h_z, h_n = torch.addmm(core.bias_hh, hidden, weight_hh).chunk(3, dim=-1)
            reset, update = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
            hidden = (1 - update) * torch.tanh(x_n + reset * h_n) + update * hidden
            outputs.append(hidden)
        return torch.cat(outputs), hidden.float()

    def get_action_and_value(self, obs: torch.Tensor, action=None, noise=None, state=None, episode_start=None):
        """``(action, logp, entropy, value, state)``: see the module docstring; ``action`` / ``noise`` as
        ``ActorCritic.get_action_and_value``'s, ``[T * B]`` rows."""
        out, state = self.unroll(obs, state, episode_start)
        base = self.base
        value = run_mlp(base.value_head, out).squeeze(-1).float()
        action, logp, entropy = action_logp_entropy(run_mlp(base.policy_head, out), base.action_spec,
                                                    getattr(base, "log_std", None), action, noise)
        return action, logp, entropy, value, state

    def get_value(self, obs: torch.Tensor, state=None, episode_start=None) -> torch.Tensor:
        return run_mlp(self.base.value_head, self.unroll(obs, state, episode_start)[0]).squeeze(-1).float()

    @torch.no_grad()
    def act(self, obs: torch.Tensor, state=None, episode_start=None, deterministic: bool = True):
        """One step of B envs: ``(action, state)``, the mode of the policy (or a sample)."""
        if not deterministic:
            action, *_, state = self.get_action_and_value(obs, None, None, state, episode_start)
            return action, state
        out, state = self.unroll(obs, state, episode_start)
        return action_mode(run_mlp(self.base.policy_head, out), self.base.action_spec), state

    @torch.no_grad()
    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode from a zero state (no memory): ``act`` carries the state."""
        return self.act(obs)[0]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.act_deterministic(obs)


def custom_policy(cfg, obs_shape: tuple, action_spec: ActionSpec) -> nn.Module:
    """``cfg.policy`` (``module:QualName`` or ``path/to/file.py:QualName`` of an ``nn.Module`` class) built as
    ``cls(obs_shape, action_spec, cfg)``; any other object is refused before it is called."""
    import inspect

    from fastrl.names import resolve_name
    cls = resolve_name(cfg.policy, "policy")
    expected = "an nn.Module class built as cls(observation_shape, action_spec, config)"
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UserError(f"policy {cfg.policy!r} is not an nn.Module class: name {expected}")
    try:
        inspect.signature(cls).bind(tuple(obs_shape), action_spec, cfg)
    except TypeError as e:
        raise UserError(f"policy {cfg.policy!r} cannot be built ({e}): name {expected}") from None
    return cls(tuple(obs_shape), action_spec, cfg)


def make_agent(cfg, obs_shape: tuple, action_spec: ActionSpec, obs_scale: float | None = None,
               observation_space=None) -> nn.Module:
    """The actor-critic ``cfg.policy`` names (a custom class), else the one ``cfg.encoder`` asks for (a Dict env's:
    ``DictActorCritic``; Discrete observations: one-hot encoded), under ``cfg.recurrent`` a ``RecurrentActorCritic``
    over it. ``obs_scale`` None: 1/255 for image observations.
    ``observation_space``: one env's Gymnasium space (None: read from ``cfg``'s env where the shape needs it).
    ``cfg.ortho_init`` off: every linear and conv layer re-initialized with PyTorch's default (``reset_parameters``:
    Kaiming-uniform weights, uniform biases), as SB3 leaves them; ``log_std`` keeps its value."""
    if cfg.policy:
        return custom_policy(cfg, obs_shape, action_spec)
    from fastrl.envs.batched import probe_spaces
    if observation_space is None and len(obs_shape) == 1:  # flat: maybe a packed Dict, Discrete or MultiDiscrete
        observation_space = probe_spaces(cfg)[0]
    form = None if observation_space is None else observation_format(observation_space, cfg.env)
    layout, one_hot = (form.layout, form.one_hot) if form is not None else (None, None)
    if layout is not None and layout[-1].mask and len(layout) == 2 and not layout[0].image:
        layout, one_hot = None, layout[0].one_hot  # one entry beside the mask: its array is the observation
    encoder = "dict" if layout is not None else resolve_encoder(cfg.encoder, tuple(obs_shape), cfg.env)
    if cfg.use_sde and encoder != "mlp":
        raise UserError(f"use_sde (gSDE) needs the MLP policy over flat observations, and this env's observations use "
                        f"the {encoder} encoder: drop use_sde")
    if layout is not None:
        agent = DictActorCritic(layout, action_spec, cfg.hidden_sizes, cfg.activation, cfg.init_log_std)
    elif encoder == "mlp":
        shared = cfg.shared_trunk or cfg.recurrent != "none"  # one trunk feeds the core
        agent = ActorCritic(obs_shape, action_spec, cfg.hidden_sizes, cfg.activation, shared, cfg.init_log_std,
                            cfg.pi_sizes, cfg.vf_sizes, cfg.use_sde, one_hot, form.mask if form is not None else 0)
    else:
        agent = PixelActorCritic(obs_shape, action_spec, encoder, 1 / 255 if obs_scale is None else obs_scale,
                                 cfg.init_log_std)
    if not cfg.ortho_init:
        for layer in agent.modules():
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                layer.reset_parameters()
    return agent if cfg.recurrent == "none" else RecurrentActorCritic(agent, cfg.recurrent, cfg.recurrent_size)

"""Typed run configuration: one flat dataclass, loaded from YAML, overridden from the CLI, validated up front.

Every field is a CLI flag (``n_envs`` -> ``--n-envs``) whose help text is the field's ``help`` metadata. How the
layers (defaults, the env's tuned config, a YAML file, a ``Config``, flags) stack is ``fastrl.run.run_config``'s: the
one builder every door goes through. ``make_config`` is its last step: exactly the values given, over the defaults.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fastrl import bounded_yaml
from fastrl.defaults import (ACTOR_LEARNER_ALGOS, ALGO_DEFAULTS, ALGOS, APPLIES_TO, SHAPE_KEYS, VARY_KEYS, YAML_IGNORED,
                             resolve_config_path)
from fastrl.errors import UserError, brief, first_line
from fastrl.hints import key_hint, policy_hint


def _f(default, help: str, choices=None, code: bool = False):
    """A config field. ``code``: its value may name code (``module:Name``), which only ``fastrl.names`` resolves."""
    metadata = {"help": help, "choices": choices, "code": code}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class Config:
    """Every knob of a run. ``Config()`` is the embedded default: PPO on CartPole-v1, tuned for wall-clock time to a
    last-100 mean of 475 on a 2-core CPU (large batch, few gradient steps, no value clipping; configs/ppo/cartpole.yaml
    holds the same values and says how they were chosen). Other algorithms start from ``ALGO_DEFAULTS[algo]`` over
    these (``make_config``). Passed to ``fastrl.train(config=...)``, a Config sets the fields that differ from
    ``Config()``, and those lie over the env's tuned config as flags do (``fastrl.run.run_config``)."""
    # --- run ---
    algo: str = _f("ppo", "algorithm", ALGOS)
    env: str = _f("CartPole-v1", "environment id: an EnvPool id, any Gymnasium id through the fallback, or module:Id "
                                 "(imports module first, so its Gymnasium registration runs), module:Class or "
                                 "path/to/file.py:Class of a gymnasium.Env subclass or zero-argument factory",
                  code=True)
    n_envs: int = _f(32, "parallel environments of one agent, all its collectors together: split evenly across "
                        "torchrun ranks (unless per_rank) and across impala/appo actors; each population member has "
                        "its own n_envs")
    total_steps: int = _f(250_000, "environment steps to train each agent for (all ranks together; a population: per "
                                   "member)")
    seed: int = _f(1, "run seed; env, torch and sampling seeds derive from it")
    n_seeds: int = _f(1, "train this many agents in one process (a population), seeds seed, seed+1, ...; with vary, "
                         "this many seeds per combination (ppo and a2c)")
    vary: dict = _f({}, "population members with different values: KEY=v1,v2 (repeatable, a key given twice merges its "
                        "values; the grid of all combinations, times n_seeds; one value applies to every member) for "
                        "the keys that keep every shape: lr, lr_floor, anneal_lr, clip_coef, anneal_clip, ent_coef, "
                        "vf_coef, max_grad_norm, gamma, gae_lambda, target_kl, init_log_std, ortho_init. Member m has seed seed+m")
    device: str = _f("auto", "learner device: auto, cpu, cuda, cuda:N")
    run_dir: str = _f("", "run directory (default runs/<env>__<algo>__<seed>__<time>); one that already holds a run is "
                          "refused unless resume or overwrite is given. Never read from a YAML file")
    overwrite: bool = _f(False, "start afresh in a run_dir that already holds a run, deleting its logs and checkpoints")
    per_rank: bool = _f(False, "torchrun: n_envs is per rank (the global batch grows with the ranks) instead of split "
                               "across ranks")
    torch_threads: int = _f(0, "torch intra-op threads on CPU (0 = auto: 1, as the env workers share the cores)")
    deterministic: bool = _f(False, "use deterministic torch algorithms (slower)")
    # --- environment ---
    env_backend: str = _f("auto", "env backend: auto (EnvPool when it has the id), envpool, gymnasium, torch ("
                                  "torch-native classic control: CartPole, Acrobot, MountainCar(Continuous), Pendulum; "
                                  "stepped inside the compiled rollout)",
                          ("auto", "envpool", "gymnasium", "torch"))
    env_threads: int = _f(0, "EnvPool worker threads (0 = EnvPool's default)")
    env_timeout_s: float = _f(60.0, "a Gymnasium env's step() or reset() that takes longer (in this process or a "
                                    "worker) ends the run as an env error: last iteration checkpointed, workers stopped")
    env_mode: str = _f("sync", "env stepping (ppo/a2c, and impala/appo actors): sync (all envs step, then the policy acts on all); async (EnvPool "
                               "send/recv, two env groups: one steps while the policy acts on the other; EnvPool ids, "
                               "even n_envs); auto (async for image observations, where it measured faster, unless the "
                               "policy is recurrent; see fastrl/envs/async_env.py)",
                       ("sync", "async", "auto"))
    normalize_obs: bool = _f(False, "running mean/std observation normalization")
    normalize_reward: bool = _f(False, "scale rewards by the running std of the discounted return")
    obs_clip: float = _f(10.0, "clip normalized observations to [-obs_clip, obs_clip]")
    reward_clip: float = _f(10.0, "clip scaled rewards to [-reward_clip, reward_clip]")
    time_feature: bool = _f(False, "append the share of the episode's time limit still ahead, 1 - t / "
                                   "max_episode_steps, to each observation (the RL Zoo's TimeFeatureWrapper; float "
                                   "1-D observations, an env with a time limit, env_mode sync)")
    frame_skip: int = _f(4, "Atari: emulator frames per agent step (max-pooled over the last two)")
    frame_stack: int = _f(4, "Atari: stacked 84x84 grayscale frames per observation")
    noop_max: int = _f(30, "Atari: at most this many no-op actions at the start of each game")
    episodic_life: bool = _f(True, "Atari: a life loss ends the training episode (statistics still follow the whole game)")
    clip_atari_reward: bool = _f(True, "Atari: train on sign(reward) (statistics still report the real score)")
    # --- model ---
    hidden_sizes: list = _f([64, 64], "hidden layer widths of the MLP trunk(s)")
    pi_sizes: list = _f([], "hidden widths of the policy's MLP trunk, when they differ from the value's (empty: "
                            "hidden_sizes); separate trunks only")
    vf_sizes: list = _f([], "hidden widths of the value's MLP trunk (empty: hidden_sizes); separate trunks only")
    policy: str = _f("", "module:ClassName of your own nn.Module actor-critic, built as cls(observation_shape, "
                         "action_spec, config) with get_value, get_action_and_value and act_deterministic (see "
                         "fastrl.learn.models.ActorCritic), or path/to/file.py:ClassName; empty: the built-in one",
                        code=True)
    activation: str = _f("tanh", "hidden activation", ("tanh", "relu", "elu", "silu"))
    shared_trunk: bool = _f(False, "policy and value share one trunk (else separate trunks)")
    init_log_std: float = _f(0.0, "initial log-std of the Gaussian policy (continuous actions)")
    use_sde: bool = _f(False, "generalized state-dependent exploration (gSDE, SB3's use_sde; ppo and a2c, continuous "
                              "actions, MLP policy): the exploration noise is a linear function of the policy's last "
                              "hidden layer, with weights drawn per env and held for sde_sample_freq steps; log_std "
                              "becomes [last hidden width, action dims], initialized to init_log_std")
    sde_sample_freq: int = _f(-1, "gSDE: draw new exploration weights every this many rollout steps (-1: only at the "
                                  "start of each rollout)")
    ortho_init: bool = _f(True, "orthogonal initial weights (gain sqrt 2, policy head 0.01, value head 1: CleanRL's and "
                                "SB3's default); false: PyTorch's default init, as SB3's ortho_init=False")
    recurrent: str = _f("none", "recurrent policy (ppo, a2c, impala, appo): encoder -> one LSTM or GRU layer -> heads, "
                        "trained on whole n_steps sequences of env columns", ("none", "lstm", "gru"))
    recurrent_size: int = _f(128, "hidden width of the recurrent layer (CleanRL's LSTM PPO's)")
    encoder: str = _f("auto", "observation encoder: auto (MLP for vectors; for images impala_resnet for Procgen, "
                                 "minigrid_cnn from 7x7 to under 16x16, nature_cnn from 36x36, small_cnn otherwise; "
                                 "channels-last images are transposed)",
                      ("auto", "mlp", "nature_cnn", "impala_resnet", "minigrid_cnn", "small_cnn"))
    amp: str = _f("off", "mixed precision for model forwards: off, bf16 (CPU and CUDA), fp16 (CUDA, with a GradScaler)",
                  ("off", "bf16", "fp16"))
    compile: str = _f("auto", "torch.compile the rollout step and the gradient step: auto (CUDA graphs on CUDA; on CPU each "
                      "when the run is long enough to repay its compile), off, default, max-autotune, reduce-overhead "
                      "(CUDA graphs on CUDA)",
                      ("auto", "off", "default", "max-autotune", "reduce-overhead"))
    # --- optimisation (shared by the algorithms) ---
    n_steps: int = _f(32, "rollout length T per env per iteration")
    lr: float = _f(2.5e-3, "learning rate")
    anneal_lr: bool = _f(True, "anneal the learning rate linearly to lr_floor")
    lr_floor: float = _f(1e-5, "final learning rate of the linear schedule")
    adam_eps: float = _f(1e-5, "Adam epsilon")
    optimizer: str = _f("auto", "optimizer: auto (Adam for PPO, RMSprop for A2C), adam, rmsprop", ("auto", "adam", "rmsprop"))
    rmsprop_alpha: float = _f(0.99, "RMSprop smoothing constant")
    rmsprop_eps: float = _f(1e-5, "RMSprop epsilon")
    gamma: float = _f(0.98, "discount factor")
    gae_lambda: float = _f(0.8, "GAE lambda")
    ent_coef: float = _f(0.0, "entropy bonus coefficient")
    vf_coef: float = _f(0.5, "value loss coefficient")
    max_grad_norm: float = _f(0.5, "global gradient-norm clip (0 disables)")
    # --- PPO ---
    n_epochs: int = _f(4, "PPO epochs per rollout")
    n_minibatches: int = _f(2, "PPO minibatches per epoch")
    clip_coef: float = _f(0.2, "PPO surrogate clip range")
    anneal_clip: bool = _f(False, "anneal clip_coef linearly to 0 over the run, per iteration, as the learning rate "
                                  "anneals (SB3's lin_0.2 clip_range); ppo only")
    clip_vloss: bool = _f(False, "clip the value loss around the old value")
    norm_adv: bool = _f(True, "normalize advantages per minibatch")
    target_kl: float = _f(0.0, "stop the epoch loop when approx_kl exceeds this (0 disables)")
    # --- IMPALA / APPO (asynchronous actor-learner; n_envs is all actors' together, n_steps per rollout) ---
    n_actors: int = _f(2, "impala/appo: actor processes, each with n_envs / n_actors environments")
    n_slots: int = _f(8, "impala/appo: shared-memory rollout slots [n_steps, n_envs / n_actors] in the ring (split "
                         "evenly among actors)")
    learner_batch: int = _f(1, "impala/appo: rollouts (slots) the learner stacks into one update batch")
    sync_interval: int = _f(0, "impala/appo: learner updates between weight publications to actors (0 = auto: about every 10k env steps, at most max_policy_lag/2)")
    max_policy_lag: int = _f(50, "impala/appo: drop rollouts whose policy is more than this many updates old (0 keeps all)")
    rho_bar: float = _f(1.0, "impala/appo: V-trace clip of the importance weight rho")
    c_bar: float = _f(1.0, "impala/appo: V-trace clip of the trace coefficient c")
    vtrace_lambda: float = _f(1.0, "impala/appo: V-trace lambda (1 = the IMPALA paper)")
    actor_timeout_s: float = _f(60.0, "impala/appo: an actor silent (no heartbeat) this long is killed and restarted")
    actors: str = _f("local", "impala/appo: where the actors run: local (processes on this machine, shared memory) or "
                              "ray (Ray actors on the nodes of a Ray cluster; pip install \"fastrl[ray]\")",
                     ("local", "ray"))
    ray_address: str = _f("auto", "impala/appo with actors ray: the Ray cluster to join, HOST:PORT of its head, or auto "
                                  "(a running cluster, else a local one on 127.0.0.1)")
    actor_resources: str = _f("CPU=1", "impala/appo with actors ray: Ray resources each actor reserves, KEY=V[,KEY=V] "
                                       "(e.g. actor_node=1 to place actors on nodes started with that resource; CPU=1 "
                                       "unless given)")
    # --- logging, checkpoints, evaluation ---
    log_interval: int = _f(1, "iterations between metric logs")
    progress: bool = _f(True, "show a progress bar (when stderr is not a terminal, or with progress false: one plain "
                              "line per log interval, at most every 2 s)")
    quiet: bool = _f(False, "print nothing on stderr but warnings and errors: no progress, no notes (the final JSON "
                            "line stays on stdout)")
    tensorboard: bool = _f(True, "write TensorBoard events")
    wandb: str = _f("offline", "wandb mode: offline (no network), online, disabled", ("offline", "online", "disabled"))
    wandb_project: str = _f("fastrl", "wandb project name")
    checkpoint_interval: int = _f(0, "iterations between periodic checkpoints (0 = only the final one)")
    keep_checkpoints: int = _f(3, "how many checkpoints to keep")
    eval_episodes: int = _f(10, "episodes per seed for the end-of-run evaluation (0 disables)")
    eval_seeds: int = _f(5, "seeds for each evaluation (each seed runs eval_episodes episodes)")
    eval_interval: int = _f(0, "iterations between periodic evaluations (0 = only at the end)")
    eval_deterministic: bool = _f(True, "evaluate the policy's mode (argmax / mean); false samples actions, as Atari "
                                        "results are usually reported (an argmax policy can stall a game)")
    eval_max_episode_steps: int = _f(27_000, "an evaluation episode still running after this many steps ends there and "
                                             "counts its return so far (27,000: Atari's 108k frames)")
    eval_max_steps: int = _f(1_000_000, "an evaluation stops after this many env steps, all its envs together "
                                        "(unfinished episodes count their return so far)")
    stop_at_return: float = _f(0.0, "stop once the return reaches this: the periodic evaluation's when eval_interval "
                                    "> 0, else the last-100-episode mean (a population: every member; 0 disables)")
    capture_video: bool = _f(False, "record the final evaluation's first episodes to run_dir/videos/*.mp4 (a "
                                    "Gymnasium env of the same id renders them; needs pip install -e \".[video]\")")
    video_member: int = _f(0, "a population (n_seeds/vary): the member whose final evaluation capture_video records")
    plot: bool = _f(True, "write run_dir/learning_curve.png at the end of the run (needs matplotlib)")
    # --- guards ---
    rollback: bool = _f(False, "roll back to the best weights when the return collapses (judged on the periodic "
                               "evaluation when eval_interval > 0, else on the lagging last-100-episode mean)")
    rollback_drop: float = _f(0.1, "collapse = recent mean return this fraction of |best| below the best")
    rollback_lr_factor: float = _f(0.5, "multiply the learning rate by this at each rollback")
    max_rollbacks: int = _f(3, "at most this many rollbacks per run")
    rollback_patience: int = _f(3, "log steps in a row below the collapse line before rolling back")
    max_nonfinite_iterations: int = _f(3, "iterations in a row with skipped NaN/Inf updates before rolling back")
    resume: str = _f("", "resume from a run directory or checkpoint file (never read from a YAML file)")

    # Where the values under the flags came from (a --config file, an env's tuned config, a general default), for the
    # run's first line; set by fastrl.run.run_config.build_config. A plain attribute, not a field: no flag, not in to_dict.
    origin = ""

    # Derived sizes are computed once, here.
    @property
    def batch_size(self) -> int:
        return self.n_envs * self.n_steps

    @property
    def n_envs_per_actor(self) -> int:
        """impala/appo: the envs of each actor (``n_envs`` counts all actors' together)."""
        return self.n_envs // self.n_actors

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.n_minibatches

    def validate(self) -> "Config":
        """Raise UserError naming the first bad value and how to fix it."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"{f.name} must be a finite number, got {brief(value)}")
            choices = f.metadata.get("choices")
            if choices and value not in choices:
                raise UserError(f"{f.name}={brief(value)} is not one of {', '.join(choices)}")
        self._require(("n_envs", "total_steps", "n_steps", "n_epochs", "n_minibatches", "lr", "log_interval",
                       "keep_checkpoints", "eval_seeds", "clip_coef", "env_timeout_s", "rollback_patience",
                       "max_nonfinite_iterations", "eval_max_episode_steps", "eval_max_steps", "frame_skip",
                       "frame_stack", "n_seeds"), "> 0")
        self._require(("ent_coef", "vf_coef", "max_grad_norm", "target_kl", "lr_floor", "adam_eps", "torch_threads",
                       "env_threads", "checkpoint_interval", "eval_episodes", "obs_clip", "reward_clip",
                       "eval_interval", "rollback_drop", "max_rollbacks", "noop_max"), ">= 0")
        self._require(("gamma", "gae_lambda"), "in [0, 1]")
        if self.batch_size % self.n_minibatches:
            raise UserError(f"n_envs*n_steps={self.batch_size} is not divisible by n_minibatches={self.n_minibatches}; "
                            "pick n_minibatches that divides it")
        if not self.hidden_sizes or any((not isinstance(h, int)) or h <= 0 for h in self.hidden_sizes):
            raise UserError(f"hidden_sizes must be a non-empty list of positive ints, got {brief(self.hidden_sizes)}")
        for name in ("pi_sizes", "vf_sizes"):
            if any((not isinstance(h, int)) or h <= 0 for h in getattr(self, name)):
                raise UserError(f"{name} must be a list of positive ints, got {brief(getattr(self, name))}")
        if self.shared_trunk and (self.pi_sizes or self.vf_sizes):
            raise UserError("pi_sizes/vf_sizes give the policy and value separate trunks, and shared_trunk shares one: "
                            "drop one of them (shared_trunk uses hidden_sizes)")
        if self.policy and policy_hint(self.policy):
            raise UserError(f"policy={brief(self.policy)}: {policy_hint(self.policy)}")
        if self.policy and not re.fullmatch(r"([\w.]+|[^:]+\.py):[\w.]+", self.policy):
            raise UserError(f"policy={brief(self.policy)} is not module:ClassName or path/to/file.py:ClassName; name a "
                            "module-level nn.Module class")
        if not 0 <= self.seed < 2**32:
            raise UserError(f"seed must be in [0, 2**32), got {self.seed}")
        if not (self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device)):
            raise UserError(f"device={brief(self.device)} is not one of auto, cpu, cuda, cuda:N")
        if self.algo == "a2c" and (self.n_epochs != 1 or self.n_minibatches != 1):
            raise UserError(f"a2c makes one update per rollout; set n_epochs=1 and n_minibatches=1 "
                            f"(got {self.n_epochs} and {self.n_minibatches})")
        if not 0.0 < self.rollback_lr_factor <= 1.0:
            raise UserError(f"rollback_lr_factor must be in (0, 1], got {self.rollback_lr_factor}")
        if self.env_mode == "async" and (self.normalize_obs or self.normalize_reward):
            raise UserError("env_mode=async does not support normalize_obs/normalize_reward yet (their statistics would "
                            "depend on the order env groups arrive in): use --env-mode sync, or drop the normalization")
        if self.time_feature and (self.env_mode == "async" or self.env_backend == "torch"):
            name = "env_mode=async" if self.env_mode == "async" else "env_backend torch"
            raise UserError(f"time_feature does not apply with {name} (its envs keep no step count for it): use "
                            f"{'--env-mode sync' if self.env_mode == 'async' else '--env-backend auto'}, or drop "
                            "time_feature")
        if self.sde_sample_freq == 0 or self.sde_sample_freq < -1:
            raise UserError(f"sde_sample_freq must be -1 (once per rollout) or >= 1, got {self.sde_sample_freq}")
        if self.use_sde and (self.algo not in ("ppo", "a2c") or self.env_mode == "async"):
            where = f"algo {self.algo}" if self.algo not in ("ppo", "a2c") else "env_mode=async"
            raise UserError(f"use_sde (gSDE) runs with ppo or a2c and env_mode sync, not with {where}: drop use_sde, or "
                            f"use {'--algo ppo' if self.algo not in ('ppo', 'a2c') else '--env-mode sync'}")
        if self.env_mode == "async" and self.env_backend == "torch":
            raise UserError("env_mode=async needs EnvPool, and env_backend torch steps its envs as tensors: use "
                            "--env-mode sync, or --env-backend auto")
        if self.lr_floor > self.lr:
            raise UserError(f"lr_floor={self.lr_floor} is above lr={self.lr}; lower lr_floor")
        if self.algo in ACTOR_LEARNER_ALGOS:
            self._validate_actor_learner()
        if (self.population_size > 1 or self.vary) and self.algo in ACTOR_LEARNER_ALGOS:
            raise UserError(f"--n-seeds/--vary (a population) do not support algo {self.algo} (its actors and learner "
                            "are processes of one agent): use --algo ppo or a2c, or run one job per seed")
        if not 0 <= self.video_member < self.population_size:
            raise UserError(f"video_member={self.video_member} is not a member of this run: pick one of "
                            f"0..{self.population_size - 1}")
        if self.recurrent != "none" and (self.use_sde or self.policy):
            raise UserError(f"recurrent={self.recurrent} builds fastrl's own policy without gSDE: drop use_sde and "
                            "policy, or use --recurrent none")
        if self.recurrent != "none" and self.recurrent_size <= 0:
            raise UserError(f"recurrent_size must be > 0, got {self.recurrent_size}")
        if self.policy and self.use_sde:
            raise UserError("use_sde (gSDE) is built into fastrl's MLP policy, not into a custom policy class: drop "
                            "use_sde, or give your class its own exploration")
        return self

    _BOUNDS = {"> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0, "in [0, 1]": lambda v: 0.0 <= v <= 1.0}

    def _require(self, names: tuple, bound: str) -> None:
        """Raise UserError for the first of ``names`` whose value is not ``bound`` (a key of ``_BOUNDS``)."""
        for name in names:
            if not self._BOUNDS[bound](getattr(self, name)):
                raise UserError(f"{name} must be {bound}, got {brief(getattr(self, name))}")

    @property
    def population_size(self) -> int:
        """Members of the run: n_seeds times every combination of vary (1 = a single run)."""
        return self.n_seeds * math.prod(len(values) for values in self.vary.values())

    def _validate_actor_learner(self) -> None:
        self._require(("n_actors", "n_slots", "learner_batch", "rho_bar", "c_bar", "actor_timeout_s"), "> 0")
        self._require(("sync_interval", "max_policy_lag"), ">= 0")
        self._require(("vtrace_lambda",), "in [0, 1]")
        if self.n_envs % self.n_actors:
            raise UserError(f"n_envs={self.n_envs} (the envs of all actors together) does not split evenly among "
                            f"n_actors={self.n_actors}: make n_envs a multiple of n_actors")
        if self.n_slots % self.n_actors:
            raise UserError(f"n_slots={self.n_slots} is not divisible by n_actors={self.n_actors}; "
                            "each actor owns n_slots/n_actors slots (2 or more keeps it busy)")
        if self.learner_batch > self.n_slots:
            raise UserError(f"learner_batch={self.learner_batch} exceeds n_slots={self.n_slots}; raise n_slots")
        columns = self.n_envs_per_actor * self.learner_batch  # of a learner batch
        if (self.algo == "impala" or self.recurrent != "none") and columns % self.n_minibatches:
            raise UserError(f"{self.algo} splits a batch's n_envs/n_actors*learner_batch={columns} env columns (whole "
                            f"sequences) into n_minibatches={self.n_minibatches}; pick n_minibatches that divides it")
        if self.algo == "appo" and (columns * self.n_steps) % self.n_minibatches:
            raise UserError(f"appo splits a batch's n_envs/n_actors*learner_batch*n_steps={columns * self.n_steps} "
                            f"samples into n_minibatches={self.n_minibatches}; pick n_minibatches that divides it")
        if self.max_policy_lag and self.sync_interval >= self.max_policy_lag:
            raise UserError(f"sync_interval={self.sync_interval} is not below max_policy_lag={self.max_policy_lag}: "
                            "actors would act with weights too old to train on; lower sync_interval or raise max_policy_lag")
        parse_resources(self.actor_resources)
        if self.actors == "local" and (self.ray_address != "auto" or self.actor_resources != "CPU=1"):
            name = "ray_address" if self.ray_address != "auto" else "actor_resources"
            raise UserError(f"{name}={getattr(self, name)} applies to Ray actors only: add --actors ray, or drop it")
        if self.normalize_obs or self.normalize_reward:
            raise UserError(f"{self.algo} does not support normalize_obs/normalize_reward yet (each actor would keep "
                            "its own statistics); set both to false")
        if self.compile not in ("auto", "off"):
            raise UserError(f"compile={self.compile} does not apply to {self.algo} (its learner and actors run eagerly; "
                            "auto means off there): use --compile off or auto")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
CODE_KEYS = tuple(name for name, f in FIELDS.items() if f.metadata["code"])


def parse_resources(text: str) -> dict:
    """``actor_resources`` (``KEY=V[,KEY=V]``, V a number >= 0) as ``{key: float}``, or raise UserError."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        amount = numeric(value.strip()) if key.strip() else None
        if not isinstance(amount, (int, float)) or not 0 <= amount < math.inf:
            raise UserError("actor_resources: expected KEY=V with a number V >= 0 (e.g. actor_node=1), got "
                            f"{brief(item)}")
        out[key.strip()] = float(amount)
    return out


_TYPES = typing.get_type_hints(Config)


def numeric(text: str):
    """``text`` as a number when it spells one (``"3e-4"`` -> 0.0003, ``"1.5e6"`` -> 1500000), else itself: flags are
    text, and YAML 1.1 reads ``1e-4`` and ``1.5e6`` (no dot) as strings."""
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else number


_BOOLS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _coerce(name: str, value):
    """Convert a YAML or CLI value to the field's type, or raise UserError."""
    kind, given = _TYPES[name], value
    if kind is dict:
        return _coerce_vary(value)
    if isinstance(value, str) and kind is list:
        try:
            value = [int(v) for v in value.replace(",", " ").replace("[", " ").replace("]", " ").split()]
        except ValueError:
            pass
    elif isinstance(value, str) and kind is not str:
        value = _BOOLS.get(value.lower(), value) if kind is bool else numeric(value)
    elif isinstance(value, os.PathLike) and kind is str:  # run_dir, resume: a pathlib.Path is as good as its string
        value = os.fspath(value)
    elif isinstance(value, type) and name == "policy":  # the class itself, as fastrl.train and fastrl.load take it
        value = policy_name(value)
    if isinstance(value, float) and kind is int and value.is_integer():
        value = int(value)
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = float(value) if abs(value) <= sys.float_info.max else value  # numpy's too; a huge int is refused
    if kind is list and isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    if kind is not list and isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise UserError(f"{name}: expected {kind.__name__}, got {brief(given)}")


def policy_name(cls: type) -> str:
    """``module:QualName`` of a policy class, which every process (actors, ``fastrl.load``) imports back."""
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        raise UserError(f"policy {cls.__qualname__} must be a module-level class in an importable module (not "
                        "__main__ or a function), so checkpoints and other processes can rebuild it")
    return f"{cls.__module__}:{cls.__qualname__}"


def _coerce_vary(value) -> dict:
    """``vary`` from a mapping ``{key: [v1, v2]}``, a string ``"key=v1,v2"`` or a list of such strings (the repeated
    flag, whose repeats merge; ``;`` also separates keys) to ``{key: [value, ...]}`` (repeats dropped), or raise
    UserError."""
    if isinstance(value, str):
        value = [part for part in value.split(";") if part.strip()]
    if isinstance(value, list):
        pairs = {}
        for item in value:
            if not isinstance(item, str) or "=" not in item:
                raise UserError(f"vary: expected KEY=v1,v2,..., got {brief(item)}")
            key, _, values = item.partition("=")  # a key given twice merges its values
            given = [v for v in values.replace(" ", ",").split(",") if v]
            pairs.setdefault(key.strip().replace("-", "_"), []).extend(given)
        value = pairs
    if not isinstance(value, dict):
        raise UserError(f"vary: expected KEY=v1,v2,... or a mapping of key: [values], got {brief(value)}")
    out = {}
    for key, values in value.items():
        key = str(key).replace("-", "_")
        if key not in FIELDS:
            raise UserError(f"vary: unknown config key {brief(key)}; the keys that can vary are {', '.join(VARY_KEYS)}")
        if key not in VARY_KEYS:
            shape = key in SHAPE_KEYS or key in ("seed", "n_seeds", "total_steps")
            why = "it changes shapes or the run itself" if shape else "the members of one population share it"
            raise UserError(f"vary: {key} cannot vary within one population ({why}): run one population per {key} "
                            f"value (fastrl tune groups its trials so), or vary one of {', '.join(VARY_KEYS)}")
        values = values if isinstance(values, list) else [values]
        if not values:
            raise UserError(f"vary: {key} needs at least one value (KEY=v1,v2)")
        coerced = [_coerce(key, v) for v in values]
        out[key] = [v for i, v in enumerate(coerced) if v not in coerced[:i]]  # a repeated value is one variant
    return out


def _unknown_key(name: str, where: str) -> UserError:
    """A config key (YAML, Python keyword) that does not exist: the one meant (``fastrl.hints``: other libraries'
    spellings first, then typos of ours)."""
    return UserError(f"unknown config key {brief(name)} in {where}; {key_hint(name, FIELDS)}")


def config_keys(values: dict, where: str) -> dict:
    """``values`` keyed by config keys (``n-envs`` -> ``n_envs``), or a UserError for the first key that is none."""
    out = {str(key).replace("-", "_"): value for key, value in values.items()}
    unknown = next((key for key in out if key not in FIELDS), None)
    if unknown is not None:
        raise _unknown_key(unknown, where)
    return out


def read_yaml(path: str | Path, what: str):
    """The YAML document in ``path``, read within ``bounded_yaml``'s bounds, or a one-line UserError that calls the
    file ``what`` (``"config file"``, ``"space file"``)."""
    try:
        return bounded_yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise UserError(f"{what} {str(path)!r} cannot be read ({e.strerror or e}): pass a YAML file") from None
    except UnicodeDecodeError:
        raise UserError(f"{what} {str(path)!r} is not text (not UTF-8): pass a YAML file") from None
    except yaml.YAMLError as e:
        raise UserError(f"{what} {str(path)!r} is not valid YAML: {first_line(e)}") from None


def load_yaml(path: str | Path) -> dict:
    """The mapping of a config file, or of a tuned config named ``path`` (``ppo/lunarlander``)."""
    path = resolve_config_path(path)
    data = read_yaml(path, "config file") or {}
    if not isinstance(data, dict):
        raise UserError(f"config file {str(path)!r} must hold a mapping of key: value")
    return data


def make_config(overrides: dict | None = None, yaml_path: str | None = None, where: str = "overrides") -> Config:
    """Defaults < ``ALGO_DEFAULTS[algo]`` < YAML < overrides, coerced and validated: exactly what is given, with no
    env's tuned config under it (a run's config comes from ``fastrl.run.run_config.build_config``, which ends here)."""
    values = {}
    if yaml_path:
        values = {k: v for k, v in config_keys(load_yaml(yaml_path), yaml_path).items() if k not in YAML_IGNORED}
    values.update(config_keys(overrides or {}, where))
    values = {key: _coerce(key, value) for key, value in values.items()}
    algo = values.get("algo", Config.algo)
    if algo in ALGOS:
        check_applicable(algo, values)
    values = {**ALGO_DEFAULTS.get(algo, {}), **values}
    return Config(**values).validate()


def algo_default(algo: str, name: str):
    """The value ``name`` takes for ``algo`` when nobody sets it: ALGO_DEFAULTS over the dataclass default."""
    return ALGO_DEFAULTS.get(algo, {}).get(name, getattr(Config(), name))


def check_applicable(algo: str, given: dict) -> None:
    """Raise UserError for a given key that ``algo`` does not read, set to anything but ``algo``'s default.

    ``given`` holds the keys set in a YAML file or a flag (coerced). A key at its default passes: a saved
    config.yaml holds every key.
    """
    for name, value in given.items():
        algos, why, fix = APPLIES_TO.get(name, (ALGOS, "", ""))
        if algo in algos or value == algo_default(algo, name):
            continue
        raise UserError(f"{name}={brief(value)} does not apply to {algo} ({why.format(algo=algo)}): drop it or {fix}")

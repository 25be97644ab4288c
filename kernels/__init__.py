"""Fused advantage and loss kernels over time-major tensors. Depends only on torch (and triton when present).

Imported as ``fastrl.kernels`` (the ``kernels/`` folder at the top of the repository, installed under fastrl so the
name never collides with the PyPI package ``kernels``)::

    from fastrl import kernels
    adv, value_target = kernels.gae(reward, value, next_value, done, terminated, gamma, lam)
    vs, pg_advantage = kernels.vtrace(behavior_logp, target_logp, reward, value, next_value,
                                      done, terminated, gamma, rho_bar=1.0, c_bar=1.0, lam=1.0)
    loss, stats = kernels.ppo_loss(new_logp, old_logp, advantage, new_value, old_value, value_target,
                                   entropy, valid, clip_coef, vf_coef, ent_coef)
    loss, stats = kernels.pg_loss(logp, advantage, value, value_target, entropy, valid, vf_coef, ent_coef)
    hidden, (h, c) = kernels.lstm_sequence(gates_x, h0, c0, weight_hh, keep)   # an LSTM over [T, B] with restarts

Each public function dispatches by device (Triton on CUDA, a C kernel on CPU; ``lstm_sequence``: torch ops with a
one-pass backward on any device) and has a plain-loop twin
``*_reference`` that the tests compare against. ``valid`` (losses only) defaults to None: every sample
counts. Coefficients out of range (``gamma``, ``lam`` outside [0, 1]; ``rho_bar``, ``c_bar``, ``clip_coef``
<= 0; ``vf_coef``, ``ent_coef`` < 0) are one-line ValueErrors. From a CleanRL-style loop, see ``kernels.gae``.
"""
from .gae import gae, gae_reference
from .losses import pg_loss, pg_loss_reference, ppo_loss, ppo_loss_reference
from .recurrent import lstm_sequence, lstm_sequence_reference
from .vtrace import vtrace, vtrace_reference

__all__ = [
    "gae", "gae_reference", "vtrace", "vtrace_reference",
    "ppo_loss", "ppo_loss_reference", "pg_loss", "pg_loss_reference", "lstm_sequence", "lstm_sequence_reference",
]

"""The PPO / A2C loss of K MLP actor-critics and its gradient, derived by hand: the eager population step's fast path.

An eager step through autograd costs about 600 small ops for three 64x64 members (record, then replay each op
backwards); at these sizes their per-op overhead, not the math, is most of the step. ``MembersMLPGradient`` computes
the same loss and its gradient with respect to every parameter in about a third of the ops:

    forward   h_l = act(h_{l-1} W_l^T + b_l)   (one baddbmm over the member axis per layer, activations kept)
    loss      kernels.ppo_loss / pg_loss's formulas, per member, over the valid rows
    backward  g_pre = g * act'(h_l);  dW_l = g_pre^T h_{l-1};  db_l = sum_rows g_pre;  g = g_pre W_l

with the loss's gradient with respect to the policy's outputs in closed form:

    dL/dlogp_i  = mask_i / n * (-A_i r_i  where the unclipped PPO term is the larger, else 0)    (A2C: -A_i)
    dL/dH_i     = -ent_coef * mask_i / n
    dL/dV_i     = vf_coef * mask_i / n * (V_i - R_i)  (clip_vloss: the larger branch's, half each at a tie)
    categorical logits z, p = softmax(z):  dlogp/dz = onehot(a) - p,  dH/dz = -p (log p + H)
    Gaussian mean mu, log-std s:           dlogp/dmu = (a - mu) / sigma^2,  dlogp/ds = z^2 - 1,  dH/ds = 1
    gSDE, per row s = log(V) / 2, V = latent^2 @ std^2 + eps (latent constant):  dL/dstd^2 = latent^2^T (dL/ds / 2V)

where ``n`` is the member's count of valid rows and ``A`` its (normalized) advantages. The twin is autograd through
``fastrl.learn.stacked.members_actor_critic`` and ``kernels.ppo_loss`` / ``pg_loss`` (``tests/test_mlp_gradient.py``
compares loss, statistics and gradient). Shapes: every minibatch field ``[K, B, ...]``, hyperparameters ``[K]``,
the gradient ``[K, P]`` in ``FlatLayout``'s order.

Supported (``supports``): ``ActorCritic`` with tanh or ReLU trunks, separate or shared, a discrete (not
MultiDiscrete, not masked) or a diagonal Gaussian policy (gSDE included), PPO or A2C, float32 (no autocast, no loss
scaling). Anything else takes the autograd path.
"""
from __future__ import annotations

import torch
from torch import nn

from fastrl.kernels.losses import ADV_EPS
from fastrl.learn.models import GSDE_EPSILON, LOG_SQRT_2PI, ActorCritic

_ACTIVATIONS = {nn.Tanh: "tanh", nn.ReLU: "relu"}


def _trunk_layers(trunk: nn.Sequential) -> list | None:
    """``[(linear, activation name)]`` of an ``mlp`` stack, or None when it holds anything else."""
    layers, modules = [], list(trunk)
    for i in range(0, len(modules), 2):
        linear = modules[i]
        act = modules[i + 1] if i + 1 < len(modules) else None
        if type(linear) is not nn.Linear or type(act) not in _ACTIVATIONS:
            return None
        layers.append((linear, _ACTIVATIONS[type(act)]))
    return layers


class MembersMLPGradient:
    """``(grad [K, P], loss [K], stats)`` of K members' PPO or A2C loss on one minibatch (see the module docstring)."""

    @staticmethod
    def supports(agent: nn.Module, algo: str, autocast_off: bool, loss_scaling: bool) -> bool:
        if type(agent) is not ActorCritic or algo not in ("ppo", "a2c") or not autocast_off or loss_scaling:
            return False
        if agent.discrete and agent.action_spec.nvec or agent.mask_width:  # masked logits: autograd's
            return False
        trunks = [agent.actor_trunk] + ([] if agent.shared_trunk else [agent.critic_trunk])
        return all(_trunk_layers(t) is not None for t in trunks)

    def __init__(self, layout, algo: str, clip_vloss: bool, norm_adv: bool):
        agent = layout.agent
        self.layout, self.algo, self.clip_vloss, self.norm_adv = layout, algo, clip_vloss, norm_adv
        self.discrete, self.shared, self.sde = agent.discrete, agent.shared_trunk, agent.use_sde
        index = layout.index_of

        def indexed(linear: nn.Linear, act: str | None = None) -> tuple:  # (weight's index, bias's, activation)
            return index[id(linear.weight)], index[id(linear.bias)], act
        self.actor = [indexed(*layer) for layer in _trunk_layers(agent.actor_trunk)]
        self.critic = self.actor if self.shared else [indexed(*layer) for layer in _trunk_layers(agent.critic_trunk)]
        self.policy_head, self.value_head = indexed(agent.policy_head), indexed(agent.value_head)
        self.log_std = None if self.discrete else index[id(agent.log_std)]
        self._prepared_for, self._prepared = None, None

    def _weights(self, params: torch.Tensor) -> tuple:
        """``(views, transposed, rows)`` of ``params [K, P]``: each parameter's ``[K, *shape]`` view, each layer's
        weight transposed and bias as a ``[K, 1, out]`` row. Made once per weights tensor: the trainer writes its
        weights in place, so the views stay current (about 40 us of view ops a step otherwise)."""
        if self._prepared_for is not params:
            views = self.layout.views(params)
            layers = [*self.actor, *([] if self.shared else self.critic), self.policy_head, self.value_head]
            self._prepared = (views, {w: views[w].transpose(1, 2) for w, _, _ in layers},
                              {b: views[b].unsqueeze(1) for _, b, _ in layers})
            self._prepared_for = params
        return self._prepared

    # ------------------------------------------------------------------ the trunks
    @staticmethod
    def _forward(transposed, rows, layers, x):
        """Every layer's output, the input first: ``[x, h_1, ..., h_L]``."""
        outputs = [x]
        for w, b, act in layers:
            pre = torch.baddbmm(rows[b], outputs[-1], transposed[w])
            outputs.append(torch.tanh(pre) if act == "tanh" else torch.relu(pre))
        return outputs

    @staticmethod
    def _backward(views, layers, outputs, g, grads):
        """Pull ``g`` (the loss's gradient with respect to the trunk's output) back through ``layers``, adding each
        weight's and bias's gradient into ``grads`` (a shared trunk receives both heads' gradients)."""
        for depth in range(len(layers) - 1, -1, -1):
            w, b, act = layers[depth]
            h = outputs[depth + 1]
            g_pre = torch.addcmul(g, g * h, h, value=-1) if act == "tanh" else g * (h > 0)  # tanh' = 1 - h^2
            for i, value in ((w, torch.bmm(g_pre.transpose(1, 2), outputs[depth])), (b, g_pre.sum(1))):
                grads[i] = value if grads[i] is None else grads[i] + value
            if depth:
                g = torch.bmm(g_pre, views[w])

    # ------------------------------------------------------------------ the step
    def __call__(self, params: torch.Tensor, minibatch: tuple, hparams: dict):
        observation, action, old_logp, advantage, old_value, value_target, valid = minibatch
        views, transposed, rows = self._weights(params)
        k, b = observation.shape[:2]
        x = self.layout.agent.trunk_input(observation.reshape(k, b, -1))
        actor = self._forward(transposed, rows, self.actor, x)
        critic = actor if self.shared else self._forward(transposed, rows, self.critic, x)
        pw, pb, _ = self.policy_head
        vw, vb, _ = self.value_head
        out = torch.baddbmm(rows[pb], actor[-1], transposed[pw])  # [K, B, A]
        value = torch.baddbmm(rows[vb], critic[-1], transposed[vw]).squeeze(-1)  # [K, B]

        # The policy's log-probability and entropy of the minibatch's actions.
        if self.discrete:
            log_probs = torch.log_softmax(out, dim=-1)
            probs = log_probs.exp()
            logp = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(probs * log_probs).sum(-1)
        else:
            if self.sde:  # gSDE: each row's variance latent^2 @ std^2 (+ eps), the latent taken as a constant
                std_sq = views[self.log_std].exp().square()  # [K, L, A]
                latent_sq = actor[-1].square()  # [K, B, L]
                variance = torch.bmm(latent_sq, std_sq) + GSDE_EPSILON  # [K, B, A]
                row_log_std = 0.5 * torch.log(variance)
            else:
                row_log_std = views[self.log_std].unsqueeze(1)  # [K, 1, A]: every row's
            inv_std = torch.exp(-row_log_std)
            z = (action.reshape(k, b, -1) - out) * inv_std
            logp = (-0.5 * z.square() - row_log_std - LOG_SQRT_2PI).sum(-1)
            entropy = (0.5 + LOG_SQRT_2PI + row_log_std).sum(-1).expand(k, b)

        # The loss (kernels.ppo_loss / pg_loss's formulas) and its gradient with respect to logp, entropy and value.
        live = valid.bool()
        zero = torch.zeros((), device=x.device)
        count = live.sum(1, keepdim=True).float().clamp(min=1)  # [K, 1]
        weight = torch.where(live, 1.0 / count, zero)  # [K, B]: the masked mean's gradient

        def masked_mean(v):  # [..., K, B] -> [..., K]; where, not a product: a masked-out row's NaN stays out
            return torch.where(live, v, zero).sum(-1) / count.squeeze(1)
        adv = advantage
        if self.norm_adv:
            mean = masked_mean(adv).unsqueeze(1)
            var = masked_mean((adv - mean) ** 2).unsqueeze(1) * count / (count - 1).clamp(min=1)
            adv = (adv - mean) / (var.sqrt() + ADV_EPS)
        vf_coef, ent_coef = hparams["vf_coef"].unsqueeze(1), hparams["ent_coef"].unsqueeze(1)
        stats = {}
        if self.algo == "ppo":
            clip = hparams["clip_coef"].unsqueeze(1)
            logratio = logp - old_logp
            ratio = logratio.exp()
            unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)
            policy_terms = torch.maximum(unclipped, clipped)
            g_logp = torch.where(live & (unclipped >= clipped), unclipped * weight, zero)
            stat_terms = [(ratio - 1) - logratio, ((ratio - 1).abs() > clip).float()]  # approx_kl, clipfrac
        else:
            policy_terms = -adv * logp
            g_logp = torch.where(live, -adv * weight, zero)
            stat_terms = []
        error = value - value_target
        if self.clip_vloss:
            clip = hparams["clip_coef"].unsqueeze(1)
            delta = value - old_value
            clipped_error = old_value + delta.clamp(-clip, clip) - value_target
            plain, clipped_sq = error * error, clipped_error * clipped_error
            value_terms = 0.5 * torch.maximum(plain, clipped_sq)
            # torch.maximum's gradient: all to the larger, half each at a tie; the clamp passes it inside its range.
            share = torch.where(plain > clipped_sq, 1.0, torch.where(plain < clipped_sq, 0.0, 0.5))
            g_error = share * error + (1 - share) * clipped_error * (delta.abs() <= clip)
        else:
            value_terms = 0.5 * error * error
            g_error = error
        # The reported means (the loss itself only guards against non-finite steps): one masked mean of them stacked.
        means = masked_mean(torch.stack([policy_terms, value_terms, entropy, *stat_terms]))
        policy_loss, value_loss, entropy_mean = means[0], means[1], means[2]
        loss = policy_loss - hparams["ent_coef"] * entropy_mean + hparams["vf_coef"] * value_loss
        stats.update(policy_loss=policy_loss, value_loss=value_loss, entropy=entropy_mean)
        if stat_terms:
            stats.update(approx_kl=means[3], clipfrac=means[4])
        g_value = torch.where(live, vf_coef * weight * g_error, zero)  # [K, B]
        g_entropy = -ent_coef * weight  # [K, B]

        # Back through the distribution to the policy head's output (and the log-std).
        grads = [None] * len(views)
        if self.discrete:
            onehot = torch.zeros_like(out).scatter_(-1, action.long().unsqueeze(-1), 1.0)
            g_out = g_logp.unsqueeze(-1) * (onehot - probs) - g_entropy.unsqueeze(-1) * probs * (
                log_probs + entropy.unsqueeze(-1))
        else:
            g_out = g_logp.unsqueeze(-1) * z * inv_std
            g_row_log_std = g_logp.unsqueeze(-1) * (z * z - 1) + g_entropy.unsqueeze(-1)  # [K, B, A]
            if self.sde:  # row log-std = log(variance) / 2, variance = latent^2 @ exp(log_std)^2 + eps
                g_std_sq = torch.bmm(latent_sq.transpose(1, 2), g_row_log_std * 0.5 / variance)  # [K, L, A]
                grads[self.log_std] = g_std_sq * 2 * std_sq
            else:
                grads[self.log_std] = g_row_log_std.sum(1)
        # The heads, then the trunks.
        grads[pw] = torch.bmm(g_out.transpose(1, 2), actor[-1])
        grads[pb] = g_out.sum(1)
        g_value = g_value.unsqueeze(-1)  # [K, B, 1]
        grads[vw] = torch.bmm(g_value.transpose(1, 2), critic[-1])
        grads[vb] = g_value.sum(1)
        g_actor = torch.bmm(g_out, views[pw])
        g_critic = g_value * views[vw]  # [K, B, 1] x [K, 1, H]
        if self.shared:
            self._backward(views, self.actor, actor, g_actor + g_critic, grads)
        else:
            self._backward(views, self.actor, actor, g_actor, grads)
            self._backward(views, self.critic, critic, g_critic, grads)
        grad = torch.cat([g.reshape(k, -1) for g in grads], dim=1)
        return grad, loss, stats

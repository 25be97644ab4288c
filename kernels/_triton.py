"""Triton backend (CUDA; CPU tensors under ``TRITON_INTERPRET=1``). Imported only when used.

Scans: one program per block of batch columns walks t = T-1 .. 0 with the carry in registers. Every input
is read once through its own (time, column) strides, every output written once, in one launch.
"""
import torch
import triton
import triton.language as tl

BLOCK_COLS = 128


def _rows(x, T, M):
    """A [T, M] view of ``x`` (a copy only when the batch dims cannot be merged)."""
    return x.reshape(T, M)


def _flag(x):
    # bool loads as int1; uint8 and floats load as they are
    return x.view(torch.uint8) if x.dtype == torch.bool else x


@triton.jit(do_not_specialize=["T"])
def _gae_kernel(
    r_ptr, v_ptr, nv_ptr, d_ptr, te_ptr, adv_ptr, tgt_ptr,
    T, M,
    s_r_t, s_r_m, s_v_t, s_v_m, s_nv_t, s_nv_m, s_d_t, s_d_m, s_te_t, s_te_m,
    gamma, lam,
    BLOCK: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < M
    cols = cols.to(tl.int64)
    carry = tl.zeros([BLOCK], dtype=tl.float32)
    gl = gamma * lam
    for i in range(0, T):
        t = (T - 1 - i).to(tl.int64)
        r = tl.load(r_ptr + t * s_r_t + cols * s_r_m, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * s_v_t + cols * s_v_m, mask=mask, other=0.0).to(tl.float32)
        nv = tl.load(nv_ptr + t * s_nv_t + cols * s_nv_m, mask=mask, other=0.0).to(tl.float32)
        d = tl.load(d_ptr + t * s_d_t + cols * s_d_m, mask=mask, other=0).to(tl.float32)
        te = tl.load(te_ptr + t * s_te_t + cols * s_te_m, mask=mask, other=0).to(tl.float32)
        delta = r + gamma * (1.0 - te) * nv - v
        carry = delta + gl * (1.0 - d) * carry
        tl.store(adv_ptr + t * M + cols, carry, mask=mask)
        tl.store(tgt_ptr + t * M + cols, carry + v, mask=mask)


@triton.jit(do_not_specialize=["T"])
def _vtrace_kernel(
    bl_ptr, tl_ptr, r_ptr, v_ptr, nv_ptr, d_ptr, te_ptr, vs_ptr, pg_ptr,
    T, M,
    s_bl_t, s_bl_m, s_tl_t, s_tl_m, s_r_t, s_r_m, s_v_t, s_v_m, s_nv_t, s_nv_m, s_d_t, s_d_m, s_te_t, s_te_m,
    gamma, rho_bar, c_bar, lam,
    BLOCK: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < M
    cols = cols.to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    last = (T - 1).to(tl.int64)
    vs_next = tl.load(nv_ptr + last * s_nv_t + cols * s_nv_m, mask=mask, other=0.0).to(tl.float32)
    for i in range(0, T):
        t = (T - 1 - i).to(tl.int64)
        blp = tl.load(bl_ptr + t * s_bl_t + cols * s_bl_m, mask=mask, other=0.0).to(tl.float32)
        tlp = tl.load(tl_ptr + t * s_tl_t + cols * s_tl_m, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + t * s_r_t + cols * s_r_m, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * s_v_t + cols * s_v_m, mask=mask, other=0.0).to(tl.float32)
        nv = tl.load(nv_ptr + t * s_nv_t + cols * s_nv_m, mask=mask, other=0.0).to(tl.float32)
        d = tl.load(d_ptr + t * s_d_t + cols * s_d_m, mask=mask, other=0).to(tl.float32)
        te = tl.load(te_ptr + t * s_te_t + cols * s_te_m, mask=mask, other=0).to(tl.float32)
        ratio = tl.exp(tlp - blp)
        rho = tl.minimum(ratio, rho_bar)
        c = lam * tl.minimum(ratio, c_bar)
        disc = gamma * (1.0 - te)
        acc = rho * (r + disc * nv - v) + gamma * (1.0 - d) * c * acc
        vhat = tl.where(d != 0.0, nv, vs_next)
        tl.store(pg_ptr + t * M + cols, rho * (r + disc * vhat - v), mask=mask)
        vs_next = acc + v
        tl.store(vs_ptr + t * M + cols, vs_next, mask=mask)


def _launch_args(xs, T, M):
    rows = [_rows(x, T, M) for x in xs]
    strides = []
    for x in rows:
        strides += [x.stride(0), x.stride(1)]
    return rows, strides


def gae(reward, value, next_value, done, terminated, gamma, lam):
    T = reward.shape[0]
    M = reward.numel() // T
    adv = torch.empty(reward.shape, dtype=torch.float32, device=reward.device)
    target = torch.empty(reward.shape, dtype=torch.float32, device=reward.device)
    if M == 0:
        return adv, target
    rows, strides = _launch_args([reward, value, next_value, _flag(done), _flag(terminated)], T, M)
    grid = (triton.cdiv(M, BLOCK_COLS),)
    _gae_kernel[grid](*rows, adv, target, T, M, *strides, gamma, lam, BLOCK=BLOCK_COLS, num_warps=4)
    return adv, target


def vtrace(behavior_logp, target_logp, reward, value, next_value, done, terminated, gamma, rho_bar, c_bar, lam):
    T = reward.shape[0]
    M = reward.numel() // T
    vs = torch.empty(reward.shape, dtype=torch.float32, device=reward.device)
    pg_adv = torch.empty(reward.shape, dtype=torch.float32, device=reward.device)
    if M == 0:
        return vs, pg_adv
    xs = [behavior_logp, target_logp, reward, value, next_value, _flag(done), _flag(terminated)]
    rows, strides = _launch_args(xs, T, M)
    grid = (triton.cdiv(M, BLOCK_COLS),)
    _vtrace_kernel[grid](
        *rows, vs, pg_adv, T, M, *strides, gamma, rho_bar, c_bar, lam, BLOCK=BLOCK_COLS, num_warps=4
    )
    return vs, pg_adv


# ---- losses -------------------------------------------------------------------------------------------
# Forward: an optional moments kernel (valid count, sum and sum of squares of the advantage, per block),
# then one kernel that writes per-block partial sums of every statistic and the per-sample gradient of the
# loss w.r.t. new_logp and new_value. Block partials are summed by torch (deterministic, no atomics,
# no host sync). Backward multiplies the stored gradients by the incoming scalar gradient.

LOSS_BLOCK = 1024


@triton.jit
def _moments_kernel(adv_ptr, valid_ptr, part_ptr, n, HAS_VALID: tl.constexpr, BLOCK: tl.constexpr,
                    CDT: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(adv_ptr + offs, mask=m, other=0.0).to(CDT)
    if HAS_VALID:
        w = tl.load(valid_ptr + offs, mask=m, other=0).to(CDT)
    else:
        w = m.to(CDT)
    tl.store(part_ptr + pid * 3 + 0, tl.sum(w, axis=0))
    tl.store(part_ptr + pid * 3 + 1, tl.sum(w * a, axis=0))
    tl.store(part_ptr + pid * 3 + 2, tl.sum(w * a * a, axis=0))


@triton.jit
def _loss_block(adv_ptr, valid_ptr, norm_ptr, n, HAS_VALID: tl.constexpr, NORMALIZE: tl.constexpr,
                BLOCK: tl.constexpr, CDT: tl.constexpr):
    """This program's offsets, mask, validity weights, per-sample mean weight and (normalized) advantages.

    ``norm_ptr`` holds (valid count, advantage mean, 1 / (advantage std + eps)).
    """
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if HAS_VALID:
        w = tl.load(valid_ptr + offs, mask=m, other=0).to(CDT)
    else:
        w = m.to(CDT)
    scale = w / tl.load(norm_ptr + 0)
    adv = tl.load(adv_ptr + offs, mask=m, other=0.0).to(CDT)
    if NORMALIZE:
        adv = (adv - tl.load(norm_ptr + 1)) * tl.load(norm_ptr + 2)
    return offs, m, w, scale, adv


@triton.jit
def _ppo_kernel(new_logp_ptr, old_logp_ptr, adv_ptr, new_v_ptr, old_v_ptr, tgt_ptr, ent_ptr, valid_ptr,
                norm_ptr, part_ptr, g_logp_ptr, g_value_ptr,
                n, clip_coef, vf_coef, vf_clip,
                HAS_VALID: tl.constexpr, HAS_ENT: tl.constexpr, NORMALIZE: tl.constexpr,
                CLIP_VLOSS: tl.constexpr, BLOCK: tl.constexpr, CDT: tl.constexpr):
    pid = tl.program_id(0)
    offs, m, w, scale, adv = _loss_block(adv_ptr, valid_ptr, norm_ptr, n, HAS_VALID, NORMALIZE, BLOCK, CDT)
    new_logp = tl.load(new_logp_ptr + offs, mask=m, other=0.0).to(CDT)
    old_logp = tl.load(old_logp_ptr + offs, mask=m, other=0.0).to(CDT)
    logratio = new_logp - old_logp
    ratio = tl.exp(logratio)
    lo = 1.0 - clip_coef
    hi = 1.0 + clip_coef
    pg_a = -adv * ratio
    pg_b = -adv * tl.minimum(tl.maximum(ratio, lo), hi)
    d_a = -adv * ratio
    d_b = tl.where((ratio >= lo) & (ratio <= hi), d_a, 0.0)
    # torch.maximum splits the gradient evenly on ties; match it so the twins agree exactly
    d_pg = tl.where(pg_a > pg_b, d_a, tl.where(pg_b > pg_a, d_b, 0.5 * (d_a + d_b)))
    pg = tl.maximum(pg_a, pg_b)
    tl.store(g_logp_ptr + offs, scale * d_pg, mask=m)

    new_v = tl.load(new_v_ptr + offs, mask=m, other=0.0).to(CDT)
    tgt = tl.load(tgt_ptr + offs, mask=m, other=0.0).to(CDT)
    diff = new_v - tgt
    sq = diff * diff
    if CLIP_VLOSS:
        old_v = tl.load(old_v_ptr + offs, mask=m, other=0.0).to(CDT)
        dv = new_v - old_v
        v_clipped = old_v + tl.minimum(tl.maximum(dv, -vf_clip), vf_clip)
        sq_c = (v_clipped - tgt) * (v_clipped - tgt)
        d_c = tl.where((dv >= -vf_clip) & (dv <= vf_clip), v_clipped - tgt, 0.0)
        d_v = tl.where(sq > sq_c, diff, tl.where(sq_c > sq, d_c, 0.5 * (diff + d_c)))
        vloss = 0.5 * tl.maximum(sq, sq_c)
    else:
        d_v = diff
        vloss = 0.5 * sq
    tl.store(g_value_ptr + offs, scale * vf_coef * d_v, mask=m)

    if HAS_ENT:
        ent = tl.load(ent_ptr + offs, mask=m, other=0.0).to(CDT)
    else:
        ent = tl.zeros([BLOCK], dtype=CDT)
    kl = (ratio - 1.0) - logratio
    clipped = (tl.abs(ratio - 1.0) > clip_coef).to(CDT)
    tl.store(part_ptr + pid * 5 + 0, tl.sum(w * pg, axis=0))
    tl.store(part_ptr + pid * 5 + 1, tl.sum(w * vloss, axis=0))
    tl.store(part_ptr + pid * 5 + 2, tl.sum(w * ent, axis=0))
    tl.store(part_ptr + pid * 5 + 3, tl.sum(w * kl, axis=0))
    tl.store(part_ptr + pid * 5 + 4, tl.sum(w * clipped, axis=0))


@triton.jit
def _pg_kernel(logp_ptr, adv_ptr, v_ptr, tgt_ptr, ent_ptr, valid_ptr, norm_ptr, part_ptr, g_logp_ptr,
               g_value_ptr, n, vf_coef,
               HAS_VALID: tl.constexpr, HAS_ENT: tl.constexpr, NORMALIZE: tl.constexpr,
               BLOCK: tl.constexpr, CDT: tl.constexpr):
    pid = tl.program_id(0)
    offs, m, w, scale, adv = _loss_block(adv_ptr, valid_ptr, norm_ptr, n, HAS_VALID, NORMALIZE, BLOCK, CDT)
    logp = tl.load(logp_ptr + offs, mask=m, other=0.0).to(CDT)
    tl.store(g_logp_ptr + offs, -scale * adv, mask=m)
    diff = tl.load(v_ptr + offs, mask=m, other=0.0).to(CDT) - tl.load(tgt_ptr + offs, mask=m, other=0.0).to(CDT)
    tl.store(g_value_ptr + offs, scale * vf_coef * diff, mask=m)
    if HAS_ENT:
        ent = tl.load(ent_ptr + offs, mask=m, other=0.0).to(CDT)
    else:
        ent = tl.zeros([BLOCK], dtype=CDT)
    tl.store(part_ptr + pid * 3 + 0, tl.sum(-w * adv * logp, axis=0))
    tl.store(part_ptr + pid * 3 + 1, tl.sum(w * 0.5 * diff * diff, axis=0))
    tl.store(part_ptr + pid * 3 + 2, tl.sum(w * ent, axis=0))


def _flat(x):
    return None if x is None else x.detach().reshape(-1)


def _norm_stats(adv, valid, n, normalize, dtype, cdt):
    """[count, mean, 1 / (std + eps)] of the valid advantages, on the device (no host sync)."""
    device = adv.device
    if valid is None and not normalize:
        return torch.tensor([max(n, 1), 0.0, 1.0], dtype=dtype, device=device)
    nblk = triton.cdiv(n, LOSS_BLOCK)
    part = torch.empty(nblk, 3, dtype=dtype, device=device)
    valid_arg = adv if valid is None else valid
    _moments_kernel[(nblk,)](adv, valid_arg, part, n, HAS_VALID=valid is not None, BLOCK=LOSS_BLOCK, CDT=cdt)
    count, s, ss = part.sum(0).unbind(0)
    count = count.clamp(min=1)
    mean = s / count
    var = ((ss - s * mean) / (count - 1).clamp(min=1)).clamp(min=0)
    return torch.stack([count, mean, 1.0 / (var.sqrt() + 1e-8)])


def _dtypes(*xs):
    if any(x is not None and x.dtype == torch.float64 for x in xs):
        return torch.float64, tl.float64
    return torch.float32, tl.float32


def _finish_loss(ctx, part, norm, g_logp, g_value, logp, value, entropy, valid, ent_coef, vf_coef):
    """Shared end of the fused loss forwards: reduce the per-block partial sums, save what backward needs.

    ``part`` holds per-block sums of (policy loss, value loss, entropy); ``g_logp``/``g_value`` are the
    per-sample gradients of the loss w.r.t. logp and value, written by the kernel.
    """
    n, dtype = logp.numel(), part.dtype
    stats = part.sum(0) / norm[0]
    loss = stats[0] - ent_coef * stats[2] + vf_coef * stats[1]
    ent_grad = None
    if entropy is not None:
        w = torch.ones(n, dtype=dtype, device=logp.device) if valid is None else valid.reshape(-1).to(dtype)
        ent_grad = (-ent_coef) * w / norm[0]
    ctx.save_for_backward(g_logp, g_value, ent_grad)
    ctx.meta = (logp.shape, logp.dtype, value.dtype, None if entropy is None else entropy.dtype)
    ctx.mark_non_differentiable(stats)
    return loss, stats


def _loss_backward(ctx, grad_loss):
    """Gradients for (logp, value, entropy): one multiply each of the saved per-sample gradients."""
    g_logp, g_value, ent_grad = ctx.saved_tensors
    shape, logp_dtype, value_dtype, ent_dtype = ctx.meta
    d_logp = (grad_loss * g_logp).reshape(shape).to(logp_dtype)
    d_value = (grad_loss * g_value).reshape(shape).to(value_dtype)
    d_ent = None if ent_grad is None else (grad_loss * ent_grad).reshape(shape).to(ent_dtype)
    return d_logp, d_value, d_ent


class _PPOLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, new_logp, new_value, entropy, old_logp, advantage, old_value, value_target, valid,
                clip_coef, vf_coef, ent_coef, clip_vloss, vf_clip, normalize):
        dtype, cdt = _dtypes(new_logp, new_value, entropy, old_logp, advantage, old_value, value_target)
        n = new_logp.numel()
        flat = [_flat(x) for x in (new_logp, old_logp, advantage, new_value, old_value, value_target, entropy)]
        valid_flat = None if valid is None else valid.reshape(-1).view(torch.uint8)
        norm = _norm_stats(flat[2], valid_flat, n, normalize, dtype, cdt)
        nblk = max(triton.cdiv(n, LOSS_BLOCK), 1)
        part = torch.zeros(nblk, 5, dtype=dtype, device=new_logp.device)
        g_logp = torch.empty(n, dtype=dtype, device=new_logp.device)
        g_value = torch.empty(n, dtype=dtype, device=new_logp.device)
        if n > 0:
            ptrs = [x if x is not None else flat[0] for x in flat]
            _ppo_kernel[(nblk,)](
                *ptrs, flat[0] if valid_flat is None else valid_flat, norm, part, g_logp, g_value,
                n, clip_coef, vf_coef, vf_clip,
                HAS_VALID=valid_flat is not None, HAS_ENT=entropy is not None, NORMALIZE=normalize,
                CLIP_VLOSS=clip_vloss, BLOCK=LOSS_BLOCK, CDT=cdt,
            )
        return _finish_loss(ctx, part, norm, g_logp, g_value, new_logp, new_value, entropy, valid, ent_coef, vf_coef)

    @staticmethod
    def backward(ctx, grad_loss, grad_stats):
        return _loss_backward(ctx, grad_loss) + (None,) * 11


class _PGLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, value, entropy, advantage, value_target, valid, vf_coef, ent_coef, normalize):
        dtype, cdt = _dtypes(logp, value, entropy, advantage, value_target)
        n = logp.numel()
        flat = [_flat(x) for x in (logp, advantage, value, value_target, entropy)]
        valid_flat = None if valid is None else valid.reshape(-1).view(torch.uint8)
        norm = _norm_stats(flat[1], valid_flat, n, normalize, dtype, cdt)
        nblk = max(triton.cdiv(n, LOSS_BLOCK), 1)
        part = torch.zeros(nblk, 3, dtype=dtype, device=logp.device)
        g_logp = torch.empty(n, dtype=dtype, device=logp.device)
        g_value = torch.empty(n, dtype=dtype, device=logp.device)
        if n > 0:
            ptrs = [x if x is not None else flat[0] for x in flat]
            _pg_kernel[(nblk,)](
                *ptrs, flat[0] if valid_flat is None else valid_flat, norm, part, g_logp, g_value, n, vf_coef,
                HAS_VALID=valid_flat is not None, HAS_ENT=entropy is not None, NORMALIZE=normalize,
                BLOCK=LOSS_BLOCK, CDT=cdt,
            )
        return _finish_loss(ctx, part, norm, g_logp, g_value, logp, value, entropy, valid, ent_coef, vf_coef)

    @staticmethod
    def backward(ctx, grad_loss, grad_stats):
        return _loss_backward(ctx, grad_loss) + (None,) * 6


_PPO_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")
_PG_STATS = ("policy_loss", "value_loss", "entropy")


def ppo_loss(new_logp, old_logp, advantage, new_value, old_value, value_target, entropy, valid,
             clip_coef, vf_coef, ent_coef, clip_vloss, vf_clip, normalize):
    loss, stats = _PPOLoss.apply(new_logp, new_value, entropy, old_logp, advantage, old_value, value_target,
                                 valid, clip_coef, vf_coef, ent_coef, clip_vloss, vf_clip, normalize)
    return loss, dict(zip(_PPO_STATS, stats.unbind(0)))


def pg_loss(logp, advantage, value, value_target, entropy, valid, vf_coef, ent_coef, normalize):
    loss, stats = _PGLoss.apply(logp, value, entropy, advantage, value_target, valid, vf_coef, ent_coef, normalize)
    return loss, dict(zip(_PG_STATS, stats.unbind(0)))

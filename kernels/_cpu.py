"""CPU backend: a small C library (``_cpu_src.c``) built on first use and loaded with ctypes.

It does not include torch headers, so it compiles in about a second with any C compiler. The shared
object is cached under ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), keyed by the
source, the flags and the CPU model. If no compiler works, ``lib()`` returns None after one warning and
the callers use their pure-torch path.
"""
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings

import torch

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cpu_src.c")
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"]
_lock = threading.Lock()
_state = {"lib": None, "tried": False}

# Threads only pay off for large inputs; on a busy machine a small parallel region waits on a descheduled
# thread for a whole time slice.
PARALLEL_MIN_NUMEL = 1 << 20

_I64, _F32, _INT, _P = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "gae": [_I64, _I64] + [_P, _I64] * 5 + [_F32, _F32, _P, _P, _INT],
    "vtrace": [_I64, _I64] + [_P, _I64] * 7 + [_F32] * 4 + [_P, _P, _INT],
}
_VALUE_CODES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_FLAG_CODES = {torch.bool: "u8", torch.uint8: "u8", torch.float32: "f32"}


def _cpu_tag():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    model += line
    except OSError:
        pass
    return model


def _build():
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    with open(_SRC, "rb") as f:
        src = f.read()
    key = hashlib.sha256(src + " ".join([compiler] + _FLAGS).encode() + _cpu_tag().encode()).hexdigest()[:16]
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions"
    )
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"fastrl_kernels_cpu_{key}.so")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=root)
        os.close(fd)
        try:
            subprocess.run([compiler, *_FLAGS, _SRC, "-o", tmp], check=True, capture_output=True, text=True)
            os.replace(tmp, path)  # atomic: concurrent builders never see a half-written file
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"{compiler} failed: {e.stderr.strip()[-2000:]}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(path)
    for kernel, argtypes in _SIGNATURES.items():
        for v in ("f32", "bf16", "f16"):
            for fl in ("u8", "f32"):
                fn = getattr(lib, f"{kernel}_{v}_{fl}")
                fn.argtypes, fn.restype = argtypes, None
    return lib


def lib():
    """The loaded library, or None when it cannot be built (warns once)."""
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                try:
                    _state["lib"] = _build()
                except Exception as e:  # any build or load failure falls back to torch
                    warnings.warn(f"kernels: CPU C kernels unavailable, using the slower torch path ({e})")
                _state["tried"] = True
    return _state["lib"]


def _as_rows(x, T, M):
    """A [T, M] view of ``x`` with contiguous columns (a copy only when no such view exists)."""
    x2 = x.reshape(T, M)
    if M > 1 and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2


def _prepare(values, flags, T, M):
    """Put values in one C dtype and flags in one C dtype; return [T, M] views, codes and row strides."""
    vdt = values[0].dtype
    if vdt not in _VALUE_CODES or any(x.dtype != vdt for x in values):
        vdt = torch.float32
        values = [x.float() for x in values]
    fdt = flags[0].dtype
    if fdt not in _FLAG_CODES or any(x.dtype != fdt for x in flags):
        fdt = torch.bool
        flags = [x if x.dtype == torch.bool else x != 0 for x in flags]
    rows = [_as_rows(x, T, M) for x in values + flags]
    args = []
    for x in rows:
        args += [x.data_ptr(), x.stride(0) if T > 1 else M]
    return rows, args, f"{_VALUE_CODES[vdt]}_{_FLAG_CODES[fdt]}"


def _empty_outputs(shape, n, lib_):
    return [torch.empty(shape, dtype=torch.float32) for _ in range(n)]


def _threads(T, M):
    return torch.get_num_threads() if T * M >= PARALLEL_MIN_NUMEL else 1


def gae(reward, value, next_value, done, terminated, gamma, lam):
    """C GAE on CPU tensors. Returns float32 ``(adv, value_target)`` shaped like ``reward``."""
    T = reward.shape[0]
    M = reward.numel() // T
    lib_ = lib()
    adv, target = _empty_outputs(reward.shape, 2, lib_)
    if M == 0:
        return adv, target
    rows, args, code = _prepare([reward, value, next_value], [done, terminated], T, M)
    getattr(lib_, f"gae_{code}")(T, M, *args, gamma, lam, adv.data_ptr(), target.data_ptr(), _threads(T, M))
    return adv, target


def vtrace(behavior_logp, target_logp, reward, value, next_value, done, terminated, gamma, rho_bar, c_bar, lam):
    """C V-trace on CPU tensors. Returns float32 ``(vs, pg_advantage)`` shaped like ``reward``."""
    T = reward.shape[0]
    M = reward.numel() // T
    lib_ = lib()
    vs, pg_adv = _empty_outputs(reward.shape, 2, lib_)
    if M == 0:
        return vs, pg_adv
    rows, args, code = _prepare(
        [behavior_logp, target_logp, reward, value, next_value], [done, terminated], T, M
    )
    getattr(lib_, f"vtrace_{code}")(
        T, M, *args, gamma, rho_bar, c_bar, lam, vs.data_ptr(), pg_adv.data_ptr(), _threads(T, M)
    )
    return vs, pg_adv

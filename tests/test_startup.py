"""Start-up cost guards: what the default path imports, and the deferred compiler marks of
``fastrl._startup.import_tensordict``.

Each check runs in a fresh interpreter, since ``sys.modules`` is what it looks at."""
import json
import subprocess
import sys

import pytest

from conftest import QUIET

# Modules a run that compiles nothing, logs to neither TensorBoard nor wandb and uses no Ray/actors never needs.
UNUSED_ON_THE_DEFAULT_PATH = ("torch._dynamo", "wandb", "tensorboard", "torch.utils.tensorboard", "ray",
                              "fastrl.distributed.ray_actors", "fastrl.distributed.actors", "fastrl.run.actor_learner")


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_an_eager_run_without_loggers_imports_no_dynamo_wandb_tensorboard_or_actors(tmp_path):
    argv = ["--total-steps", "2048", "--compile", "off", "--eval-episodes", "2", "--eval-seeds", "1",
            "--run-dir", str(tmp_path / "run"), *QUIET]
    out = _python("import json, sys; from fastrl.train import main; "
                  f"code = main({argv!r}); "
                  f"print(json.dumps([code, sorted(m for m in {UNUSED_ON_THE_DEFAULT_PATH!r} if m in sys.modules)]))")
    code, loaded = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and (tmp_path / "run" / "summary.json").is_file()
    assert loaded == [], f"the default path imported {loaded}"


# The compiler's view of TensorDict's import-time marks: which functorch/foreach callables dynamo lets into a graph,
# and which tensordict helpers it treats as constant.
_MARKS = (
    "import torch, tensordict.utils as u, tensordict.base as b; "
    "from torch._dynamo import trace_rules; "
    "fns = [torch._C._functorch._add_batch_dim, torch._C._functorch._remove_batch_dim, b._foreach_copy_]; "
    "print(json.dumps([[id(f) in trace_rules._allowed_callable_ids for f in fns], "
    "[getattr(f, '_dynamo_marked_constant', False) for f in (u._lock_warn, u._check_inbuild)]]))")


def test_tensordict_through_lazy_dynamo_loads_no_dynamo_and_gets_the_same_marks_once_dynamo_loads():
    deferred = _python("import json, sys; from fastrl._startup import import_tensordict; import_tensordict(); "
                       "assert 'torch._dynamo' not in sys.modules, 'dynamo loaded with tensordict'; " + _MARKS)
    plain = _python("import json, tensordict; " + _MARKS)
    assert json.loads(deferred) == json.loads(plain) == [[True, True, True], [True, True]]


def test_with_triton_loaded_the_command_line_freezes_nothing_and_exits_quietly(tmp_path):
    """nanobind (Triton's bindings, which torchrl imports) reports its objects still alive at exit as leaks, a screen
    of stderr, and frozen objects stay alive: the command line freezes nothing."""
    pytest.importorskip("triton")
    argv = ["--total-steps", "1024", "--eval-episodes", "0", *QUIET, "--run-dir", str(tmp_path / "run")]
    code = ("import gc, json, sys; import triton; from fastrl.cli import entry\n"
            f"sys.argv = ['fastrl', 'train', *{argv!r}]\n"
            "code = entry()\n"
            "print(json.dumps([code, gc.get_freeze_count()]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, 0]
    assert "nanobind" not in done.stderr and "leaked" not in done.stderr, done.stderr[-2000:]


def test_envpool_loads_without_jumanji_code_or_matplotlib_and_a_jumanji_env_still_builds():
    """``import_envpool`` leaves ``envpool.jumanji``'s code (its renderer imports matplotlib.pyplot) for the first
    Jumanji env: every id is still registered, and making one runs the package's code then."""
    out = _python(
        "import json, sys; from fastrl._startup import import_envpool; envpool = import_envpool(); "
        "before = ['matplotlib' in sys.modules, 'envpool.jumanji.jumanji_render' in sys.modules, "
        "'Game2048-v1' in envpool.list_all_envs()]; "
        "env = envpool.make('Game2048-v1', env_type='gymnasium', num_envs=2, seed=1); obs, _ = env.reset(); "
        "print(json.dumps([before, 'envpool.jumanji.jumanji_render' in sys.modules, "
        "envpool.jumanji.Game2048EnvSpec.__name__, type(sys.modules['envpool.jumanji']).__name__]))")
    before, rendered, spec_name, module_type = json.loads(out.strip().splitlines()[-1])
    assert before == [False, False, True]
    assert rendered and spec_name == "Game2048EnvSpec" and module_type == "module"


_GC_SPY = (
    "import gc, json, sys; import fastrl.cli.train as cli_train, fastrl.run.loop as loop, "
    "fastrl.run.preflight as preflight\n"
    "seen = {}\n"
    "check_run, run_loop = preflight.check_run, loop.run_loop\n"
    "def spy_check(cfg):\n"
    "    seen['collecting_at_start'] = gc.isenabled(); return check_run(cfg)\n"
    "def spy_loop(*args, **kwargs):\n"
    "    seen['collecting_in_loop'] = gc.isenabled(); seen['frozen_in_loop'] = gc.get_freeze_count() > 0\n"
    "    return run_loop(*args, **kwargs)\n"
    "preflight.check_run, loop.run_loop = spy_check, spy_loop\n")


def test_the_command_line_process_pauses_the_collector_only_for_start_up_and_main_from_python_never(tmp_path):
    """``fastrl train`` / ``python -m fastrl.train`` (``run_as_process``): no cyclic collection among start-up's
    long-lived objects, the collector back on (over new objects) for the run loop, all frozen at the exit. ``main``
    called from Python leaves the caller's collector as it was."""
    argv = ["--total-steps", "1024", "--eval-episodes", "0", *QUIET]
    as_process = _python(_GC_SPY + "from fastrl.cli import entry\n"
                         f"sys.argv = ['fastrl', 'train', *{argv + ['--run-dir', str(tmp_path / 'a')]!r}]\n"
                         "code = entry()\n"
                         "print(json.dumps([code, seen, gc.get_freeze_count() > 0]))")
    code, seen, frozen_at_exit = json.loads(as_process.strip().splitlines()[-1])
    assert code == 0 and frozen_at_exit
    assert seen == {"collecting_at_start": False, "collecting_in_loop": True, "frozen_in_loop": True}
    in_python = _python(_GC_SPY + f"code = cli_train.main({argv + ['--run-dir', str(tmp_path / 'b')]!r})\n"
                        "print(json.dumps([code, seen, gc.isenabled(), gc.get_freeze_count()]))")
    code, seen, collecting, frozen = json.loads(in_python.strip().splitlines()[-1])
    assert code == 0 and collecting and frozen == 0
    assert seen == {"collecting_at_start": True, "collecting_in_loop": True, "frozen_in_loop": False}

"""``fastrl.run.allocator``: glibc's thresholds set once per process on Linux/glibc, nothing elsewhere; the CPU trainer
asks for them."""
import platform

import pytest

from fastrl.config import make_config
from fastrl.run import allocator


@pytest.fixture
def fresh():
    allocator.keep_freed_memory.cache_clear()
    yield
    allocator.keep_freed_memory.cache_clear()


def test_glibc_takes_the_thresholds_once(fresh, monkeypatch):
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: Libc())
    assert allocator.keep_freed_memory() is True and allocator.keep_freed_memory() is True
    assert calls == [(-3, allocator.MMAP_THRESHOLD), (-1, allocator.TRIM_THRESHOLD)]  # once, both parameters


def test_a_refused_setting_or_another_libc_reports_false(fresh, monkeypatch):
    class Refusing:
        def mallopt(self, param, value):
            return 0
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: Refusing())
    monkeypatch.setattr(allocator.platform, "system", lambda: "Linux")
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert allocator.keep_freed_memory() is False
    allocator.keep_freed_memory.cache_clear()
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))  # musl, macOS: nothing is called
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: pytest.fail("called off glibc"))
    assert allocator.keep_freed_memory() is False


def test_the_cpu_trainer_keeps_freed_memory(monkeypatch):
    from fastrl.run import trainer as trainer_module
    asked = []
    monkeypatch.setattr(trainer_module, "keep_freed_memory", lambda: asked.append(True))
    t = trainer_module.Trainer(make_config({"total_steps": 256, "n_envs": 4, "n_steps": 16, "compile": "off"}))
    t.close()
    assert asked == [True]

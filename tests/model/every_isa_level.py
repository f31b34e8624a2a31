"""A pytest plugin that runs every selected test once per kernel ISA level named in
MINIVLLM_TEST_ISA_LEVELS (comma-separated), each time with that level's library.

test_kernel_isa.py runs the kernels-vs-torch tests of the other files through it, in one
subprocess (`-p tests.model.every_isa_level`), so that each level this CPU has, not only
the one the suite runs, is checked against the torch references. Every kernel caller reaches
the library through library._library(), which the fixture points at the level's library; a
level whose library does not build or load is an error, never a skip."""

from __future__ import annotations

import os
from collections import Counter
from functools import cache

import pytest

from minivllm.model.kernels import build, isa, library

LEVELS_ENV = "MINIVLLM_TEST_ISA_LEVELS"
_ran: Counter[str] = Counter()


def _levels() -> list[str]:
    return [level for level in os.environ.get(LEVELS_ENV, "").split(",") if level]


@cache
def _library(level: str):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(isa.ENV, level)
        lib = build.load()
    if lib is None or lib.isa_level != level:
        raise RuntimeError(f"the {level} kernels did not build or load (see the warning)")
    return lib


def pytest_generate_tests(metafunc):
    # scope="module": a module's tests run level by level, its fixtures built once
    metafunc.parametrize("kernel_isa_level", _levels(), indirect=True, scope="module")


@pytest.fixture(scope="module", autouse=True)
def kernel_isa_level(request):
    lib = _library(request.param)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(library, "_library", lambda: lib)
        patch.setenv(isa.ENV, request.param)  # for an engine process a test may start
        yield request.param


@pytest.fixture(autouse=True)
def _count(request):
    yield
    _ran[request.getfixturevalue("kernel_isa_level")] += 1


def pytest_terminal_summary(terminalreporter):
    for level in _levels():
        terminalreporter.write_line(f"kernel ISA level {level}: {_ran[level]} tests ran")

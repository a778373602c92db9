"""Fixtures shared by kvc's Python tests: models written once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kvc


@pytest.fixture(scope="session")
def gen_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random 2-layer Llama written by ``kvc-run gen-model`` (bf16)."""
    out = tmp_path_factory.mktemp("gen-model")
    kvc.run_tool(["gen-model", "--out", out, "--layers", "2", "--hidden", "64",
                  "--heads", "4", "--kv-heads", "2", "--ffn", "128",
                  "--vocab", "256", "--max-positions", "4096", "--seed", "1"])
    return str(out)


@pytest.fixture(scope="session")
def stories_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """stories260K imported from ``$KVC_MODELS_DIR`` (skips without it)."""
    models = Path(os.environ.get("KVC_MODELS_DIR", "../shared/models"))
    checkpoint = models / "stories260K" / "stories260K.bin"
    if not checkpoint.is_file():
        pytest.skip(f"{checkpoint} is absent")
    out = tmp_path_factory.mktemp("stories260K")
    kvc.run_tool(["import-llama2c", "--checkpoint", checkpoint, "--tokenizer",
                  models / "stories260K" / "tok512.bin", "--out", out])
    return str(out)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Exit with ``$KVC_ALL_SKIPPED_EXIT`` when every test was skipped.

    ctest runs each module as a test and sets it to 77, its
    SKIP_RETURN_CODE: a module whose dependencies are absent
    (``importorskip``) or whose every test skipped is reported skipped,
    not passed. Unset (a user's own pytest run), pytest's status stands.
    """
    code = os.environ.get("KVC_ALL_SKIPPED_EXIT")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not code or exitstatus != 0 or reporter is None:
        return
    stats = reporter.stats
    if stats.get("skipped") and not stats.get("passed"):
        session.exitstatus = int(code)


"""``tandem`` is the only CLI, and it loads what a command needs only when that command runs.

- ``model_cdn`` and ``cloud_hub`` hold no typer or rich code (a library API
  that the commands in ``tandem/cli/`` call): checked statically, and by
  importing every ``model_cdn`` module in a fresh interpreter;
- ``tandem --help`` loads no command module and no package behind one;
  ``tandem keys --help`` does not load the hub;
- ``python -m cloud_hub`` keeps working without typer, with one-line errors.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from ._cli import ROOT, tandem_env
from .test_edge_is_light import imported_modules

CLI_LIBRARIES = ("typer", "rich", "click")
LIBRARIES = ("model_cdn", "cloud_hub")


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=tandem_env(COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


@pytest.mark.parametrize("package", LIBRARIES)
def test_no_library_source_file_imports_a_cli_library(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    offences = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in files
        for line, module in imported_modules(ast.parse(path.read_text(encoding="utf-8")))
        if module.split(".")[0] in (*CLI_LIBRARIES, "tandem")
    ]
    assert not offences, "CLI code in a library package:\n" + "\n".join(offences)


def test_importing_every_cdn_module_loads_no_cli_library() -> None:
    code = f"""
import importlib, json, pkgutil, sys
import model_cdn
for info in pkgutil.walk_packages(model_cdn.__path__, prefix="model_cdn."):
    importlib.import_module(info.name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {CLI_LIBRARIES!r})))
"""
    result = _fresh(code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


LOADED = """
import json, sys
sys.argv = ["tandem", *{args!r}]
from tandem.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(*args: str) -> set[str]:
    result = _fresh(LOADED.format(args=list(args)))
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_tandem_help_loads_no_command_and_no_package_behind_one() -> None:
    loaded = _loaded_by("--help")
    heavy = {"cloud_hub", "model_cdn", "edge_agent", "torch", "fastapi", "onnxruntime"}
    assert not {m for m in loaded if m.split(".")[0] in heavy}
    from tandem.cli import COMMANDS

    modules = {module for module, _attr, _help in COMMANDS.values()}
    assert not modules & loaded, sorted(modules & loaded)
    assert "tandem.simulator" not in loaded


def test_a_command_loads_its_own_package_only() -> None:
    loaded = _loaded_by("keys", "--help")
    assert "tandem.cli.keys" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("cloud_hub", "torch")}
    assert "tandem.cli.hub" not in loaded


def test_python_m_cloud_hub_runs_without_typer_and_errs_in_one_line() -> None:
    code = (
        "import sys; sys.modules['typer'] = None; sys.modules['rich'] = None; "  # not installed
        "sys.argv = ['cloud_hub', *sys.argv[1:]]; import runpy; "
        "runpy.run_module('cloud_hub', run_name='__main__')"
    )
    bad = subprocess.run(
        [sys.executable, "-c", code, "--repo", str(ROOT), "--workers", "0"],
        cwd=ROOT,
        env=tandem_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers" in lines[0], bad.stderr
    helped = subprocess.run(
        [sys.executable, "-c", code, "--help"],
        cwd=ROOT,
        env=tandem_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    for option in ("--repo", "--broker", "--share-group", "--http-port", "--workers"):
        assert option in helped.stdout

"""A Dagster project that installs rollups keeps its own top-level `resources` and `sensors`
packages: every module of rollups imports in a process where the project's packages of those
names come first on the path, and the project's packages are the ones it then sees."""

import pkgutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import rollup_assets

ROOT = Path(__file__).resolve().parents[2]


def test_rollups_installs_no_top_level_package_but_its_own() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["packages"]["find"]["include"] == ["rollup_assets*"]


def test_every_module_imports_beside_a_projects_own_resources_and_sensors(
    tmp_path: Path,
) -> None:
    for name in ("resources", "sensors"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"OWNER = 'project {name}'\n")
    modules = sorted(
        info.name
        for info in pkgutil.walk_packages(rollup_assets.__path__, "rollup_assets.")
        if not info.name.endswith("__main__")  # runs its command when imported
    )
    assert "rollup_assets.resources.warehouse" in modules
    assert "rollup_assets.sensors.definitions" in modules
    script = textwrap.dedent(
        f"""
        import importlib
        for module in {modules!r}:
            importlib.import_module(module)
        import resources, sensors
        print(resources.OWNER, "/", sensors.OWNER)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,  # the project's root comes first on sys.path, as in `dagster dev` there
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "project resources / project sensors"

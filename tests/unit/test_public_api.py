"""`rollup_assets.api` is the one public Python module: every name it exports imports, importing
it is cheap (no Dagster, nothing started, no environment read), and the Python examples of the
README and the guides import the project only from it."""

import ast
import subprocess
import sys

import pytest

from rollup_assets import api
from tests.unit.doc_blocks import ROOT, Block, python_snippets

PUBLIC = "rollup_assets.api"


def test_every_exported_name_imports() -> None:
    assert api.__all__, "the public module exports nothing"
    assert len(set(api.__all__)) == len(api.__all__)
    missing = [name for name in api.__all__ if getattr(api, name, None) is None]
    assert missing == []
    namespace: dict[str, object] = {}
    exec(f"from {PUBLIC} import *", namespace)  # the star import honours __all__ alone
    assert set(api.__all__) <= set(namespace)


def test_the_public_module_exports_what_the_guides_use() -> None:
    needed = {
        "Engine",
        "Warehouse",
        "load_catalog",
        "ingest_file",
        "ingest_with_spark",
        "query_arrow",
        "query_spark",
        "Operations",
        "rollback",
        "rewind",
        "RollupsError",
        "SpecError",
        "RollupChain",
    }
    assert needed <= set(api.__all__)


def test_importing_the_public_module_loads_no_dagster_and_changes_nothing() -> None:
    script = (
        "import os, sys\n"
        "before = dict(os.environ)\n"
        f"import {PUBLIC}\n"
        "assert 'dagster' not in sys.modules, 'importing the API loaded Dagster'\n"
        "assert dict(os.environ) == before, 'importing the API changed the environment'\n"
        f"assert {PUBLIC}.RollupChain.__name__ == 'RollupChain'\n"
        "assert 'dagster' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def project_imports(block: Block) -> list[str]:
    """The modules of this project a Python block imports, as written."""
    tree = ast.parse(block.text, filename=block.where)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [m for m in found if m.split(".")[0] in {"rollup_assets", "resources", "sensors"}]


def non_public_imports(block: Block) -> list[str]:
    return [m for m in project_imports(block) if m != PUBLIC]


def test_the_guides_python_examples_import_only_the_public_module() -> None:
    blocks = python_snippets()
    assert blocks, "no Python example found in README.md or docs/"
    assert any(project_imports(b) for b in blocks)
    wrong = {b.where: non_public_imports(b) for b in blocks if non_public_imports(b)}
    assert wrong == {}


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("from rollup_assets.api import Engine\nimport duckdb\n", []),
        (
            "from rollup_assets.services.query import query_arrow\n",
            ["rollup_assets.services.query"],
        ),
        ("import rollup_assets.model.specs as specs\n", ["rollup_assets.model.specs"]),
        ("from rollup_assets import api\n", ["rollup_assets"]),
    ],
)
def test_a_block_importing_past_the_public_module_is_named(text: str, wrong: list[str]) -> None:
    block = Block(ROOT / "README.md", 1, "python", text)
    assert non_public_imports(block) == wrong

"""Every module of the product holds one concern in at most 400 lines: past that, it is split
by concern (docs/architecture.md lists what each module owns)."""

from pathlib import Path

import rollup_assets

LIMIT = 400
PACKAGE = Path(rollup_assets.__file__).parent


def test_every_module_is_at_most_400_lines() -> None:
    sizes = {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert len(sizes) > 100  # the whole package was read
    assert {m: n for m, n in sorted(sizes.items()) if n > LIMIT} == {}

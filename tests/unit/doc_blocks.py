"""The fenced code blocks of the README and the guides in `docs/`, for the tests that keep
their examples runnable."""

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first content line
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    """README.md and every guide under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, dedented by their fence's indentation (a block
    inside a list item), each with its info string's first word as its language."""
    blocks: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        language = (opening["info"].split() or [""])[0].lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence[0] * len(fence))
            and not lines[j].strip()[len(fence) :]
        ):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append(Block(path, i + 2, language, textwrap.dedent("\n".join(body))))
        i = j + 1
    return blocks


def all_blocks(*languages: str) -> list[Block]:
    """Every block in one of `languages`, across the README and the guides."""
    return [b for doc in documents() for b in code_blocks(doc) if b.language in languages]


HEREDOC = re.compile(r"^\s*python3? - <<-?'?(?P<tag>\w+)'?\s*$")


def python_snippets() -> list[Block]:
    """Every Python example: the Python blocks, and the `python - <<'EOF'` scripts of shell
    blocks."""
    snippets = all_blocks("python", "py")
    for block in all_blocks("bash", "sh", "console", "shell"):
        lines = block.text.splitlines()
        for i, line in enumerate(lines):
            opening = HEREDOC.match(line)
            if opening:
                end = lines.index(opening["tag"], i + 1)
                text = "\n".join(lines[i + 1 : end])
                snippets.append(Block(block.path, block.line + i + 1, "python", text))
    return snippets

"""The commands the README and the guides show stay valid: every `rollups ...` line of a shell
or console block names an existing subcommand with options it has, and every `make X` names a
target of the Makefile. The CLI is introspected (click's command tree), never run."""

import re
import shlex
from dataclasses import dataclass

import click
import pytest

from rollup_assets.cli import main
from tests.unit.doc_blocks import ROOT, Block, all_blocks

SHELL_LANGUAGES = ("bash", "sh", "shell", "console", "")
# Tokens that end a simple command: separators, pipes, redirections, subshells.
COMMAND_ENDS = {";", "&&", "||", "|", "&", ">", ">>", "<", "2>", "(", ")", "do", "then"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HEREDOC = re.compile(r"<<-?\s*'?\"?(?P<tag>\w+)")


@dataclass(frozen=True)
class CommandLine:
    where: str
    words: list[str]  # from the program name on, up to the end of its simple command


def shell_lines(block: Block) -> list[tuple[int, str]]:
    """The command lines of a block, continuations joined: in a console block (or one without
    a language) only the lines after a `$ ` prompt; in a shell block every line outside
    heredoc bodies."""
    prompt_only = block.language in ("console", "")
    lines = block.text.splitlines()
    found: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        i += 1
        if prompt_only:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        heredoc = HEREDOC.search(line)
        if heredoc:  # its body is another language's text
            while i < len(lines) and lines[i].strip() != heredoc["tag"]:
                i += 1
            i += 1
        found.append((block.line + start, line))
    return found


def commands_of(block: Block, program: str) -> list[CommandLine]:
    """Every simple command of `block` that runs `program`."""
    commands = []
    for line_no, line in shell_lines(block):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError as exc:
            pytest.fail(f"{block.path.name}:{line_no}: cannot split {line!r}: {exc}")
        at_start = True
        for k, token in enumerate(tokens):
            if token in COMMAND_ENDS:
                at_start = True
            elif at_start and ASSIGNMENT.match(token):
                continue  # VAR=value before the program
            elif at_start and token == program:
                rest = []
                for word in tokens[k + 1 :]:
                    if word in COMMAND_ENDS:
                        break
                    rest.append(word)
                where = f"{block.path.relative_to(ROOT)}:{line_no}"
                commands.append(CommandLine(where, [program, *rest]))
                at_start = False
            else:
                at_start = False
    return commands


def cli_problems(words: list[str]) -> list[str]:
    """What is wrong with `rollups <words...>` against the click command tree, without running
    anything: an unknown subcommand, or an option the (sub)command does not have."""
    ctx = click.Context(main, info_name="rollups", **main.context_settings)
    command: click.Command = main
    args = words[1:]
    while isinstance(command, click.Group):
        if not args or args[0].startswith("-"):
            return [] if args and args[0] in ("-h", "--help") else ["no subcommand given"]
        sub = command.get_command(ctx, args[0])
        if sub is None:
            return [f"no command {' '.join([ctx.command_path, args[0]])!r}"]
        ctx = click.Context(sub, info_name=args[0], parent=ctx, **sub.context_settings)
        command, args = sub, args[1:]
    options: dict[str, click.Option] = {}
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            for name in [*param.opts, *param.secondary_opts]:
                options[name] = param
    lenient = ctx.ignore_unknown_options
    problems = []
    k = 0
    while k < len(args):
        word = args[k]
        k += 1
        if word == "--":
            break
        if not word.startswith("-") or word == "-" or re.match(r"^-\d", word):
            continue  # an argument (or a negative number)
        name, has_value = word.split("=", 1)[0], "=" in word
        option = options.get(name)
        if option is None:
            if not lenient:
                problems.append(f"{ctx.command_path} has no option {name}")
            continue
        if not (option.is_flag or option.count or has_value):
            k += option.nargs  # the option's value
    return problems


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.MULTILINE))


def make_problems(words: list[str], targets: set[str]) -> list[str]:
    goals = [w for w in words[1:] if not w.startswith("-") and not ASSIGNMENT.match(w)]
    return [f"no make target {goal!r}" for goal in goals if goal not in targets]


def documented(program: str) -> list[CommandLine]:
    return [c for b in all_blocks(*SHELL_LANGUAGES) for c in commands_of(b, program)]


def test_the_docs_rollups_commands_exist_with_their_options() -> None:
    commands = documented("rollups")
    assert len(commands) >= 20, "the README and the guides show fewer commands than expected"
    problems = {c.where: cli_problems(c.words) for c in commands if cli_problems(c.words)}
    assert problems == {}


def test_the_docs_make_targets_exist() -> None:
    commands = documented("make")
    assert {"demo", "test"} <= {w for c in commands for w in c.words[1:]}
    targets = make_targets()
    problems = {c.where: make_problems(c.words, targets) for c in commands}
    assert {where: p for where, p in problems.items() if p} == {}


def test_the_readme_keeps_its_two_quickstart_commands() -> None:
    readme = [b for b in all_blocks("bash") if b.path.name == "README.md"]
    first = [c.words for c in commands_of(readme[0], "make")]
    assert first == [["make", "demo"], ["make", "test"]]


def block(text: str, language: str = "bash") -> Block:
    return Block(ROOT / "README.md", 1, language, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rollups query energy_daily --from 2024-03-01 --entity m1\n", []),
        ("rollups query energy_daily --form 2024-03-01\n", ["rollups query has no option --form"]),
        ("rollups querry energy_daily\n", ["no command 'rollups querry'"]),
        ("rollups spark-server status\n", []),
        ("rollups spark-server stat\n", ["no command 'rollups spark-server stat'"]),
        (
            "rollups spark-server status --verbose\n",
            ["rollups spark-server status has no option --verbose"],
        ),
        ("rollups dev --port 3001\n", []),  # passed on to `dagster dev`
        ("X=1 rollups tick --until-quiet --now=2025-01-01T00:00:00Z  # quiet\n", []),
        (
            "for r in a b; do rollups activate $r --force; done\n",
            ["rollups activate has no option --force"],
        ),
        ("rollups ingest energy_raw f.parquet \\\n  --change-source Import --spark\n", []),
        (
            "rollups ingest energy_raw f.parquet \\\n  --change-sauce Import\n",
            ["rollups ingest has no option --change-sauce"],
        ),
    ],
)
def test_a_documented_command_is_checked_option_by_option(text: str, expected: list[str]) -> None:
    found = commands_of(block(text), "rollups")
    assert len(found) == 1
    assert cli_problems(found[0].words) == expected


def test_console_output_and_heredoc_bodies_are_not_commands() -> None:
    console = block("$ rollups status\nrollups status --bogus (output, not a command)\n", "console")
    assert [c.words for c in commands_of(console, "rollups")] == [["rollups", "status"]]
    heredoc = block("cat > x.txt <<'EOF'\nrollups status --bogus\nEOF\nrollups status\n")
    assert [c.words for c in commands_of(heredoc, "rollups")] == [["rollups", "status"]]


def test_an_unknown_make_target_is_named() -> None:
    words = commands_of(block("make bench SIZE=small\nmake benchmark\n"), "make")
    assert [make_problems(c.words, make_targets()) for c in words] == [
        [],
        ["no make target 'benchmark'"],
    ]

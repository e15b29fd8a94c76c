"""The manual (README.md and docs/*.md) against the commands' --help, both ways (docs/development.md, "How a
flag gets documented"):

1. every command and flag the manual names exists: a command line (in a fenced block or an inline code span)
   belongs to the command it starts with, and its flags must be in that command's --help (the DeepSpeed
   launcher's before the script); a code span or prose flag with no command belongs to the page's commands
   (PAGE_COMMANDS);
2. every flag of every entry point's --help is named in the manual, on a page of that command or on one of
   its command lines; every environment variable a launch script reads with a default is named somewhere.

The --help texts come from the console scripts' targets, called in-process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import re
import shlex

import pytest
from launcher import ROOT
from test_console_scripts import console_scripts

ALL = "all"
LAUNCHER = "launcher"  # DeepSpeed's `deepspeed` (and launch/deepspeed.sh, which adds --launcher-log)
# The commands a page's flags without a command belong to. A page not listed (one being written beside this
# test) belongs to all of them, as README.md does; such pages document a flag only on its command's lines.
PAGE_COMMANDS = {
    "data.md": ["prep"],
    "training.md": ["train", LAUNCHER],
    "evaluation.md": ["evaluate", LAUNCHER],
    "generation.md": ["generate", "export"],
    "transfer.md": ["transfer"],
    "import.md": ["import_weights"],
    "classify.md": ["classify", "transfer"],
    "gpu.md": ["train", LAUNCHER],
    "tracking.md": ["train", "plot"],
    "reliability.md": ["train", "evaluate", "generate", "transfer", "prep"],
    "development.md": [ALL],
    "README.md": [ALL],
}
# launch scripts whose extra arguments go to app/train.py
TRAIN_WRAPPERS = ("train_single_node.sh", "train_multi_node.sh", "slurm_train.sbatch")
FLAG = re.compile(r"(?<![\w-])--[a-zA-Z][\w-]*")
FLAG_HEAD = re.compile(r"^(--?[a-zA-Z][\w-]*)")


# ---- the --help side


def command_names() -> dict[str, str]:
    """command -> "module:function": mlstm-prep -> prep, mlstm-eval -> evaluate, ... (the module's name)."""
    out = {}
    for target in console_scripts().values():
        module = target.split(":")[0]
        out["prep" if module == "data_prep.cli" else module.removeprefix("app.")] = target
    return out


def help_text_of(target: str) -> str:
    module, func = target.split(":")
    main = getattr(importlib.import_module(module), func)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    return out.getvalue()


def launcher_help() -> str:
    from deepspeed.launcher.runner import parse_args

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_args(["--help"])
    wrapper = (ROOT / "launch" / "deepspeed.sh").read_text()  # its own flag, documented in its header
    return out.getvalue() + "\n".join(line for line in wrapper.splitlines() if line.startswith("#"))


@functools.cache
def helps() -> dict[str, str]:
    out = {name: help_text_of(target) for name, target in command_names().items()}
    out[LAUNCHER] = launcher_help()
    return out


def options_of(help_text: str) -> set[str]:
    """The option strings of a --help's options (`  --data DATA  help...`, `  --x, --no-x  ...`), not the
    flags its prose mentions."""
    flags = set()
    for line in help_text.splitlines():
        head = line.strip().split("  ")[0]
        if line.startswith("  ") and not line.startswith("   ") and FLAG_HEAD.match(head):  # not a help line
            flags |= set(FLAG.findall(head))
    return flags - {"--help"}


def flags_of(command: str) -> set[str]:
    """Every flag a --help names (its options and any its prose mentions)."""
    return set(FLAG.findall(helps()[command])) | options_of(helps()[command])


# ---- the manual side


def pages() -> dict[str, str]:
    out = {"README.md": (ROOT / "README.md").read_text()}
    out |= {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
    return out


def commands_of_page(page: str) -> list[str]:
    names = PAGE_COMMANDS.get(page, [ALL])
    return [*helps()] if ALL in names else names


def split_page(text: str) -> tuple[list[str], list[str], str]:
    """(command lines of shell blocks, with `\\` continuations joined; inline code spans; the prose with
    both taken out)."""
    lines, prose_parts = [], []
    pos = 0
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        prose_parts.append(text[pos : m.start()])
        pos = m.end()
        if m.group(1) in ("", "bash", "sh", "shell"):
            lines += m.group(2).replace("\\\n", " ").splitlines()
    prose = "".join([*prose_parts, text[pos:]])
    spans = re.findall(r"``? ?([^`]+?) ?``?", prose)
    return lines, spans, re.sub(r"``? ?[^`]+? ?``?", " ", prose)


def words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in a prose span: its words as they are
        return line.split()


def parse_command(tokens: list[str]) -> tuple[str | None, list[str], list[str]] | None:
    """A command line's (command, its flags, the launcher's flags), or None for another tool's line."""
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):  # VAR=value prefixes
        tokens = tokens[1:]
    if not tokens:
        return None
    first = tokens[0].removeprefix("./")
    names = command_names()
    if re.fullmatch(r"mlstm-\w+", first) and first != "mlstm-ds":  # the project, not a command
        assert first in console_scripts(), f"`{first}` is not a console script"
        return next(n for n, t in names.items() if t == console_scripts()[first]), tokens[1:], []
    if re.fullmatch(r"(\S*/)?python3?", tokens[0]):
        if tokens[1:2] == ["-m"]:
            mod = tokens[2] if len(tokens) > 2 else ""
            name = (
                "prep" if mod == "data_prep" else mod.removeprefix("app.") if mod.startswith("app.") else None
            )
            return (name, tokens[3:], []) if name in names else None
        return script_command(tokens[1:], [])
    if first in ("deepspeed", "launch/deepspeed.sh"):
        launcher_flags = []
        rest = tokens[1:]
        while rest and not rest[0].endswith(".py") and rest[0] != "--module":
            launcher_flags.append(rest.pop(0))
        if rest[:1] == ["--module"]:
            mod = rest[1] if len(rest) > 1 else ""
            return mod.removeprefix("app."), rest[2:], launcher_flags
        return script_command(rest, launcher_flags)
    if first == "sbatch":  # sbatch [its options] launch/slurm_train.sbatch [train flags]
        rest = tokens[1:]
        while rest and not rest[0].endswith(".sbatch"):
            rest.pop(0)
        tokens, first = rest, rest[0].removeprefix("./") if rest else ""
    if first.startswith("launch/") and first.split("/")[-1] in TRAIN_WRAPPERS:
        return "train", tokens[1:], []
    return None


def script_command(
    tokens: list[str], launcher_flags: list[str]
) -> tuple[str | None, list[str], list[str]] | None:
    if not tokens or not re.fullmatch(r"app/\w+\.py", tokens[0]):
        return None
    name = tokens[0][4:-3]
    assert name in command_names(), f"`{tokens[0]}` is not an entry point"
    return name, tokens[1:], launcher_flags


def command_lines(text: str):
    """(command, flags, launcher flags) of every command line of a page: its shell blocks' lines and the
    inline code spans that start with a command (a pipe's or `&&`'s parts each)."""
    lines, spans, _ = split_page(text)
    for line in [*lines, *spans]:
        for part in re.split(r"\|\||&&|[|;]", line):
            parsed = parse_command(words(part))
            if parsed is not None and parsed[0] is not None:
                yield parsed


def loose_flags(text: str) -> list[str]:
    """Flags in a page's inline code spans that start with no command, and in its prose."""
    _, spans, prose = split_page(text)
    out = []
    for span in spans:
        if span.lstrip().startswith("-"):
            out += FLAG.findall(span)
    return out + FLAG.findall(prose)


def flag_ok(flag: str, valid: set[str]) -> bool:
    flag = flag.split("=")[0]
    return flag in valid or flag in ("--help", "--version")


# ---- the tests


def test_every_flag_the_manual_names_exists_in_its_commands_help():
    bad = []
    for page, text in pages().items():
        for name, flags, launcher_flags in command_lines(text):
            valid = flags_of(name)
            bad += [
                f"{page}: {f} (app {name})" for f in FLAG.findall(" ".join(flags)) if not flag_ok(f, valid)
            ]
            launcher = flags_of(LAUNCHER)
            bad += [
                f"{page}: {f} (the launcher)"
                for f in FLAG.findall(" ".join(launcher_flags))
                if not flag_ok(f, launcher)
            ]
        valid = set().union(*(flags_of(c) for c in commands_of_page(page)))
        bad += [
            f"{page}: {f} (page commands {commands_of_page(page)})"
            for f in loose_flags(text)
            if not flag_ok(f, valid)
        ]
    assert not bad, "flags the manual names that no --help has:\n" + "\n".join(sorted(set(bad)))


def test_every_command_and_launch_script_the_manual_names_exists():
    bad = []
    for page, text in pages().items():
        for path in set(
            re.findall(r"(?<![\w/.])((?:app|launch|data_prep|tests|bench|ds_configs)/[\w/.-]*\w)", text)
        ):
            if not (ROOT / path).exists():
                bad.append(f"{page}: {path}")
        for name in set(re.findall(r"(?<![\w-])mlstm-\w+(?![\w-])", text)) - {"mlstm-ds"}:
            if name not in console_scripts():
                bad.append(f"{page}: {name}")
    assert not bad, "the manual names what does not exist:\n" + "\n".join(sorted(bad))


def documented_flags() -> dict[str, set[str]]:
    """command -> the flags the manual names for it: on its command lines anywhere, and anywhere on a page
    that belongs to it alone or with a few others (not README.md, which belongs to all)."""
    out: dict[str, set[str]] = {name: set() for name in helps()}
    for page, text in pages().items():
        for name, flags, _ in command_lines(text):
            out[name] |= set(FLAG.findall(" ".join(flags)))
        if ALL not in PAGE_COMMANDS.get(page, [ALL]):
            for name in PAGE_COMMANDS[page]:
                out[name] |= set(FLAG.findall(text))
    return {name: {f.split("=")[0] for f in flags} for name, flags in out.items()}


def test_every_help_flag_is_documented():
    documented = documented_flags()
    everywhere = set.intersection(*(options_of(helps()[name]) for name in command_names()))  # --version
    anywhere = set(FLAG.findall("\n".join(pages().values())))
    missing = []
    for name in command_names():
        for flag in sorted(options_of(helps()[name])):
            base = flag.removeprefix("--no-").removeprefix("--")  # --x and --no-x document each other
            named = documented[name] | (anywhere if flag in everywhere else set())
            if not {f"--{base}", f"--no-{base}"} & named:
                missing.append(f"{name}: {flag}")
    assert not missing, "flags no page of their command names:\n" + "\n".join(missing)


def launch_variables() -> dict[str, set[str]]:
    """script -> the environment variables it reads with a default (`${NAME:-...}`): its options."""
    out = {}
    for path in sorted([*(ROOT / "launch").glob("*.sh"), *(ROOT / "launch").glob("*.sbatch")]):
        names = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):?[-=]", path.read_text()))
        out[path.name] = {n for n in names if not n.startswith("SLURM_")}  # Slurm sets those
    return out


def test_every_launch_script_option_is_documented():
    manual = "\n".join(pages().values())
    missing = [
        f"launch/{script}: {name}"
        for script, names in launch_variables().items()
        for name in sorted(names)
        if not re.search(rf"(?<![\w]){name}(?![\w])", manual)
    ]
    assert not missing, "launch script settings the manual does not name:\n" + "\n".join(missing)


def test_the_checks_see_what_they_check():
    """The parsing the tests rest on: a command line's flags, a launcher's, an option list's."""
    assert parse_command(words("deepspeed --num_gpus 2 app/train.py --data d")) == (
        "train",
        ["--data", "d"],
        ["--num_gpus", "2"],
    )
    assert parse_command(words("HOSTFILE=h ./launch/train_multi_node.sh --warmup-steps 2"))[:2] == (
        "train",
        ["--warmup-steps", "2"],
    )
    assert parse_command(words("python -m data_prep --out x"))[0] == "prep"
    assert parse_command(words("pip install -e '.[hf]'")) is None
    assert options_of("usage: x\n  --a A, --no-a  help --b\n      --c in prose\n  -h, --help  show\n") == {
        "--a",
        "--no-a",
    }
    assert "--data" in options_of(helps()["train"]) and "--dyn-lr" in options_of(helps()["evaluate"])
    assert "--num_gpus" in flags_of(LAUNCHER) and "--launcher-log" in flags_of(LAUNCHER)
    lines, spans, prose = split_page("a `--x 1` b\n```bash\npython app/train.py \\\n  --data d\n```\nc --y\n")
    assert [words(line) for line in lines] == [["python", "app/train.py", "--data", "d"]]
    assert spans == ["--x 1"] and "--y" in prose


def test_the_help_says_what_the_commands_need_and_take():
    """Training's usage line names its required settings; every tool that takes --checkpoint names <run>/best
    (what the quickstart and the README's recipes pass it)."""
    usage = helps()["train"].split("\n\n")[0]
    assert re.search(r"(?<!\[)--deepspeed_config FILE --data DIR", usage), usage
    for name in ("evaluate", "generate", "export", "transfer"):
        assert "<run>/best" in " ".join(helps()[name].split()), name

"""The README's install commands work from a clone: they are parsed and checked here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [[line.split("#")[0].strip() for line in block.splitlines()
             if line.split("#")[0].strip()] for block in blocks]


def _cpu_block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("**A lighter, CPU-only install.**", 1)[1]
    return _bash_blocks(section)[0]


def test_the_cpu_only_install_makes_a_venv_and_installs_from_the_clone():
    commands = _cpu_block()
    assert commands[0].startswith("python -m venv .venv")
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                 ["project"]["optional-dependencies"])
    ours = [c for c in commands if "pip install" in c and "torch" not in c]
    assert ours
    for command in ours:
        words = shlex.split(command)
        target = words[words.index("install") + 1:]
        target = [w for w in target if not w.startswith("-") or w == "-e"]
        # an install from this folder (the package is on no index), with extras that exist
        assert target[0] == "-e" and target[1].startswith("."), command
        named = re.findall(r"\[(.*?)\]", target[1])
        assert all(e.strip() in extras for group in named for e in group.split(",")), command
    torch = next(c for c in commands if "torch" in c)
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch


def test_no_readme_command_installs_the_package_from_an_index():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for block in _bash_blocks(text):
        for command in block:
            assert not re.search(r"pip install [^|&]*\bnapari-attnreg\b", command), command

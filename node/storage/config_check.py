"""``cx config check``: every problem of a home's ``config.toml``, each naming its key.

The schema is node/storage/config_rules.py's, the one the node checks at start-up; this adds
what needs the filesystem (is the file there, valid TOML, do the files it names exist) and
then runs the node's own reader, so anything that reader refuses is reported as well.
``tests/node/test_config_check.py`` checks that every key ``cx init`` writes is known.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from node.storage.config_rules import Problem, config_problems
from node.storage.home import Home, HomeError

__all__ = ["Problem", "check_config"]


def check_config(home: Home) -> list[Problem]:
    """Every problem of ``home``'s config.toml; empty when the node can use it."""
    path = home.config_path
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return [Problem(where=str(path), why="no such file; run `cx init`")]
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem(where=str(path), why=f"cannot be read: {exc}")]
    except tomllib.TOMLDecodeError as exc:
        return [Problem(where=str(path), why=f"not valid TOML: {exc}")]
    problems = config_problems(doc) + _files(doc)
    if not problems:
        try:
            home.config()
        except HomeError as exc:
            problems.append(Problem(where=str(path), why=str(exc).removeprefix(f"{path}: ")))
    return problems


def _files(doc: dict[str, Any]) -> list[Problem]:
    roots = doc.get("buyer", {}).get("ek_roots", [])
    if not isinstance(roots, list):
        return []
    return [
        Problem(where="[buyer] ek_roots", why=f"{root}: no such file")
        for root in roots
        if isinstance(root, str) and not Path(root).is_file()
    ]

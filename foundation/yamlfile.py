"""Reading a YAML file (a run spec, a settings file) with errors a person can act on.

:func:`load_yaml_file` raises :class:`YamlFileError` whose message is one line naming the
file, the line and column, and the problem, e.g.
``bad.yaml line 3, column 5: mapping values are not allowed here``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """A file is not readable as YAML; the message is one line that names the file."""


def yaml_error_line(name: str, exc: yaml.YAMLError) -> str:
    """``NAME line L, column C: problem (context at line L, column C)``, on one line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        text = f"{name} line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        if exc.context:
            where = exc.context_mark
            text += f" ({exc.context}"
            if where is not None:
                text += f" at line {where.line + 1}, column {where.column + 1}"
            text += ")"
        return text
    return f"{name}: not valid YAML: {' '.join(str(exc).split())}"


def load_yaml_file(path: Path | str) -> Any:
    """The document of the YAML (or JSON) file ``path``.

    Raises:
        YamlFileError: the file is not UTF-8 text or not valid YAML; the message names the
            file as given, the line and column, and the problem.
        OSError: the file cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise YamlFileError(yaml_error_line(str(path), exc)) from None

"""Docstrings as plain text for a command line's ``--help`` (argparse prints them verbatim).

:func:`plain_text` drops reST markup from a module docstring that a parser shows as its
description: double-backtick literals and roles print as their text.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)(?:\s*<[^`>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_BLOCK = re.compile(r"(\S)::(?=\s|$)")


def _role(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return target.rsplit(".", 1)[-1] if short else target


def plain_text(doc: str | None) -> str:
    """``doc`` without reST markup: ``x`` and :mod:`x` as x, ``Example::`` as ``Example:``."""
    text = _ROLE.sub(_role, doc or "")
    text = _LITERAL.sub(r"\1", text)
    return _BLOCK.sub(r"\1:", text)

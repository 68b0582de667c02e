"""Naming what a user asked for that does not exist, in one line: the closest real names, and
a short sample of the rest when there are many (Meta-World alone has 50 tasks)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

SHOWN = 8  # names listed before "and N more"


def unknown_names(asked: Iterable[str], known: Iterable[str]) -> str:
    """``'x', 'y'`` (did you mean ``'z'``?) for the ``asked`` names not in ``known``, then the
    known ones, at most :data:`SHOWN` of them; "" when every asked name is known.

    >>> unknown_names(["reach-v2"], ["reach-v3", "push-v3"])
    "'reach-v2' (did you mean 'reach-v3'?); known: push-v3, reach-v3"
    """
    names = sorted(set(known))
    missing = [a for a in asked if a not in set(names)]
    if not missing:
        return ""
    parts = []
    for name in missing:
        close = difflib.get_close_matches(name, names, n=2)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        parts.append(f"{name!r}{hint}")
    listed = ", ".join(names[:SHOWN])
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f"{', '.join(parts)}; known: {listed or 'none'}{more}"

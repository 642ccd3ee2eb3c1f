"""Close matches for what a user mistyped: a key, a section, a choice, a preset name.

`close_matches` gives the names the word spells apart from case and separators
(``H100`` for ``h100``, ``dgx_h100`` for ``dgx-h100``); else, for a word of three
characters or more, the names it begins (``h100`` for ``h100-sxm5-80gb``, which difflib
alone does not find: its ratio is 0.44; ``num_layer`` for ``num_layers``); else
difflib's close matches and the names the word is part of (``h100`` for ``dgx-h100``),
most alike first. `did_you_mean` words them for the end of a one-line error."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

__all__ = ["close_matches", "did_you_mean"]

_SEPARATORS = re.compile(r"[-_. ]+")
_PART_MIN = 3  # characters a word needs before it matches as a part of a name
_MARGIN = 0.1  # difflib matches this much less alike than the best are left out


def _bare(text: str) -> str:
    return _SEPARATORS.sub("", text.lower())


def close_matches(
    word: object, choices: Iterable[str], most: int = 3, cutoff: float = 0.6
) -> list[str]:
    """Up to ``most`` of ``choices`` that ``word`` was probably meant to be, best
    first; none for a word that is not a string or matches nothing well (difflib's
    ``cutoff``: higher for names that share long parts, as architectures do)."""
    if not isinstance(word, str) or not word.strip():
        return []
    names = list(dict.fromkeys(choices))
    bare = _bare(word)[:200]  # a pasted essay is not compared in full
    if not bare:
        return []
    same = [name for name in names if _bare(name) == bare]
    if same:
        return same[:most]

    def ratio(name: str) -> float:
        return difflib.SequenceMatcher(None, bare, _bare(name)).ratio()

    by_bare: dict[str, str] = {}
    for name in names:
        by_bare.setdefault(_bare(name), name)
    near = [by_bare[b] for b in difflib.get_close_matches(bare, list(by_bare), most, cutoff)]
    if near:
        best = ratio(near[0])
        near = [name for name in near if ratio(name) >= best - _MARGIN]
    if len(bare) >= _PART_MIN:
        begun = [name for name in names if _bare(name).startswith(bare)]
        if begun:
            return sorted(begun, key=ratio, reverse=True)[:most]
        near += [name for name in names if bare in _bare(name)]
    return sorted(dict.fromkeys(near), key=ratio, reverse=True)[:most]


def did_you_mean(
    word: object, choices: Iterable[str], prefix: str = "", cutoff: float = 0.6
) -> str:
    """``did you mean 'x'?`` (or ``'x' or 'y'``) for the close matches, each with
    ``prefix`` (a section); empty when there are none."""
    found = close_matches(word, choices, cutoff=cutoff)
    if not found:
        return ""
    return "did you mean " + " or ".join(repr(prefix + name) for name in found) + "?"

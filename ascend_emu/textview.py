"""Width-aware text tables for the command-line views (``inspect``, ``compare``, ``demo``).

Every view prints through :func:`console` and :func:`print_table`, so every one of them is
readable at any terminal width down to :data:`MIN_WIDTH` (80 columns is the width to design for):

1. A table that fits is printed as it is.
2. Otherwise the columns a view marks optional (``Col.drop > 0``) are left out, highest ``drop``
   first, and a note under the table names them and where to see them (``--json``, a wider
   ``COLUMNS``).
3. Columns marked ``wrap`` fold onto more lines (at spaces; long words at ``Col.min``).
4. If the rest still does not fit, the table is paged by columns: each page repeats the first
   ``keep`` (key) columns and holds as many of the others as fit, with a caption naming them.

Nothing is ever cropped: offsets, values and field names are either shown whole or named in a
note. The width is ``COLUMNS`` when set (rich's rule too), else the terminal's, else
:data:`DEFAULT_WIDTH` for a pipe or a file.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Iterable, Sequence

#: Width when stdout is not a terminal and ``COLUMNS`` is unset (the POSIX and rich default).
DEFAULT_WIDTH = 80
#: Narrowest width honoured: a smaller ``COLUMNS`` is raised to it.
MIN_WIDTH = 40
#: Characters between two columns: padding, rule, padding (``" │ "``).
GAP = 3


def width() -> int | None:
    """The text width: ``COLUMNS`` (at least :data:`MIN_WIDTH`) when set to a positive integer,
    else None on a terminal (rich asks the terminal), else :data:`DEFAULT_WIDTH`."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return max(int(env), MIN_WIDTH)
    return None if sys.stdout.isatty() else DEFAULT_WIDTH


def console(file=None):
    """A rich Console writing to ``file`` (default: the current ``sys.stdout``) at :func:`width`.

    Create it when printing, not at import time: the width is read from ``COLUMNS`` then.
    """
    from rich.console import Console

    return Console(file=file if file is not None else sys.stdout, width=width(), highlight=False, soft_wrap=False)


@dataclass(frozen=True)
class Col:
    """One column of :func:`print_table`.

    Attributes:
        name: header.
        wrap: cells may fold onto more lines (at spaces; words longer than ``min`` fold too).
        drop: 0: always shown; > 0: left out when the table does not fit, highest first.
        min: with ``wrap``: the narrowest the column may get (default: its longest word); words
            longer than that fold.
        justify: ``"left"`` or ``"right"``.
    """

    name: str
    wrap: bool = False
    drop: int = 0
    min: int | None = None
    justify: str = "left"


def _text(cell):
    from rich.text import Text

    return cell if isinstance(cell, Text) else Text(str(cell))


def _widths(cols: Sequence[Col], rows: Sequence[Sequence]) -> tuple[list[int], list[int]]:
    """(natural, minimum) width of each column."""
    natural, minimum = [], []
    for i, c in enumerate(cols):
        lines = c.name.split("\n") + [ln for r in rows for ln in _text(r[i]).plain.split("\n")]
        nat = max(len(ln) for ln in lines)
        if c.wrap:
            low = c.min if c.min is not None else max((len(w) for ln in lines for w in ln.split()), default=1)
            minimum.append(min(nat, max(low, 1)))
        else:
            minimum.append(nat)
        natural.append(nat)
    return natural, minimum


def _allot(natural: list[int], minimum: list[int], width: int) -> list[int]:
    """Column widths within ``width``: each column its minimum, the room left shared out to the
    wrapping columns (natural > minimum), evenly, those that lack least made whole first; when even the minima do
    not fit (one page of a single too-wide column), the widest columns give way (they fold)."""
    widths = list(minimum)
    room = width - need(widths)
    lack = [n - m for n, m in zip(natural, minimum, strict=True)]
    if room >= sum(lack):
        return list(natural)
    if room > 0:  # water-filling: the columns that lack least are made whole first
        order = sorted(range(len(lack)), key=lambda i: lack[i])
        for k, i in enumerate(order):
            give = min(lack[i], room // (len(order) - k))
            widths[i] += give
            room -= give
        return widths
    while need(widths) > width and max(widths) > 1:
        widths[widths.index(max(widths))] -= 1
    return widths


def need(widths: Iterable[int]) -> int:
    """Characters a table of columns of these widths takes (no outer edge)."""
    widths = list(widths)
    return sum(widths) + GAP * max(len(widths) - 1, 0)


def fits(cols: Sequence[Col], rows: Sequence[Sequence], width: int, *, optional: bool = False) -> bool:
    """Whether the always-shown columns (``drop == 0``; every column with ``optional``) fit
    ``width`` unpaged (wrapped columns at their minimum)."""
    _, minimum = _widths(cols, rows)
    return need(m for m, c in zip(minimum, cols, strict=True) if optional or not c.drop) <= width


def print_table(con, title: str | None, cols: Sequence[Col], rows: Sequence[Sequence], *,
                sections: Iterable[int] = (), keep: int = 1, more: str = "--json") -> dict:
    """Print ``rows`` under ``title`` on ``con`` within ``con.width`` (module doc for the rules).

    Args:
        con: a rich Console (:func:`console`).
        title: a line printed above the table (None: none).
        cols: the columns.
        rows: cells (str or rich Text; str is never read as markup), one list per row.
        sections: indices of the rows a rule is drawn above.
        keep: leading columns repeated on every page when the table is paged.
        more: where the left-out columns can be seen (named in the note).

    Returns:
        ``{"dropped": [column names left out], "pages": number of tables printed}``.
    """
    from rich.table import Table

    width = con.width
    rows = [list(r) for r in rows]
    natural, minimum = _widths(cols, rows)
    shown = list(range(len(cols)))
    dropped = []
    while need(minimum[i] for i in shown) > width:
        optional = [i for i in shown if cols[i].drop]
        if not optional:
            break
        worst = max(optional, key=lambda i: (cols[i].drop, i))
        shown.remove(worst)
        dropped.append(cols[worst].name)
    pages = [shown]
    if need(minimum[i] for i in shown) > width:
        head, rest = shown[:keep], shown[keep:]
        pages, page = [], []
        for i in rest:
            if page and need(minimum[k] for k in head + page + [i]) > width:
                pages.append(head + page)
                page = []
            page.append(i)
        pages.append(head + page)
    starts = set(sections)
    if title:
        con.print(_text(title))
    for p, page in enumerate(pages):
        if len(pages) > 1:
            names = [cols[i].name.replace("\n", " ") for i in page[keep:]]
            con.print(_text(f"columns {names[0]}" + (f" to {names[-1]}" if len(names) > 1 else "")
                            + f" (page {p + 1} of {len(pages)})"))
        table = Table(show_edge=False, pad_edge=False)
        for i, w in zip(page, _allot([natural[i] for i in page], [minimum[i] for i in page], width), strict=True):
            table.add_column(_text(cols[i].name), overflow="fold", width=w, justify=cols[i].justify)
        for k, r in enumerate(rows):
            if k in starts and k:
                table.add_section()
            table.add_row(*[_text(r[i]) for i in page])
        con.print(table)
    if dropped:
        con.print(_text(f"(left out at {width} columns: {', '.join(dropped)}; {more} or a wider COLUMNS "
                        f"shows them)"))
    return {"dropped": dropped, "pages": len(pages)}

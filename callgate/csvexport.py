"""CSV cells that a spreadsheet will not run as formulas (OWASP "CSV Injection").

A spreadsheet evaluates a cell starting with ``=``, ``+``, ``-``, ``@`` (or a tab or carriage
return before one), and it splits text on its locale's field separator when importing, so
``x;=cmd`` becomes the cells ``x`` and ``=cmd`` where ``;`` separates fields. Every piece that
follows a start or a separator (``,`` ``;`` tab, ``|``, a line break) therefore gets a leading
``'`` before a formula character. Numbers stay numbers.
"""

from __future__ import annotations

import re

_FORMULA_START = re.compile(r"(^|[,;\t|\r\n])([=+\-@\t\r])")


def csv_safe(value):
    """``value`` as a CSV cell: text with every formula start neutralised by a ``'``; other
    values (numbers, ``None``) unchanged."""
    if not isinstance(value, str):
        return value
    return _FORMULA_START.sub(lambda m: f"{m.group(1)}'{m.group(2)}", value)

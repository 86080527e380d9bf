"""Report: renderers that turn results (data) into text, JSON, CSV and HTML.

Results never import their renderers: the plugin, the CLI and a user pass a result here
(``render(compare_dumps(a, b))``, ``write_json(comparison, path)``). Names load on first use.
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._render import render, render_html, write_csv, write_json

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {"._render": ("render", "render_html", "write_csv", "write_json")}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)

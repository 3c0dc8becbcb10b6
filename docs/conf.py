"""Sphinx configuration: Markdown pages (MyST) and an API reference from docstrings.

Built by ``nox -s docs`` with warnings as errors (``-W``). No intersphinx, so no nitpicky
mode either: the build must work offline, where references into Python's, AnyIO's or
psycopg's documentation cannot be resolved.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import river_anyio  # noqa: E402

project = "river_anyio"
author = "river_anyio contributors"
copyright = "river_anyio contributors"
release = river_anyio.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"river_anyio {release}"
html_theme_options = {"description": "River's job queue for trio and asyncio"}

"""Finds the Triton kernels: ``csrc_triton/`` beside this package in a source checkout, else the
installed ``sgl_convwin.csrc_triton`` (so tests run the same from the repo root and from site-packages).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from types import ModuleType


@functools.cache
def triton_kernels() -> ModuleType:
    """The csrc_triton package; ImportError if triton is missing. A source checkout's own
    ``csrc_triton/`` comes first: an editable install maps ``sgl_convwin.csrc_triton`` to the
    checkout it was made from, which need not be this one (git worktrees share one install)."""
    import triton  # noqa: F401  (a clear ImportError before anything else)

    name = f"{__package__}.csrc_triton"
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc_triton")
    if not os.path.isfile(os.path.join(checkout, "__init__.py")):
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(checkout, "__init__.py"), submodule_search_locations=[checkout]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"sgl_convwin: cannot load the Triton kernels from {checkout}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

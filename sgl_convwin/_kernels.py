"""Finds the Triton kernels: ``sgl_convwin.csrc_triton`` when installed, ``csrc_triton/`` beside
this package in a source checkout (so tests run the same from the repo root and from site-packages).
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
    """The csrc_triton package; ImportError if triton is missing."""
    import triton  # noqa: F401  (a clear ImportError before anything else)

    name = f"{__package__}.csrc_triton"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc_triton")
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(checkout, "__init__.py"), submodule_search_locations=[checkout]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"sgl_convwin: cannot find the Triton kernels ({name} or {checkout})")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

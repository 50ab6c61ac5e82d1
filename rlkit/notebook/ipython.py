"""rlkit's errors in IPython and Jupyter: the message, not a traceback through rlkit's internals.

Why: a ``ConfigError`` already lists every problem with its key and fix; the traceback printed above it runs
through ``config/loading.py`` and pydantic, says nothing a user can act on, and pushes the list off screen.
So every :class:`rlkit.errors.RLKitError` carries IPython's ``_render_traceback_`` hook (an exception may
supply its own structured traceback), which calls :func:`render_error`: the exception line (``ConfigError:
3 configuration problem(s): ...``), the exception it was raised from if any (a reward function's own error,
say), and one line saying how to see the rest. ``%xmode verbose`` shows the full traceback again, as
``%xmode`` does for any error. The hook needs no registration and leaves other exceptions, plain Python
(``sys.excepthook``) and any handler you set with ``set_custom_exc`` alone.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

HINT = "(rlkit leaves out its internal traceback here; %xmode verbose shows it)"


def ipython_shell() -> Any:
    """The running IPython shell, or None outside IPython (which is not imported just to ask)."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def render_error(error: BaseException, hint: bool = True) -> list[str]:
    """The structured traceback IPython shows for ``error`` (a list of text blocks): the full one under
    ``%xmode verbose``; else the exception line, the exception it was raised ``from``, and (with ``hint``)
    :data:`HINT`."""
    tb = getattr(ipython_shell(), "InteractiveTB", None)  # the traceback formatter
    if tb is None:
        return traceback.format_exception(type(error), error, error.__traceback__)
    if getattr(tb, "mode", None) == "Verbose":
        return tb.structured_traceback(type(error), error, error.__traceback__)
    lines = list(tb.get_exception_only(type(error), error))
    cause = error.__cause__
    if cause is not None:
        lines.append("raised from:")
        lines.extend(tb.get_exception_only(type(cause), cause))
    return lines + [HINT] if hint else lines

"""What the CLI's exit codes mean, and the one base every bad-input error derives from.

As cibuildwheel's ``errors.py`` does, an error carries its own exit code, so ``main()`` catches
the base once instead of mapping each type by hand. Standard library only: the shared modules
(plan, runtimes) and both sides of the package raise these.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0  # every invariant holds, or the artifact verifies
EXIT_FAIL: Final = 1  # an invariant failed, or the artifact is invalid: every reason is printed
EXIT_USAGE: Final = 2  # bad input: one line naming the problem and the fix; nothing written


class BadInput(Exception):
    """Input or an environment the run cannot start with. Its message is one line a user can
    act on: what is wrong and how to fix it. Raised before any expensive work."""

    exit_code: int = EXIT_USAGE
    # What ``--debug`` prints after the line (a broken installation's worker log, say).
    details: str = ""

"""``python -m dcp_invariant`` and the ``dcp-invariant`` command (pyproject.toml)."""

import os
import sys

INTERRUPTED = "dcp-invariant: interrupted: nothing written"


def main() -> int:
    """The command, with a Ctrl-C during its first 0.2 s (importing the CLI's modules, before
    the CLI handles signals itself) said as any interrupted run says it: one line, exit 130,
    not a KeyboardInterrupt traceback."""
    try:
        from dcp_invariant import cli
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr, flush=True)
        # Nothing was started or written yet, so nothing is left to finalize; and a normal
        # exit could still end by SIGINT: CPython re-raises it at exit once any code it ran
        # through PyRun_* ended in KeyboardInterrupt, caught later or not (Py_RunMain,
        # Modules/main.c; unhandled_keyboard_interrupt, Python/pythonrun.c).
        os._exit(130)
    return cli.main()


# The guard matters: multiprocessing's fork server re-imports the parent's main module.
if __name__ == "__main__":
    sys.exit(main())

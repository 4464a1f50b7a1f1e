import sys

from dcp_invariant.cli import main

# The guard matters: multiprocessing's fork server re-imports the parent's main module.
if __name__ == "__main__":
    sys.exit(main())

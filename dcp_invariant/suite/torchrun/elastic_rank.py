"""The torchrun worker of ``elastic_restart_2_to_2`` (``torchrun --module dcp_invariant.suite.torchrun.elastic_rank``).

Attempt 0: the dying rank writes its marker and exits with the planned code before importing
torch; the others wait for the agent to stop them. Attempt 1: every rank loads the committed
generation through the pointer and takes the next step, like any other resuming group.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import time
from pathlib import Path

from dcp_invariant import canonical
from dcp_invariant.suite import pool, worker
from dcp_invariant.suite.scenarios.payloads import LOAD_AND_STEP

MARKER_FILE = "marker.json"
# Long enough for the agent to see the dying rank's exit first, so the restart follows it.
MARKER_GRACE_SECONDS = 2.0


def main(argv: list[str]) -> int:
    worker.die_with_parent()
    payload = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0:
        if rank == payload["dying_rank"]:
            code = payload["exit_code"]
            Path(MARKER_FILE).write_bytes(
                canonical.dumps({"attempt": attempt, "exit_code": code, "rank": rank})
            )
            os._exit(code)
        # The agent stops this rank when it sees the other one fail: it sends SIGTERM
        # (LocalElasticAgent._shutdown in torch/distributed/elastic/agent/server/
        # local_elastic_agent.py), which on Windows is TerminateProcess, and only after 30 s its
        # kill signal (CTRL_C_EVENT there: _get_kill_signal in torch/distributed/elastic/
        # multiprocessing/api.py). Should neither land, the rank leaves on its own once the
        # failure marker exists, so a restart never waits on it.
        deadline = time.monotonic() + payload["timeout"]
        while time.monotonic() < deadline and not Path(MARKER_FILE).exists():
            time.sleep(0.1)
        time.sleep(MARKER_GRACE_SECONDS)
        return 1
    extra = {
        "restart_count": attempt,
        "max_restarts": int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "-1")),
        "master_addr_loopback": _is_numeric_loopback(os.environ.get("MASTER_ADDR", "")),
    }
    if not extra["master_addr_loopback"]:
        # Recorded and judged by the rules; this group's own sockets stay on loopback regardless.
        print(
            f"rendezvous address {os.environ.get('MASTER_ADDR')!r} is not numeric loopback",
            file=sys.stderr,
        )
    task_payload = {
        "shape": payload["shape"],
        "fixture": payload["fixture"],
        "fixture_args": payload["fixture_args"],
        "store": payload["store"],
        "extra": extra,
    }
    worker.import_frozen(pool.PRELOAD)
    worker.run(
        LOAD_AND_STEP.ref,
        rank,
        world_size,
        attempt_group(attempt),
        task_payload,
        payload["timeout"],
    )
    return 0


def attempt_group(attempt: int) -> str:
    """The worker group name of torchrun's attempt ``attempt`` (its results and logs)."""
    return f"elastic-attempt{attempt}"


def _is_numeric_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


if __name__ == "__main__":
    # The agent waits for its workers to end: skip finalizing torch (~1.8 s), as forked and
    # spawned workers do.
    worker.exit_without_teardown(main(sys.argv[1:]))

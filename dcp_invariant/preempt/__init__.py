"""``dcp-invariant preempt``: the user's own training command, killed at each point of its own
saves and relaunched on what the kill left (:mod:`.command`). Runs in the tool's process; the
job's processes carry only the interposer (interposer.c). Imports no torch."""

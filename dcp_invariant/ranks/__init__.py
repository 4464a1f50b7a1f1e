"""What runs inside a rank of a scenario's process group: the tasks a worker runs, and what they
use. Every module here imports torch.

The parent side (:mod:`dcp_invariant.suite`) never imports these: it names a task by string
(:class:`dcp_invariant.suite.scenarios.payloads.Task`, and the fork server's preload list in
:mod:`dcp_invariant.suite.pool`), so the runner itself never imports torch. ``in-job``, which
runs as a rank of the user's job, imports them when it runs one.
"""

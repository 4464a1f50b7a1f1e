"""Live test of a Hugging Face ``Trainer`` job checked as an app that saves itself
(``trainer_loops:trainer``): its own ``_save_checkpoint`` and ``train(resume_from_checkpoint=)``
resume exactly, in a fresh group and across torchrun's restart, with a ``restored late``
warning and no failure, because Trainer restores the RNG states inside its loop, just before the
first step (``_load_rng_state`` from ``_run_epoch`` in transformers/trainer.py).
"""

from __future__ import annotations

import fixture_runs
import pytest

from dcp_invariant import plan
from dcp_invariant.evidence import rules

pytestmark = pytest.mark.live

SPEC = "trainer_loops:trainer"
# Trainer's running loss for its logs (``_tr_loss``, zeroed by each ``train()`` call in
# ``_inner_training_loop`` and at each log in ``_maybe_log_save_evaluate``) is in no checkpoint
# file: after the resumed steps it sums fewer steps than the uninterrupted run's, and the tool
# names it as a tensor that differs at the end. Only the logged average reads it, so it is left
# out, as the tool's reason says to leave out a metric.
IGNORED = ("app.trainer._tr_loss",)


def test_a_trainer_job_resumes_exactly_and_is_warned_that_it_restores_its_rng_late() -> None:
    """The resumes at 1 (save mid-epoch: the RNG is restored once the first batch is fetched)
    and at 2 (save at the end of an epoch: restored before the next one starts), and the
    torchrun restart at 2, pass. Right after ``load`` only torch's generator differs from the
    save (nothing draws from Python's or NumPy's, which Trainer saves too): one warning a rank."""
    # Here, not at import: importing transformers takes seconds, which every collection of the
    # suite would pay.
    pytest.importorskip("transformers")
    names = ["resume_1", "resume_2", "elastic_restart_2_to_2"]
    world_sizes = (1, 2)
    reasons, observations = fixture_runs.run(SPEC, names, world_sizes, ignored_attrs=IGNORED)
    assert reasons == {name: [] for name in names}
    # The plan the probe leaves for an app that saves itself (with a state_dict() to compare):
    # the commit rules then ask for the app's files, not DCP's.
    the_plan = plan.fixture_plan(SPEC, world_sizes, shape=plan.own_shape(), ignored_attrs=IGNORED)
    failed, warned = rules.judge("resume_1", observations["resume_1"], run_plan=the_plan)
    assert failed == []
    assert warned == [
        "restored late: rank 0: right after the app's load(), state_dict() differs from what "
        "was saved in app.rng_state.cpu, yet every resumed step matches: the loaded state is "
        "applied later (at the first step); a checkpoint taken between the load and that step "
        "would save the fresh state and not resume, so apply it in the app's load() itself if "
        "the loop can save there"
    ]
    failed, warned = rules.judge("resume_2", observations["resume_2"], run_plan=the_plan)
    assert failed == []
    assert [w.split(": ")[:2] for w in warned] == [["restored late", f"rank {r}"] for r in (0, 1)]
    assert all("differs from what was saved in app.rng_state.cpu, yet" in w for w in warned)
    restart = "elastic_restart_2_to_2"
    failed, warned = rules.judge(restart, observations[restart], run_plan=the_plan)
    assert failed == []
    assert [w.split(": ")[:2] for w in warned] == [
        ["restored late", f"restarted rank {r}"] for r in (0, 1)
    ], warned
    assert all("differs from what was saved in rng_state, yet" in w for w in warned), warned

"""What a failed relaunch shows: the exception that ended it, not only a launcher's summary."""

from __future__ import annotations

from dcp_invariant.preempt.launch import Launch

TORCHRUN = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "train.py", line 9, in <module>',
    "[rank1]: RuntimeError: Missing key in checkpoint state_dict: dataloader.dp_rank_1.",
    *[f"torchrun summary line {n}" for n in range(20)],
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
]


def test_the_first_exception_named_is_the_cause() -> None:
    launch = Launch(1, TORCHRUN)
    assert launch.first_error == TORCHRUN[2]
    assert launch.first_error not in launch.tail  # so the report shows it before the tail


def test_output_without_an_exception_names_none() -> None:
    assert Launch(1, ["step 1 loss 0x1p-1", "Error in the config? no: exiting"]).first_error is None
    assert Launch(1, ["OSError: [Errno 22] Invalid argument"]).first_error == (
        "OSError: [Errno 22] Invalid argument"
    )

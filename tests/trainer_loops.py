"""A Hugging Face ``Trainer`` job for the live tests (``trainer_loops:trainer``), checked as an
app that saves itself: a correct job, which resumes exactly through Trainer's own checkpoints.

The app must take one optimizer step per ``step()``, while Trainer's loop is one call,
``train()``, that returns when training ends (``_inner_training_loop`` and ``_run_epoch`` in
transformers/trainer.py). Calling ``train()`` once per step would make every step a resume from
a checkpoint (a fresh ``TrainerState``, scheduler and data loader each call), hiding a resume
bug from the uninterrupted runs the resumes are held to. So ``train()`` runs once, in a thread
of its own, and a callback holds it at the events Trainer fires between its steps:
``on_train_begin`` (everything loaded but the RNG states), ``on_step_end`` (an optimizer step
taken) and ``on_save`` (a checkpoint written). Only one of the two threads runs at a time, so
the global RNGs, the process group and the model see one sequence of calls, as in a job.

- ``save(dir)`` asks Trainer to save as its own ``save_strategy`` does: at ``on_step_end`` it
  sets ``control.should_save``, and ``_maybe_log_save_evaluate`` calls ``_save_checkpoint``,
  which writes ``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``trainer_state.json``
  (rank 0) and ``rng_state.pth`` (``rng_state_<rank>.pth`` on every rank at world size > 1).
  Trainer names the directory ``<output_dir>/checkpoint-<global_step>``; the tool names its
  own, so that name is a link to it, made for the save and removed after.
- ``load(dir)`` starts ``train(resume_from_checkpoint=dir)``, which loads the weights
  (``_load_from_checkpoint``), the state (``_init_training_state``), the optimizer and scheduler
  (``_load_optimizer_and_scheduler``) and returns at ``on_train_begin``; the RNG states are
  restored later, by ``_load_rng_state`` in ``_run_epoch``, just before the first step (once
  its batch is fetched from the skipped-ahead loader, mid-epoch; before the loader starts, at
  an epoch's start). Right after ``load`` torch's generator is still the fresh one: the tool
  warns ``restored late``, which is how Trainer is. (Python's and NumPy's, which Trainer saves
  too, are drawn from by nothing here, so they are the saved ones already.)
- Trainer's running loss for its logs (``_tr_loss``) is in no checkpoint file: zeroed by each
  ``train()`` call (``_inner_training_loop``), it sums fewer steps after a resume, and the
  tool names it among the app's tensors that differ at the end. Only the logged average reads
  it, so the runs leave it out: ``--ignore-attr app.trainer._tr_loss``.

Trainer's own Accelerator runs on the tool's Gloo group as the Accelerate adapter's does
(dcp_invariant/adapters/accelerate.py): the launcher's variables set from the group where unset,
Accelerate's singletons reset before each build. It is then MULTI_CPU at every world size, and
wraps the model in DDP.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from dcp_invariant.adapters import accelerate as accelerate_adapter

SEED = 1234
VOCAB = 64
SEQ_LEN = 16  # tokens a sample feeds the model
SAMPLES = 24  # 6 batches of 4 an epoch at world size 1, 3 of 2x4 at 2
BATCH = 4  # per device
# The schedule's length: longer than any run the tool makes (at most 1000 steps before the save
# and 1000 after it, plan.MAX_STEPS), so no step of theirs ends the training.
MAX_STEPS = 2048
WARMUP = 2  # steps: the learning rate changes at each of the first ones

# The app built last in this process, whose thread is ended when the next is built.
_last: list[TrainerApp] = []


class _Stop(Exception):
    """Raised inside the Trainer's thread to end its ``train()`` without running further."""


class _KeepsLoss(Trainer):  # type: ignore[misc]  # transformers is Any to mypy (pyproject.toml)
    """Trainer, keeping the loss its ``training_step`` returns: its loop logs only an average
    over ``logging_steps`` steps and the ranks (``_maybe_log_save_evaluate``)."""

    last_loss: torch.Tensor | None = None

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss: torch.Tensor = super().training_step(*args, **kwargs)
        self.last_loss = loss
        return loss


class _Pauses(TrainerCallback):  # type: ignore[misc]  # transformers is Any to mypy
    """Holds the Trainer's thread at the events between steps, until the app says go on."""

    def __init__(self, to_app: queue.Queue[tuple[str, BaseException | None]]) -> None:
        self.to_app = to_app
        self.to_trainer: queue.Queue[str] = queue.Queue()

    def _pause(self, event: str, control: Any) -> Any:
        self.to_app.put((event, None))
        command = self.to_trainer.get()
        if command == "stop":
            raise _Stop
        if command == "save":
            # What DefaultFlowCallback.on_step_end sets at save_steps (trainer_callback.py):
            # _maybe_log_save_evaluate then calls _save_checkpoint and fires on_save.
            control.should_save = True
        return control

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._pause("begun", control)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._pause("stepped", control)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._pause("saved", control)


class TrainerApp:
    """A ``Trainer`` job as an app that saves itself (module docstring)."""

    def __init__(self, trainer: _KeepsLoss, output_dir: str) -> None:
        self.trainer = trainer
        self._output_dir = output_dir
        self._to_app: queue.Queue[tuple[str, BaseException | None]] = queue.Queue()
        self._pauses = _Pauses(self._to_app)
        trainer.add_callback(self._pauses)
        self._thread: threading.Thread | None = None
        self._at = ""  # the event the Trainer's thread is held at

    def step(self) -> float:
        self._start(None)
        self._go("go", "stepped")
        assert self.trainer.last_loss is not None
        return float(self.trainer.last_loss)

    def save(self, checkpoint_dir: str) -> None:
        self._start(None)
        if self._at != "stepped":
            raise RuntimeError(f"save() with the Trainer at {self._at}: it saves after a step")
        # The folder _save_checkpoint writes into, a link to the tool's directory (given
        # relative to the scenario's workspace): the files land there, as regular files.
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.trainer.state.global_step}"
        link = Path(self._output_dir, folder)
        link.symlink_to(Path(checkpoint_dir).absolute(), target_is_directory=True)
        try:
            self._go("save", "saved")
        finally:
            link.unlink()

    def load(self, checkpoint_dir: str) -> None:
        if self._thread is not None:
            raise RuntimeError("load() after the Trainer started: load a fresh app")
        self._start(str(Path(checkpoint_dir).absolute()))

    def state_dict(self) -> dict[str, Any]:
        """What the checkpoint's files hold, by file: the model, optimizer and scheduler as
        Trainer saves them, the trainer state's counters, and this rank's RNG states (what
        ``_save_rng_state`` writes on CPU)."""
        self._start(None)  # the optimizer and scheduler are made in train()
        trainer = self.trainer
        python, numpy, cpu = accelerate_adapter.global_rng_states()
        return {
            "model": trainer.model.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.lr_scheduler.state_dict(),
            "trainer_state": {
                "global_step": int(trainer.state.global_step),
                "epoch": float(trainer.state.epoch or 0.0),
            },
            "rng_state": {"python": python, "numpy": numpy, "cpu": cpu},
        }

    def stop(self) -> None:
        """End the Trainer's thread where it is held: ``train()`` raises, nothing more runs."""
        if self._thread is not None and self._thread.is_alive() and self._at:
            self._pauses.to_trainer.put("stop")
            self._thread.join()
        shutil.rmtree(self._output_dir, ignore_errors=True)

    def _start(self, resume_from_checkpoint: str | None) -> None:
        if self._thread is not None:
            return

        def train() -> None:
            try:
                self.trainer.train(resume_from_checkpoint=resume_from_checkpoint)
            except _Stop:
                return
            except BaseException as exc:  # handed to the tool's thread, which raises it
                self._to_app.put(("raised", exc))
                return
            self._to_app.put(("ended", None))

        # A daemon: the tool's worker exits without waiting for a Trainer held between steps.
        self._thread = threading.Thread(target=train, name="trainer-train", daemon=True)
        self._thread.start()
        self._wait("begun")

    def _go(self, command: str, until: str) -> None:
        self._pauses.to_trainer.put(command)
        self._wait(until)

    def _wait(self, event: str) -> None:
        got, exc = self._to_app.get()
        self._at = got if exc is None and got != "ended" else ""
        if exc is not None:
            raise exc
        if got != event:
            raise RuntimeError(f"the Trainer reached {got} where the app waited for {event}")


def build_model() -> LlamaForCausalLM:
    """A tiny Llama with attention dropout (so each step draws from torch's global RNG, which
    Trainer saves and restores), the same weights in every process."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
        attention_dropout=0.1,
    )
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config)


def dataset() -> list[dict[str, torch.Tensor]]:
    """SAMPLES rows of random tokens, from a generator of their own; the model shifts the labels
    itself."""
    rows = torch.randint(
        0, VOCAB, (SAMPLES, SEQ_LEN), generator=torch.Generator().manual_seed(SEED + 1)
    )
    return [{"input_ids": row, "labels": row} for row in rows]


def trainer(rank: int, world_size: int) -> TrainerApp:
    """A correct Trainer job: tiny Llama with dropout, AdamW, a warmup-cosine schedule, data
    shuffled by Trainer's sampler and sharded by Accelerate."""
    while _last:  # a worker builds an app again after the probe's
        _last.pop().stop()
    output_dir = tempfile.mkdtemp(prefix=f"trainer-loops-rank{rank}-")

    def build() -> _KeepsLoss:
        args = TrainingArguments(
            output_dir=output_dir,
            use_cpu=True,
            report_to=[],
            disable_tqdm=True,
            seed=SEED,
            per_device_train_batch_size=BATCH,
            max_steps=MAX_STEPS,
            learning_rate=0.01,
            lr_scheduler_type="cosine",
            warmup_steps=WARMUP,
            max_grad_norm=1.0,
            save_strategy="no",  # the tool asks for each save (TrainerApp.save)
            dataloader_num_workers=0,
            # Every parameter has a gradient at every step: DDP's search for unused ones would
            # only warn about finding none, in every worker's log.
            ddp_find_unused_parameters=False,
        )
        return _KeepsLoss(model=build_model(), args=args, train_dataset=dataset())

    app = TrainerApp(_on_the_tools_group(rank, world_size, build), output_dir)
    _last.append(app)
    return app


def _on_the_tools_group(rank: int, world_size: int, build: Callable[[], _KeepsLoss]) -> _KeepsLoss:
    """``build()`` with Accelerate's state fresh and the launcher's variables set from the
    tool's group where unset: Trainer's ``TrainingArguments._setup_devices``
    (transformers/training_args.py) makes a ``PartialState(cpu=True)``, which reads them and
    reuses the group that is up (``accelerate_adapter.on_the_tools_group``)."""
    if not dist.is_initialized():
        raise RuntimeError("trainer_loops:trainer runs on the tool's process group: run it there")
    with accelerate_adapter.on_the_tools_group():
        built = build()
    counted = (built.args.world_size, built.args.process_index)
    if counted != (world_size, rank):
        raise RuntimeError(
            f"Trainer counts {counted[0]} processes and this one as rank {counted[1]}, the "
            f"tool's group {world_size} and rank {rank}"
        )
    return built

"""A Hugging Face Trainer job as its users write one: ``python hf_trainer.py RUN_DIR``, or at
two processes ``python -m torch.distributed.run --standalone --nproc-per-node 2 --local-addr
127.0.0.1 hf_trainer.py RUN_DIR`` (CPU, gloo: Trainer sets up the process group itself).

It resumes from ``get_last_checkpoint(RUN_DIR)``, which returns the newest ``checkpoint-N``
whatever it holds (transformers/trainer_utils.py): a kill inside ``_save_checkpoint`` leaves one
without its ``trainer_state.json`` (written last) or with its weights cut short, and every
relaunch then fails on it (huggingface/transformers#35782). At two processes each one writes
its own ``rng_state_{rank}.pth`` there, and ``Trainer._load_rng_state`` skips a missing one with
a message at INFO level only: the attention dropout below then draws other masks after the
resume. A tiny Llama built from a config: no hub download. Each step prints its exact loss (at
two processes, each rank its own, as ``rank R step N loss X``); the final weights go to
``RUN_DIR/final``, from rank 0.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

run_dir = sys.argv[1]
torch.set_num_threads(1)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=32,
    # Drawn from each process's torch generator, the state rng_state_{rank}.pth carries.
    attention_dropout=0.25,
    attn_implementation="eager",
)
model = LlamaForCausalLM(config)
data = torch.Generator().manual_seed(1)
samples = [torch.randint(0, 64, (16,), generator=data) for _ in range(32)]
dataset = [{"input_ids": s, "labels": s} for s in samples]
two_or_more = int(os.environ.get("WORLD_SIZE", "1")) > 1
tag = f"rank {os.environ['RANK']} " if two_or_more else ""


class PrintsSteps(Trainer):  # type: ignore[misc]  # transformers is Any to mypy
    """Prints each step's own loss, exactly: Trainer's logs average and round it."""

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss: torch.Tensor = super().training_step(*args, **kwargs)
        # One write per line: the ranks share torchrun's stdout, and print() writes its end apart.
        sys.stdout.write(f"{tag}step {self.state.global_step + 1} loss {loss.item().hex()}\n")
        sys.stdout.flush()
        return loss


arguments = TrainingArguments(
    output_dir=run_dir,
    max_steps=4,
    save_steps=2,
    per_device_train_batch_size=4,
    learning_rate=1e-3,
    logging_steps=100,
    report_to=[],
    use_cpu=True,
    ddp_backend="gloo" if two_or_more else None,
    seed=0,
    data_seed=0,
    dataloader_num_workers=0,
    disable_tqdm=True,
)
trainer = PrintsSteps(model=model, args=arguments, train_dataset=dataset)
last = get_last_checkpoint(run_dir) if os.path.isdir(run_dir) else None
trainer.train(resume_from_checkpoint=last)
trainer.save_model(os.path.join(run_dir, "final"))
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
    # Not the interpreter's own exit: a gloo worker thread (ProcessGroupGloo::runLoop) can free
    # Trainer's last all_gather (store_flos), whose tensors Python owns, while the interpreter
    # finalizes; it takes the GIL, is made to exit, and std::terminate aborts the rank (SIGABRT,
    # about one launch in ten here; a barrier first only moves it into the barrier's work).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

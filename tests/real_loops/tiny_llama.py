"""What the real-code loops share: a tiny ``transformers`` Llama with random weights, the synthetic
token data it trains on, and the warmup-cosine schedule ``transformers`` gives a Trainer.

Nothing is downloaded: the model is built from a ``LlamaConfig`` (hidden 32, 2 layers, 2 heads,
vocabulary 64) and seeded, so every rank and every fresh process builds the same weights.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup

SEED = 1234
VOCAB = 64
SEQ_LEN = 16  # tokens a sample feeds the model; a sample holds one more, for the labels
LR = 0.01
WARMUP = 2
TRAINING_STEPS = 12
MAX_GRAD_NORM = 1.0


def build_model() -> LlamaForCausalLM:
    """The same float32 weights on every rank: drawn from the global RNG right after seeding it."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN + 1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config)


def build_optimizer(
    params: object,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and the linear-warmup cosine schedule of ``transformers`` (a LambdaLR)."""
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.01, foreach=True)
    schedule = get_cosine_schedule_with_warmup(optimizer, WARMUP, TRAINING_STEPS)
    return optimizer, schedule


def token_rows(count: int, seed: int = SEED + 1) -> torch.Tensor:
    """``count`` samples of SEQ_LEN + 1 random tokens, from a generator of their own."""
    return torch.randint(
        0, VOCAB, (count, SEQ_LEN + 1), generator=torch.Generator().manual_seed(seed)
    )


def documents(count: int, seed: int = SEED + 2) -> list[list[int]]:
    """``count`` documents of 3 to 20 tokens (1..VOCAB-1), each ended by EOS (token 0)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 21, (count,), generator=generator).tolist()
    return [
        [*torch.randint(1, VOCAB, (length,), generator=generator).tolist(), 0] for length in lengths
    ]


def causal_lm_loss(model: LlamaForCausalLM, tokens: torch.Tensor) -> torch.Tensor:
    """The mean next-token loss over ``tokens`` (rows of SEQ_LEN + 1), as ``transformers`` computes
    it: the labels are the inputs, shifted inside the model."""
    return model(input_ids=tokens, labels=tokens).loss

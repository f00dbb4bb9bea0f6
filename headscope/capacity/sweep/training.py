"""Train one sweep configuration from scratch through the shared training loop, then score it."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...eval.lm import target_nll
from ...train import Trainer
from .config import SweepConfig
from .corpora import Corpus, load_corpus
from .model import (
    KV_DTYPE,
    TinyLM,
    build_model,
    kv_bytes_per_token,
    model_flops_per_token,
)
from .tasks import PAIR_VOCAB, batch_fn, eval_batches, synthetic_fingerprint

log = logging.getLogger(__name__)

__all__ = ["evaluate", "train_config", "trainer_for"]

BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0
MIN_LR_RATIO = 0.1  # cosine decay ends at lr / 10
RECENT = 20  # train_loss is the mean of this many last steps
# the loss curve in runs/<key>.json keeps every 10th step and the last
CURVE_EVERY = 10


@torch.no_grad()
def evaluate(model: TinyLM, cfg: SweepConfig, corpus: Corpus | None) -> dict[str, float]:
    """Held-out loss (nats per target), perplexity, bits per token, word perplexity (PTB) and accuracy."""
    model.eval()
    nll, n, correct = 0.0, 0, 0
    for x, y in eval_batches(cfg.task, cfg.batch, cfg.seq, cfg.seed, cfg.eval_tokens, corpus):
        batch_nll, batch_n, batch_correct = target_nll(model(x), y)
        nll += batch_nll.item()
        correct += batch_correct
        n += batch_n
    loss = nll / n
    out = {
        "val_loss": loss,
        "val_ppl": math.exp(loss),
        "val_bits_per_token": loss / math.log(2),
        "val_acc": correct / n,
    }
    out["val_word_ppl"] = math.exp(loss * corpus.tokens_per_word) if corpus is not None else float("nan")
    return out


def trainer_for(cfg: SweepConfig, model: TinyLM) -> Trainer:
    """The sweep's optimizer settings: AdamW (0.9, 0.95), weight decay on matrices only, clip 1.0,
    linear warm-up then cosine to lr/10, batches from a generator seeded by `cfg.seed`."""
    # Weight decay on matrices only; the Trainer clips gradients in the model's own parameter order.
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    return Trainer(model, groups, lr=cfg.lr, steps=cfg.steps, weight_decay=cfg.weight_decay, betas=BETAS,
                   grad_clip=GRAD_CLIP, warmup=cfg.warmup, schedule="cosine", min_lr_ratio=MIN_LR_RATIO,
                   seed=cfg.seed, desc=f"{cfg.task} {cfg.label}")


def train_config(
    cfg: SweepConfig, corpus: Corpus | None = None, progress: bool = True,
    on_step: Callable[[SweepConfig, int, float], None] | None = None, return_model: bool = False,
) -> dict[str, object] | tuple[dict[str, object], TinyLM]:
    """Train one configuration from scratch and evaluate it; returns its result row (sweep.csv's columns,
    plus the loss curve). With `return_model`, returns (row, the trained model in eval mode)."""
    if cfg.task == "ptb" and corpus is None:
        corpus = load_corpus("ptb", cfg.tokenization)
    t_wall = time.perf_counter()
    model = build_model(cfg, corpus.vocab_size if corpus is not None else PAIR_VOCAB)
    trainer = trainer_for(cfg, model)

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)

    losses = trainer.run(cfg.steps, batch_fn(cfg.task, cfg.batch, cfg.seq, corpus), loss_fn, progress=progress,
                         on_step=None if on_step is None else (lambda step, loss: on_step(cfg, step, loss)))
    metrics = evaluate(model, cfg, corpus)
    params = sum(p.numel() for p in model.parameters())
    embedding = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    if model.head.weight is not model.tok_emb.weight:
        embedding += model.head.weight.numel()
    flops = model_flops_per_token(model, cfg.seq)
    tokens = cfg.steps * cfg.batch * cfg.seq  # tokens read (xor: one target per sequence, at the query)
    recent = losses[-RECENT:]
    row: dict[str, object] = {
        "task": cfg.task, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.kv_heads, "d_head": cfg.head_dim, "layout": model.blocks[0].attn.layout, "steps": cfg.steps,
        "seq": cfg.seq, "batch": cfg.batch, "lr": cfg.lr, "init_std": cfg.init_std, "seed": cfg.seed,
        "train_tokens": tokens, "params": params, "params_non_embedding": params - embedding,
        "flops_per_token": flops, "train_flops_per_token": 3 * flops,
        "kv_bytes_per_token": kv_bytes_per_token(cfg), "kv_dtype": KV_DTYPE,
        **metrics, "train_loss": sum(recent) / len(recent), "tokens_per_s": tokens / trainer.train_s,
        # CPU seconds: unlike wall time, not inflated by other jobs on the machine.
        "tokens_per_cpu_s": tokens / trainer.cpu_s, "train_s": trainer.train_s, "train_cpu_s": trainer.cpu_s,
        "wall_s": time.perf_counter() - t_wall, "threads": torch.get_num_threads(),
        # [step, training loss] every 10 steps and the last; in the JSON record, not in the CSV.
        "loss_curve": [[s, v] for s, v in enumerate(losses) if s % CURVE_EVERY == 0 or s == cfg.steps - 1],
        "data": corpus.fingerprint[:16] if corpus is not None else synthetic_fingerprint(cfg.task),
    }
    log.info("%s: val_loss %.4f, %.0f tokens/s", cfg.label, row["val_loss"], row["tokens_per_s"])
    return (row, model.eval()) if return_model else row

"""Head-count sweeps: train small decoder-only models from scratch at fixed width, vary the heads.

Everything but the attention layout is held fixed (d_model, depth, MLP, optimizer, learning-rate
schedule, training tokens, the exact batches seen, the seed), and each configuration is trained with
`headscope.reference.MultiHeadAttention` (MHA, GQA or MQA by `n_kv_heads`). Two tasks:

- ``ptb``: next-byte language modelling on the Penn Treebank (`headscope.corpora`), validation
  loss / bits per byte / perplexity on PTB valid.
- ``xor``: a one-layer attention-only model reads a string of random bits and, at a final query
  token, must output the XOR of the bits at two fixed positions. One head provably cannot: its
  logit difference times its softmax normaliser is a sum of one term per position, so in every
  block of four inputs that differ only in the two bits it gets one wrong; accuracy over all
  inputs is at most 75 %, for any weights and any width (proof in docs/sweep.md). Two heads can
  (an explicit construction is tested), and trained ones reach 100 %. Scored on every input.
- ``pair``: the same kind of model must output the ordered pair ``(x[i-1], x[i-7])`` of the
  tokens at two offsets. The folklore says one head cannot mix two sources; it can (unequal
  weights keep them apart), and a trained single head learns it fully (docs/sweep.md).

Resumable: each finished configuration is written at once to ``runs/<key>.json`` and ``sweep.csv``
is rewritten (atomically) after it; a rerun skips every configuration whose key (a hash of the full
configuration, the seed, the data fingerprint and the sweep code version) already has a result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .corpora import Corpus, eval_windows, load_corpus, random_windows
from .errors import HeadscopeError, did_you_mean
from .io import atomic_write_bytes, atomic_write_text
from .kv import kv_bytes_per_token as kv_calc
from .reference import MultiHeadAttention

log = logging.getLogger(__name__)

__all__ = [
    "PAIR_OFFSETS", "PAIR_VOCAB", "SWEEP_VERSION", "SYNTHETIC_TASKS", "TASKS", "XOR_POSITIONS", "XOR_QUERY",
    "SweepConfig", "TinyLM", "build_model", "config_key", "kv_bytes_per_token", "mean_by_heads", "model_flops_per_token",
    "pair_batch", "plan_sweep", "plot_sweep", "run_sweep", "train_config", "xor_all_inputs", "xor_batch",
]

# Bump when training or evaluation changes in a way that changes results: old results then no longer match.
SWEEP_VERSION = 1
TASKS = ("ptb", "xor", "pair")
SYNTHETIC_TASKS = ("xor", "pair")  # scored by accuracy, trained on generated data with attention-only models
PAIR_VOCAB = 16  # input tokens of the pair task; targets are the 16*16 ordered pairs
PAIR_OFFSETS = (1, 7)  # target at i: the pair (x[i-1], x[i-7]) as one class x[i-1] + 16 * x[i-7]
XOR_POSITIONS = (3, 11)  # the xor task's target is bit[3] XOR bit[11], read at the final query token
XOR_QUERY = 2  # token id of the query token "=" (the bits are tokens 0 and 1)
XOR_EXHAUSTIVE_BITS = 20  # up to this many bits, the xor task is scored on every possible input
KV_DTYPE = "bf16"  # KV bytes are reported for a bf16 cache, the usual inference dtype
CSV_COLUMNS = [
    "task", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_head", "layout", "steps", "seq", "batch", "lr",
    "init_std", "seed", "train_tokens", "params", "params_non_embedding", "flops_per_token", "train_flops_per_token",
    "kv_bytes_per_token", "kv_dtype", "val_loss", "val_ppl", "val_bits_per_token", "val_word_ppl", "val_acc",
    "train_loss", "tokens_per_s", "tokens_per_cpu_s", "train_s", "train_cpu_s", "wall_s", "threads", "data", "key",
]


@dataclass(frozen=True)
class SweepConfig:
    """One configuration of a sweep; everything that changes the trained model is a field (and in the key)."""

    task: str
    d_model: int
    n_heads: int
    n_layers: int
    steps: int
    seq: int
    batch: int
    seed: int = 0
    n_kv_heads: int | None = None  # None: = n_heads (MHA)
    d_head: int | None = None  # None: d_model // n_heads
    lr: float = 3e-3
    warmup: float = 0.05  # fraction of steps with linear warm-up, then cosine decay to lr/10
    weight_decay: float = 0.01
    d_ff_mult: int = 4
    eval_tokens: int = 65536
    tokenization: str = "byte"
    init_std: float | None = None  # None: GPT-2 init (std 0.02, residual projections scaled down)

    @property
    def kv_heads(self) -> int:
        """Resolved number of KV heads."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        """Resolved d_head."""
        return self.d_model // self.n_heads if self.d_head is None else self.d_head

    @property
    def label(self) -> str:
        """Short text name, e.g. 'h=8 kv=8 d_head=32'."""
        return f"h={self.n_heads} kv={self.kv_heads} d_head={self.head_dim}"


def config_key(cfg: SweepConfig, data_fingerprint: str) -> str:
    """Stable 16-hex-digit key of a configuration on some data: the name of its result file."""
    config = asdict(cfg)
    if config["init_std"] is None:
        del config["init_std"]  # added later: configurations without it keep the keys they had
    payload = json.dumps({"config": config, "data": data_fingerprint, "version": SWEEP_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def plan_sweep(
    task: str, d_model: int, heads: Sequence[int], n_layers: int, steps: int, seq: int, batch: int, seed: int = 0,
    kv_heads: Sequence[int] | None = None, d_heads: Sequence[int] | None = None, **extra: object,
) -> tuple[list[SweepConfig], list[str]]:
    """Expand heads x kv_heads x d_heads into configurations; return (valid configs, messages for skipped ones).

    Without `d_heads`, d_head = d_model / h, so an `h` that does not divide d_model is skipped. A KV-head
    count that does not divide h (or exceeds it) is skipped for that h. Raises when nothing valid remains.
    """
    if task not in TASKS:
        raise HeadscopeError(f"unknown task {task!r}{did_you_mean(task, TASKS)}; choose one of {', '.join(TASKS)}")
    for name, v in (("d_model", d_model), ("layers", n_layers), ("steps", steps), ("seq", seq), ("batch", batch)):
        if v < 1:
            raise HeadscopeError(f"--{name} must be positive; got {v}")
    if task == "pair" and seq <= max(PAIR_OFFSETS):
        raise HeadscopeError(f"the pair task reads offsets {PAIR_OFFSETS}, so --seq must exceed "
                             f"{max(PAIR_OFFSETS)}; got {seq}")
    if task == "xor" and seq <= max(XOR_POSITIONS) + 1:
        raise HeadscopeError(f"the xor task reads the bits at positions {XOR_POSITIONS} and ends with a query token, "
                             f"so --seq (bits + 1) must be at least {max(XOR_POSITIONS) + 2}; got {seq}")
    if not heads or any(h < 1 for h in heads):
        raise HeadscopeError(f"--heads must be positive integers; got {list(heads)}")
    configs: list[SweepConfig] = []
    skipped: list[str] = []
    for h in heads:
        if not d_heads and d_model % h:
            skipped.append(f"h={h}: d_model={d_model} is not divisible by {h} heads, so d_head = d_model/h is "
                           f"not an integer (pass --d-head to set it independently)")
            continue
        for kv in (kv_heads or [None]):
            if kv is not None and (kv < 1 or kv > h or h % kv):
                skipped.append(f"h={h} kv={kv}: the KV-head count must divide the {h} query heads "
                               f"(choose from {[g for g in range(1, h + 1) if h % g == 0]})")
                continue
            for dh in (d_heads or [None]):
                if dh is not None and dh < 1:
                    raise HeadscopeError(f"--d-head must be positive; got {dh}")
                # Store the defaults as None, so "--kv-heads 8" at h=8 (MHA) or "--d-head 32" at d_model/h = 32
                # is the same configuration, with the same key, as leaving them out: results are reused.
                kv_norm = None if kv == h else kv
                dh_norm = None if dh is not None and dh * h == d_model else dh
                cfg = SweepConfig(task=task, d_model=d_model, n_heads=h, n_layers=n_layers, steps=steps, seq=seq,
                                  batch=batch, seed=seed, n_kv_heads=kv_norm, d_head=dh_norm, **extra)  # type: ignore[arg-type]
                if cfg not in configs:
                    configs.append(cfg)
    if not configs:
        raise HeadscopeError("no valid configuration to train:\n  " + "\n  ".join(skipped) +
                             f"\nhead counts dividing d_model={d_model}: "
                             f"{[h for h in range(1, d_model + 1) if d_model % h == 0 and h <= 64]}")
    return configs, skipped


# ----------------------------------------------------------------------------------------------- model


class Block(nn.Module):
    """Pre-LayerNorm transformer block (attention + optional MLP); without `norm`, no LayerNorm at all."""

    def __init__(self, cfg: SweepConfig, mlp: bool, norm: bool) -> None:
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d) if norm else nn.Identity()
        self.attn = MultiHeadAttention(d, cfg.n_heads, n_kv_heads=cfg.kv_heads, d_head=cfg.head_dim, bias=False,
                                       rope=False, causal=True)
        self.mlp = None
        if mlp:
            self.ln2 = nn.LayerNorm(d) if norm else nn.Identity()
            self.mlp = nn.Sequential(nn.Linear(d, cfg.d_ff_mult * d), nn.GELU(), nn.Linear(cfg.d_ff_mult * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # [batch, pos, d_model]
        if self.mlp is not None:
            x = x + self.mlp(self.ln2(x))
        return x


class TinyLM(nn.Module):
    """Decoder-only model: token + learned position embeddings, `n_layers` blocks, a linear read-out.

    `attn_only=True` builds the synthetic tasks' model: no MLP, no LayerNorm, so every head's output is
    exactly a softmax-weighted sum of linear maps of the embeddings (what the one-head arguments use).
    `cfg.init_std` set: every weight matrix is drawn N(0, init_std) instead of GPT-2's init.
    """

    def __init__(self, cfg: SweepConfig, vocab: int, n_out: int, attn_only: bool = False) -> None:
        super().__init__()
        d = cfg.d_model
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(cfg.seq, d)
        self.blocks = nn.ModuleList(Block(cfg, mlp=not attn_only, norm=not attn_only) for _ in range(cfg.n_layers))
        self.ln_f = nn.Identity() if attn_only else nn.LayerNorm(d)
        self.head = nn.Linear(d, n_out, bias=False)
        if n_out == vocab:
            self.head.weight = self.tok_emb.weight  # tied, as in GPT-2
        # GPT-2 init: N(0, 0.02), residual output projections scaled down by sqrt(2 * n_layers).
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(("o_proj.weight", "mlp.2.weight")) else 0.02
                if cfg.init_std is not None:
                    std = cfg.init_std
                nn.init.normal_(p, 0.0, std)
            elif "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [batch, pos, n_out] for `ids` [batch, pos]."""
        x = self.tok_emb(ids) + self.pos_emb.weight[: ids.shape[1]]  # [batch, pos, d_model]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(cfg: SweepConfig, vocab: int) -> TinyLM:
    """The model a configuration trains (seeded by `cfg.seed`): an LM for ptb, attention-only for xor and pair."""
    torch.manual_seed(cfg.seed)
    if cfg.task == "pair":
        return TinyLM(cfg, PAIR_VOCAB, PAIR_VOCAB ** len(PAIR_OFFSETS), attn_only=True)
    if cfg.task == "xor":
        return TinyLM(cfg, 3, 2, attn_only=True)  # tokens 0, 1 and the query "="; classes 0 and 1
    return TinyLM(cfg, vocab, vocab)


def model_flops_per_token(model: TinyLM, seq: int) -> int:
    """Forward FLOPs per token: 2 per multiply-accumulate of every matmul (projections, attention, MLP, read-out).

    Attention matmuls count the full seq x seq score matrix (as `MultiHeadAttention.flops` does: the
    module computes it, then masks). Not counted: embeddings lookups, LayerNorm, softmax, GELU, biases.
    """
    total = 0
    for block in model.blocks:
        total += block.attn.flops(seq, batch=1) // seq
        if block.mlp is not None:
            total += 2 * sum(m.weight.numel() for m in block.mlp if isinstance(m, nn.Linear))
    return total + 2 * model.head.weight.numel()


def kv_bytes_per_token(cfg: SweepConfig, dtype: str = KV_DTYPE) -> int:
    """KV-cache bytes per token of a configuration's whole model, from the `headscope.kv` calculator."""
    return kv_calc({"num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
                    "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_size": cfg.d_model}, dtype)


# ------------------------------------------------------------------------------------------------ data


def synthetic_fingerprint(task: str) -> str:
    """Names a synthetic task's data (vocabulary, offsets, positions), so results of another variant are not reused."""
    if task == "xor":
        return f"xor-p{','.join(map(str, XOR_POSITIONS))}-q{XOR_QUERY}"
    return f"pair-v{PAIR_VOCAB}-o{','.join(map(str, PAIR_OFFSETS))}"


def xor_batch(batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` strings of seq-1 uniform random bits then the query token; target bit[p] XOR bit[q] at the query.

    x [batch, seq] (tokens 0/1, last one XOR_QUERY); y [batch, seq], -100 (no target) except the last column.
    """
    x = torch.randint(0, 2, (batch, seq), generator=generator)
    return _xor_targets(x)


def xor_all_inputs(seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every input of the xor task with seq-1 bits (2**(seq-1) rows, in binary counting order) and its targets."""
    bits = seq - 1
    if bits > XOR_EXHAUSTIVE_BITS:
        raise HeadscopeError(f"2**{bits} inputs are too many to enumerate (at most 2**{XOR_EXHAUSTIVE_BITS})")
    codes = torch.arange(2 ** bits).unsqueeze(1)  # [2**bits, 1]
    x = torch.zeros(2 ** bits, seq, dtype=torch.long)
    x[:, :bits] = (codes >> torch.arange(bits)) & 1  # bit j of the row number at position j
    return _xor_targets(x)


def _xor_targets(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x[:, -1] = XOR_QUERY
    y = torch.full_like(x, -100)
    p, q = XOR_POSITIONS
    y[:, -1] = x[:, p] ^ x[:, q]
    return x, y


def pair_batch(batch: int, seq: int, generator: torch.Generator, vocab: int | None = None,
                    offsets: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random tokens x [batch, seq] and targets y = sum_j x[i - offsets[j]] * vocab**j (the ordered tuple, one class).

    Positions i < max(offsets) have no target (-100, ignored by the loss and the accuracy).
    """
    vocab = PAIR_VOCAB if vocab is None else vocab
    offsets = PAIR_OFFSETS if offsets is None else offsets
    x = torch.randint(0, vocab, (batch, seq), generator=generator)
    y = torch.full((batch, seq), -100, dtype=torch.long)
    start = max(offsets)
    code = torch.zeros(batch, seq - start, dtype=torch.long)
    for j, o in enumerate(offsets):
        code += x[:, start - o: seq - o] * vocab ** j
    y[:, start:] = code
    return x, y


# -------------------------------------------------------------------------------------------- training


def _lr_at(cfg: SweepConfig, step: int) -> float:
    warm = max(1, int(cfg.warmup * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def _evaluate(model: TinyLM, cfg: SweepConfig, corpus: Corpus | None) -> dict[str, float]:
    model.eval()
    nll, n, correct = 0.0, 0, 0
    if cfg.task == "xor" and cfg.seq - 1 <= XOR_EXHAUSTIVE_BITS:
        # Every possible input once: the accuracy is exact, so the one-head bound (75 %) can be checked as is.
        x_all, y_all = xor_all_inputs(cfg.seq)
        chunks = list(zip(x_all.split(4096), y_all.split(4096)))
    elif cfg.task == "xor":
        g = torch.Generator().manual_seed(10_000 + cfg.seed)
        chunks = [xor_batch(min(4096, cfg.eval_tokens), cfg.seq, g)
                  for _ in range(max(1, cfg.eval_tokens // 4096))]
    elif cfg.task == "pair":
        # Held-out sequences from a generator the training never uses.
        g = torch.Generator().manual_seed(10_000 + cfg.seed)
        n_batches = max(1, cfg.eval_tokens // (cfg.batch * cfg.seq))
        chunks = [pair_batch(cfg.batch, cfg.seq, g) for _ in range(n_batches)]
    else:
        assert corpus is not None
        xs, ys = eval_windows(corpus.valid, cfg.seq, cfg.eval_tokens)
        chunks = list(zip(xs.split(256), ys.split(256)))
    for x, y in chunks:
        logits = model(x)
        mask = y != -100
        nll += F.cross_entropy(logits[mask], y[mask], reduction="sum").item()
        correct += (logits[mask].argmax(-1) == y[mask]).sum().item()
        n += int(mask.sum())
    model.train()
    loss = nll / n
    out = {"val_loss": loss, "val_ppl": math.exp(loss), "val_bits_per_token": loss / math.log(2), "val_acc": correct / n}
    out["val_word_ppl"] = math.exp(loss * corpus.tokens_per_word) if corpus is not None else float("nan")
    return out


def train_config(
    cfg: SweepConfig, corpus: Corpus | None = None, progress: bool = True,
    on_step: Callable[[SweepConfig, int, float], None] | None = None, return_model: bool = False,
) -> dict[str, object] | tuple[dict[str, object], TinyLM]:
    """Train one configuration from scratch and evaluate it; returns its result row (see CSV_COLUMNS).

    With `return_model`, returns (row, the trained model in eval mode).
    """
    if cfg.task == "ptb" and corpus is None:
        corpus = load_corpus("ptb", cfg.tokenization)
    t_wall = time.perf_counter()
    model = build_model(cfg, corpus.vocab_size if corpus is not None else PAIR_VOCAB)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    # The batches depend only on the seed, so every head count sees exactly the same training data.
    g = torch.Generator().manual_seed(cfg.seed)
    steps_iter: Iterable[int] = range(cfg.steps)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(steps_iter, desc=f"{cfg.task} {cfg.label}", unit="step", leave=True, dynamic_ncols=True)
        steps_iter = bar
    model.train()
    train_s, cpu_s, recent, curve = 0.0, 0.0, [], []
    for step in steps_iter:
        if cfg.task == "xor":
            x, y = xor_batch(cfg.batch, cfg.seq, g)
        elif cfg.task == "pair":
            x, y = pair_batch(cfg.batch, cfg.seq, g)
        else:
            x, y = random_windows(corpus.train, cfg.seq, cfg.batch, g)
        t0, c0 = time.perf_counter(), time.process_time()
        for group in opt.param_groups:
            group["lr"] = _lr_at(cfg, step)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        train_s += time.perf_counter() - t0
        cpu_s += time.process_time() - c0  # CPU seconds: unlike wall time, not inflated by other jobs on the machine
        value = loss.item()
        if not math.isfinite(value):
            raise HeadscopeError(f"{cfg.label}: training diverged (loss {value}) at step {step}; try a lower --lr")
        recent = (recent + [value])[-20:]
        if step % 10 == 0 or step == cfg.steps - 1:
            curve.append([step, value])
        if bar is not None and step % 10 == 0:
            bar.set_postfix(loss=f"{value:.3f}")
        if on_step is not None:
            on_step(cfg, step, value)
    if bar is not None:
        bar.close()
    metrics = _evaluate(model, cfg, corpus)
    params = sum(p.numel() for p in model.parameters())
    embedding = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    if model.head.weight is not model.tok_emb.weight:
        embedding += model.head.weight.numel()
    flops = model_flops_per_token(model, cfg.seq)
    tokens = cfg.steps * cfg.batch * cfg.seq  # tokens read (xor: one target per sequence, at the query)
    layout = model.blocks[0].attn.layout
    row: dict[str, object] = {
        "task": cfg.task, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.kv_heads, "d_head": cfg.head_dim, "layout": layout, "steps": cfg.steps, "seq": cfg.seq,
        "batch": cfg.batch, "lr": cfg.lr, "init_std": cfg.init_std, "seed": cfg.seed, "train_tokens": tokens, "params": params,
        "params_non_embedding": params - embedding, "flops_per_token": flops, "train_flops_per_token": 3 * flops,
        "kv_bytes_per_token": kv_bytes_per_token(cfg), "kv_dtype": KV_DTYPE,
        **metrics, "train_loss": sum(recent) / len(recent), "tokens_per_s": tokens / train_s,
        "tokens_per_cpu_s": tokens / cpu_s, "train_s": train_s, "train_cpu_s": cpu_s,
        "wall_s": time.perf_counter() - t_wall, "threads": torch.get_num_threads(),
        "loss_curve": curve,  # [step, training loss] every 10 steps; in the JSON record, not in the CSV
        "data": corpus.fingerprint[:16] if corpus is not None else synthetic_fingerprint(cfg.task),
    }
    log.info("%s: val_loss %.4f, %.0f tokens/s", cfg.label, row["val_loss"], row["tokens_per_s"])
    return (row, model.eval()) if return_model else row


# ------------------------------------------------------------------------------------------ the sweep


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    import pandas as pd

    df = pd.DataFrame(rows, columns=CSV_COLUMNS)
    atomic_write_text(path, df.to_csv(index=False))


def run_sweep(
    configs: Sequence[SweepConfig], out: str | Path, force: bool = False, progress: bool = True,
    on_step: Callable[[SweepConfig, int, float], None] | None = None,
    on_config_done: Callable[[SweepConfig, dict[str, object], bool], None] | None = None,
) -> list[dict[str, object]]:
    """Train every configuration not already finished in `out` (all of them with `force`); return all rows.

    After each configuration: `out/runs/<key>.json` (the row and its full config), then `out/sweep.csv`
    (rows of `configs` finished so far, in order), both written atomically. `on_config_done(cfg, row,
    reused)` is called for each configuration, `reused` True when its result was loaded, not trained.
    """
    out = Path(out)
    runs = out / "runs"
    corpus = None
    if any(c.task == "ptb" for c in configs):
        toks = {c.tokenization for c in configs if c.task == "ptb"}
        if len(toks) > 1:
            raise HeadscopeError(f"one sweep uses one tokenization; got {sorted(toks)}")
        corpus = load_corpus("ptb", toks.pop())
    rows: list[dict[str, object]] = []
    for cfg in configs:
        data_fp = corpus.fingerprint if cfg.task == "ptb" and corpus is not None else synthetic_fingerprint(cfg.task)
        key = config_key(cfg, data_fp)
        path = runs / f"{key}.json"
        reused = False
        if path.exists() and not force:
            record = json.loads(path.read_text())
            row = record["row"]
            reused = True
            log.info("%s: already finished (%s), skipped", cfg.label, path)
        else:
            row = train_config(cfg, corpus if cfg.task == "ptb" else None, progress=progress, on_step=on_step)
            row["key"] = key
            record = {"key": key, "config": asdict(cfg), "data": data_fp, "version": SWEEP_VERSION,
                      "torch": torch.__version__, "python": platform.python_version(), "row": row}
            atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True))
        rows.append(row)
        _write_csv(out / "sweep.csv", rows)
        if on_config_done is not None:
            on_config_done(cfg, row, reused)
    return rows


def mean_by_heads(heads: Sequence[int], values: Sequence[float]) -> tuple[list[int], list[float], list[float], list[float], int]:
    """Group values by head count: (sorted head counts, means, minima, maxima, most runs of one head count)."""
    uh = sorted(set(heads))
    per_h = [[v for h, v in zip(heads, values) if h == u] for u in uh]
    return (uh, [sum(v) / len(v) for v in per_h], [min(v) for v in per_h], [max(v) for v in per_h],
            max(len(v) for v in per_h))


def plot_sweep(rows: Sequence[dict[str, object]], out: str | Path) -> list[Path]:
    """PNG plots of a sweep: quality vs heads (`sweep_quality.png`) and training tokens/s vs heads (`sweep_speed.png`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    written = []
    by_series: dict[tuple, list[dict[str, object]]] = {}
    several_budgets = len({int(r["steps"]) for r in rows}) > 1
    for r in rows:
        # One line per (task, kv layout, fixed d_head or not, and training steps when they differ):
        # MHA rows vs GQA/MQA rows stay apart, and so do runs of different lengths.
        kv_series = "MHA" if r["n_kv_heads"] == r["n_heads"] else f"kv={r['n_kv_heads']}"
        dh_series = "d_head=d/h" if int(r["d_head"]) * int(r["n_heads"]) == int(r["d_model"]) else f"d_head={r['d_head']}"
        if several_budgets:
            dh_series += f", {int(r['steps'])} steps"
        by_series.setdefault((r["task"], kv_series, dh_series), []).append(r)
    for name in ("sweep_quality.png", "sweep_speed.png"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (task, kvs, dhs), rs in sorted(by_series.items(), key=lambda kv: (kv[0][0], kv[0][1], len(kv[0][2]), kv[0][2])):
            rs = sorted(rs, key=lambda r: int(r["n_heads"]))
            hs = [int(r["n_heads"]) for r in rs]
            if name == "sweep_quality.png":
                if task in SYNTHETIC_TASKS:
                    lines = [([100 * float(r["val_acc"]) for r in rs], "", "o-")]
                    ax.set_ylabel("accuracy, % (held-out; xor: every input)")
                else:
                    lines = [([float(r["val_bits_per_token"]) for r in rs], "", "o-")]
                    ax.set_ylabel("valid bits per token (lower is better)")
            else:
                # Wall-clock speed is inflated by whatever else runs on the machine; CPU-time speed is not.
                lines = [([float(r["tokens_per_s"]) for r in rs], " (wall clock)", "o-"),
                         ([float(r["tokens_per_cpu_s"]) for r in rs], " (per CPU second)", "s--")]
                ax.set_ylabel("training tokens / s")
            for ys, suffix, style in lines:
                # Several rows per head count (seeds): the mean, bars from min to max, and every run as a dot.
                uh, means, lows, highs, n_max = mean_by_heads(hs, ys)
                label = f"{task} {kvs} {dhs}{suffix}" + (f", mean of {n_max} seeds (bars: min-max)" if n_max > 1 else "")
                line = ax.plot(uh, means, style, label=label)[0]
                if n_max > 1:
                    ax.errorbar(uh, means, yerr=[[m - lo for m, lo in zip(means, lows)],
                                                 [hi - m for m, hi in zip(means, highs)]],
                                fmt="none", ecolor=line.get_color(), capsize=3, lw=1)
                    ax.plot(hs, ys, ".", color=line.get_color(), alpha=0.5, ms=4)
                for h, y in zip(uh, means):
                    d_head = next(r["d_head"] for r in rs if int(r["n_heads"]) == h)
                    ax.annotate(f"{d_head}", (h, y), textcoords="offset points", xytext=(0, 6), ha="center",
                                fontsize=7)
        ax.set_xscale("log", base=2)
        all_h = sorted({int(r["n_heads"]) for r in rows})
        ax.set_xticks(all_h, [str(h) for h in all_h])
        if name == "sweep_quality.png" and all(r["task"] in SYNTHETIC_TASKS for r in rows):
            # Small differences near 100 % must not look like large ones; show the scale that matters.
            for task in sorted({str(r["task"]) for r in rows}):
                if task == "xor":
                    ceiling, text = 75.0, "xor, one head, any weights: at most 75 % (proved)"
                else:
                    ceiling = 100 * (1 / PAIR_VOCAB + (1 - 1 / PAIR_VOCAB) / 2)
                    text = f"pair, one head, equal weights: at most {ceiling:.0f} %"
                ax.axhline(ceiling, color="grey", ls=":", lw=1)
                ax.annotate(text, (all_h[0], ceiling), fontsize=7, textcoords="offset points", xytext=(2, 3),
                            color="grey")
            ax.set_ylim(0, 105)
        ax.set_xlabel("query heads (labels: d_head)")
        r0 = rows[0]
        budget = "" if several_budgets else f"{r0['steps']} steps x "
        ax.set_title(f"d_model={r0['d_model']}, {r0['n_layers']} layer(s), {budget}{r0['batch']}x{r0['seq']} tokens",
                     fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        atomic_write_bytes(out / name, buf.getvalue())
        written.append(out / name)
    return written

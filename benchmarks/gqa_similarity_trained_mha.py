"""Similarity vs adjacent vs random KV grouping on a small MHA LLaMA trained from scratch on PTB.

SmolLM2 (3 KV heads) offers no grouping choice, so this script trains its own multi-head-attention
model (8 query heads, 8 KV heads per layer) where the choice is not planted: a word-level LLaMA over
PTB's 10k vocabulary, trained from scratch with `gqa.uptrain(loss="lm", train="all")`. It then converts
it to G = 4, 2, 1 KV heads with

- adjacent groups (`mean`),
- `similarity` groups from K/V outputs on calibration text (PTB train sentences never used for
  training or evaluation), both as chosen (no fallback) and as `plan_groups` decides with its
  calibration-KL fallback,
- `similarity` groups from the K/V weights only,
- `--random` seeded random balanced groupings per layer (the distribution a grouping choice lands in),

and reports held-out perplexity and KL from the MHA model on PTB valid (used nowhere else), KL on the
calibration text, and the summed mean-pooling error (`partition_cost` on `kv_distances`, from data and
from weights) of every grouping. Optionally a short KD uptraining of some conversions at one G.

    OMP_NUM_THREADS=1 nice python benchmarks/gqa_similarity_trained_mha.py --model-seeds 0 1

Trained checkpoints are cached under --work (reruns skip training). Writes --csv (one row per
(model seed, G, grouping, random seed, uptraining steps)) and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from headscope.capacity import gqa
from headscope.data import ptb_sentences
from headscope.io import atomic_write_text
from headscope.models.adapter import HeadModel
from headscope.models.checkpoint import save_model

REPO = Path(__file__).resolve().parents[1]
SPECIALS = ["<pad>", "<s>", "</s>"]  # <unk> is one of PTB's own words


def rank(x: np.ndarray) -> np.ndarray:
    """Ranks (0 = smallest), for a Spearman by Pearson on ranks."""
    return np.argsort(np.argsort(x))


def build_tokenizer(train: list[str]):
    """Word-level tokenizer over the PTB train vocabulary; prepends <s> so every word is predicted."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for s in train for w in s.split()})
    vocab = {t: i for i, t in enumerate(SPECIALS + [w for w in words if w not in SPECIALS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")


def build_model(tok, args, seed: int) -> HeadModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        head_dim=args.hidden // args.heads,
        intermediate_size=4 * args.hidden,
        tie_word_embeddings=True,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return HeadModel(model=LlamaForCausalLM(cfg), tokenizer=tok, name=f"ptb-mha-seed{seed}", source="trained here")


def trained_model(args, seed: int, train: list[str], valid_probe: list[str]) -> tuple[HeadModel, dict]:
    """Train (or load the cached) MHA model for `seed`."""
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    d = Path(args.work) / f"seed{seed}"
    ckpt, info_path = d / "model", d / "train.json"
    if ckpt.exists() and info_path.exists():
        model = LlamaForCausalLM.from_pretrained(ckpt, attn_implementation="eager")
        tok = PreTrainedTokenizerFast.from_pretrained(ckpt)
        print(f"[seed {seed}] loaded cached checkpoint {ckpt}", flush=True)
        return HeadModel(model=model, tokenizer=tok, name=f"ptb-mha-seed{seed}", source=str(ckpt)), \
            json.loads(info_path.read_text())
    tok = build_tokenizer(train)
    hm = build_model(tok, args, seed)
    t0 = time.time()
    # Constant lr, then a short phase at lr/10 (uptrain has no schedule; two calls give a crude anneal).
    hm1, log1 = gqa.uptrain(hm, train, args.train_steps, loss="lm", train="all", lr=args.lr,
                            batch_size=args.train_batch, max_length=64, seed=seed, progress=True)
    hm2, log2 = gqa.uptrain(hm1, train, args.anneal_steps, loss="lm", train="all", lr=args.lr / 10,
                            batch_size=args.train_batch, max_length=64, seed=seed + 1000, progress=True)
    train_s = time.time() - t0
    hm2.name = f"ptb-mha-seed{seed}"
    info = dict(seed=seed, steps=args.train_steps, anneal_steps=args.anneal_steps, lr=args.lr,
                batch_size=args.train_batch, train_sentences=len(train), train_seconds=round(train_s, 1),
                n_params=sum(p.numel() for p in hm2.model.parameters()), vocab=len(tok),
                loss_first=log1.losses[0], loss_last10=float(np.mean((log1.losses + log2.losses)[-10:])),
                ppl_valid_probe=gqa.perplexity(hm2, valid_probe))
    save_model(hm2, ckpt, force=True)
    atomic_write_text(info_path, json.dumps(info, indent=1))
    print(f"[seed {seed}] trained in {train_s:.0f} s: {info}", flush=True)
    return hm2, info


def random_groups(n_layers: int, n_kv: int, G: int, seed: int) -> list[list[list[int]]]:
    """Per layer an independent uniformly random balanced grouping (seeded)."""
    rng = np.random.default_rng(seed)
    return [gqa.random_balanced_groups(n_kv, G, rng) for _ in range(n_layers)]


def cost(dist: np.ndarray, groups) -> float:
    return float(sum(gqa.partition_cost(dist[l], groups[l]) for l in range(len(groups))))


def percentile(dist_layer: np.ndarray, groups_layer, n_kv: int, G: int) -> float:
    """Share of all balanced partitions of this layer with a pooling error below this grouping's."""
    costs = np.array(
        [gqa.partition_cost(dist_layer, p) for p in gqa.enumerate_partitions(list(range(n_kv)), n_kv // G)]
    )
    return float((costs < gqa.partition_cost(dist_layer, groups_layer) - 1e-12).mean())


def run_seed(args, seed: int, train, calib, heldout, rows: list[dict]) -> None:
    hm, info = trained_model(args, seed, train, heldout[:200])
    n_kv, L = hm.n_kv_heads, hm.n_layers
    ev = dict(max_length=64, batch_size=16)
    t0 = time.time()
    ppl_ref = gqa.perplexity(hm, heldout, **ev)
    print(f"[seed {seed}] MHA model: held-out perplexity {ppl_ref:.2f} (uniform over the vocabulary: "
          f"{len(hm.tokenizer)}), {info['n_params']:,} parameters", flush=True)
    d_data = gqa.kv_distances(hm, calib, **ev)
    d_w = gqa.kv_distances(hm)
    base = dict(model_seed=seed, vocab=len(hm.tokenizer), ppl_mha=ppl_ref, train_seconds=info["train_seconds"])
    rows.append(dict(base, G=n_kv, grouping="original (MHA)", random_seed="", heldout_ppl=ppl_ref, heldout_kl=0.0,
                     calib_kl=0.0, pooling_error_data=0.0, pooling_error_weights=0.0, uptrain_steps=0))
    for G in args.G:
        cands: dict[str, list] = {"adjacent": [gqa.adjacent_groups(n_kv, G)] * L}
        notes: dict[str, dict] = {k: {} for k in cands}
        if G not in (1, n_kv):
            cands["similarity-data"] = [gqa.balanced_partition(d_data[l], G) for l in range(L)]
            plan = gqa.plan_groups(hm, G, "similarity", calib, **ev)
            cands["similarity-data+fallback"] = plan["groups"]
            cands["similarity-weights"] = [gqa.balanced_partition(d_w[l], G) for l in range(L)]
            notes["similarity-data"] = dict(grouping_used="similarity (no fallback)")
            notes["similarity-data+fallback"] = dict(
                grouping_used=plan["grouping_used"], fallback_fired="fell back" in plan["grouping_used"],
                calib_kl_similarity_plan=plan.get("calibration_kl_similarity"),
                calib_kl_adjacent_plan=plan.get("calibration_kl_adjacent"))
            notes["similarity-weights"] = dict(grouping_used="similarity (weights, no fallback)")
            for r in range(args.random):
                cands[f"random-{r}"] = random_groups(L, n_kv, G, 1000 * G + r)
        models = {k: gqa.convert_to_gqa(hm, G, groups=g) for k, g in cands.items()}
        held = gqa.compare(hm, models, heldout, **ev)
        cal = gqa.compare(hm, models, calib, **ev)
        for k, g in cands.items():
            name, rs = (("random", k.split("-")[1]) if k.startswith("random-") else (k, ""))
            pct = [percentile(d_data[l], g[l], n_kv, G) for l in range(L)] if G not in (1, n_kv) else [0.0] * L
            rows.append(
                dict(
                    base,
                    G=G,
                    grouping=name,
                    random_seed=rs,
                    heldout_ppl=held[k]["ppl"],
                    heldout_kl=held[k]["kl"],
                    calib_kl=cal[k]["kl"],
                    pooling_error_data=cost(d_data, g),
                    pooling_error_weights=cost(d_w, g),
                    pooling_pct_data=json.dumps([round(p, 3) for p in pct]),
                    same_as_adjacent=g == cands["adjacent"],
                    groups=json.dumps(g),
                    uptrain_steps=0,
                    **notes.get(k, {}),
                )
            )
        print(f"[seed {seed}] G={G}: {len(cands)} groupings evaluated ({time.time() - t0:.0f} s so far)", flush=True)
        if G in args.uptrain_G and args.uptrain_steps and G not in (1, n_kv):
            up_names = ["adjacent", "similarity-data", "similarity-weights"] + \
                [f"random-{r}" for r in range(min(args.uptrain_random, args.random))]
            upd = {}
            for k in up_names:
                upd[k], _ = gqa.uptrain(models[k], train[:args.uptrain_data], args.uptrain_steps, teacher=hm,
                                           loss="kd", train="attention", lr=1e-3, batch_size=8, max_length=64, seed=0)
            held_u = gqa.compare(hm, upd, heldout, **ev)
            for k in up_names:
                name, rs = (("random", k.split("-")[1]) if k.startswith("random-") else (k, ""))
                rows.append(
                    dict(
                        base,
                        G=G,
                        grouping=name,
                        random_seed=rs,
                        heldout_ppl=held_u[k]["ppl"],
                        heldout_kl=held_u[k]["kl"],
                        pooling_error_data=cost(d_data, cands[k]),
                        pooling_error_weights=cost(d_w, cands[k]),
                        same_as_adjacent=cands[k] == cands["adjacent"],
                        groups=json.dumps(cands[k]),
                        uptrain_steps=args.uptrain_steps,
                    )
                )
            print(f"[seed {seed}] G={G}: uptrained {len(up_names)} conversions ({time.time() - t0:.0f} s so far)",
                  flush=True)


COLUMNS = ["model_seed", "G", "grouping", "random_seed", "uptrain_steps", "heldout_ppl", "heldout_kl", "calib_kl",
           "pooling_error_data", "pooling_error_weights", "pooling_pct_data", "same_as_adjacent", "grouping_used",
           "fallback_fired", "calib_kl_similarity_plan", "calib_kl_adjacent_plan", "groups", "ppl_mha", "vocab",
           "train_seconds"]


def summary(rows: list[dict]) -> str:
    """Per (model seed, G, uptraining): adjacent / similarity / random (min, median, max) side by side."""
    out = []
    keys = sorted({(r["model_seed"], r["G"], r["uptrain_steps"]) for r in rows}, key=lambda k: (k[0], -k[1], k[2]))
    for seed, G, up in keys:
        rs = [r for r in rows if (r["model_seed"], r["G"], r["uptrain_steps"]) == (seed, G, up)]
        out.append(f"model seed {seed}, G={G}, uptrain {up} steps")
        out.append(f"  {'grouping':<26}{'ppl':>10}{'KL held':>10}{'KL calib':>10}{'pool(data)':>12}{'pool(w)':>10}")
        for r in rs:
            if r["grouping"] == "random":
                continue
            cal = r.get("calib_kl")
            out.append(f"  {r['grouping']:<26}{r['heldout_ppl']:>10.2f}{r['heldout_kl']:>10.4f}"
                       f"{(f'{cal:.4f}' if cal is not None else '-'):>10}{r['pooling_error_data']:>12.3f}"
                       f"{r['pooling_error_weights']:>10.3f}"
                       + (f"   [{r['grouping_used']}]" if r.get("grouping_used") else ""))
        rnd = [r for r in rs if r["grouping"] == "random"]
        if rnd:
            for label, f in (("min", np.min), ("median", np.median), ("max", np.max)):
                out.append(f"  {'random (' + str(len(rnd)) + ') ' + label:<26}"
                           f"{f([r['heldout_ppl'] for r in rnd]):>10.2f}{f([r['heldout_kl'] for r in rnd]):>10.4f}"
                           + (f"{f([r['calib_kl'] for r in rnd]):>10.4f}" if up == 0 else f"{'-':>10}")
                           + f"{f([r['pooling_error_data'] for r in rnd]):>12.3f}"
                           f"{f([r['pooling_error_weights'] for r in rnd]):>10.3f}")
            for name in ("adjacent", "similarity-data", "similarity-weights"):
                me = [r for r in rs if r["grouping"] == name]
                if me:
                    beat = sum(r["heldout_kl"] < me[0]["heldout_kl"] for r in rnd)
                    out.append(f"  {name}: {beat} of {len(rnd)} random groupings have lower held-out KL")
        rho = None
        pts = [(r["pooling_error_data"], r["heldout_kl"]) for r in rs if r["grouping"] != "original (MHA)"]
        if len(pts) > 3:
            a, b = np.array(pts).T
            rho = float(np.corrcoef(rank(a), rank(b))[0, 1])
            out.append(f"  Spearman(pooling error on data, held-out KL) over these {len(pts)} groupings: {rho:.2f}")
        pts = [(r["calib_kl"], r["heldout_kl"]) for r in rs
               if r["grouping"] != "original (MHA)" and r.get("calib_kl") is not None]
        if len(pts) > 3:
            a, b = np.array(pts).T
            out.append(f"  Spearman(calibration KL, held-out KL) over these {len(pts)} groupings: "
                       f"{float(np.corrcoef(rank(a), rank(b))[0, 1]):.2f}")
    return "\n".join(out)


def write_csv(path: str, rows: list[dict], columns: list[str] | None = None) -> None:
    """Rows as CSV (floats to 6 significant digits), written atomically; `columns` default: COLUMNS."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns or COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    atomic_write_text(path, buf.getvalue())


def read_csv(path: str) -> list[dict]:
    """Rows of a CSV written by `write_csv`, numbers parsed back (empty cells: None)."""
    def parse(k: str, v: str):
        if v == "" or v is None:
            return None
        if k in ("model_seed", "G", "uptrain_steps", "vocab"):
            return int(v)
        if k in ("same_as_adjacent", "fallback_fired"):
            return v == "True"
        try:
            return (
                float(v) if k not in ("grouping", "random_seed", "grouping_used", "groups", "pooling_pct_data") else v
            )
        except ValueError:
            return v
    with open(path, newline="") as f:
        return [{k: parse(k, v) for k, v in r.items()} for r in csv.DictReader(f)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/headscope-trained-mha", help="where trained checkpoints are cached")
    ap.add_argument("--model-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--train-steps", type=int, default=2000)
    ap.add_argument("--anneal-steps", type=int, default=400)
    ap.add_argument("--train-batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--calib", type=int, default=500, help="last N PTB train sentences: calibration only")
    ap.add_argument("--heldout", type=int, default=2000, help="first N PTB valid sentences: evaluation only")
    ap.add_argument("--G", type=int, nargs="+", default=[4, 2, 1])
    ap.add_argument("--random", type=int, default=10)
    ap.add_argument("--uptrain-steps", type=int, default=50)
    ap.add_argument("--uptrain-G", type=int, nargs="*", default=[2])
    ap.add_argument("--uptrain-random", type=int, default=3, help="how many random groupings to uptrain too")
    ap.add_argument("--uptrain-data", type=int, default=4000, help="first N training sentences for uptraining")
    ap.add_argument("--csv", default=str(REPO / "docs/gqa/trained_mha.csv"))
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of other model seeds already in --csv (rows of the seeds run now are replaced)")
    ap.add_argument("--from-csv", action="store_true", help="only print the summary of --csv; run nothing")
    args = ap.parse_args()
    if args.from_csv:
        print(summary(read_csv(args.csv)))
        return
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.time()
    sents = ptb_sentences("train")
    train, calib = sents[:-args.calib], sents[-args.calib:]
    heldout = ptb_sentences("valid", args.heldout)
    rows: list[dict] = [r for r in read_csv(args.csv) if r["model_seed"] not in args.model_seeds] \
        if args.append and Path(args.csv).exists() else []
    for seed in args.model_seeds:
        run_seed(args, seed, train, calib, heldout, rows)
        write_csv(args.csv, rows)  # after every model seed, so a cut-short run keeps what it measured
        print(summary([r for r in rows if r["model_seed"] == seed]), flush=True)
    print(f"wrote {args.csv}; wall time {time.time() - t0:.0f} s; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()

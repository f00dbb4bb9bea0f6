"""An independent EAP-IG and circuit evaluator for LLaMA-family models (SmolLM2), from plain transformers modules
and torch hooks, sharing no code with headscope; and the must-hold check of `headscope circuit` against it.

The graph is the same GQA-native one (docs/circuits.md): senders input, L{l}H{h}, MLP{l}; receivers L{l}H{h}.q,
L{l}G{g}.k, L{l}G{g}.v, MLP{l}, logits. The computations differ from the library's on purpose:
- gradients: one backward per interpolation step to the q/k/v projections' outputs, the MLP norm's output and the
  final norm's output; each receiver's gradient is its own channels pulled back through its projection rows and
  then through its norm's vector-Jacobian product at the residual (the library instead gives each receiver its own
  zero tensor in the forward and reads that tensor's gradient);
- the evaluator sums each receiver's dropped senders' (corrupt - this run) explicitly, receiver by receiver.

    python benchmarks/circuit_independent.py --pairs benchmarks/data/ioi_fresh.jsonl --library /tmp/circ_smollm2

reads the library's edges.csv and circuit.json from --library (made by `headscope circuit smollm2 --pairs ...
--out DIR`) and prints the Spearman of the edge scores, the faithfulness of the library's circuits at 1%, 5% and
10% of edges under this evaluator beside what circuit.json claims, and this implementation's own CPR and CMD.
Single-threaded; about 20 minutes on one CPU core for 20 pairs.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from transformers import AutoModelForCausalLM, AutoTokenizer

FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
SMOLLM2 = Path.home() / ".cache/headscope/smollm2-135m-instruct-f32"


# --- data ------------------------------------------------------------------------------------------------------


def read_pairs(path: Path, tok) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    clean = [tok(r["clean"])["input_ids"] for r in rows]
    corrupt = [tok(r["corrupt"])["input_ids"] for r in rows]
    width = max(len(c) for c in clean)
    ids = torch.zeros(2, len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (a, c) in enumerate(zip(clean, corrupt, strict=True)):
        assert len(a) == len(c), rows[i]
        ids[0, i, :len(a)], ids[1, i, :len(c)], mask[i, :len(a)] = torch.tensor(a), torch.tensor(c), 1
    one = lambda t: tok(t, add_special_tokens=False)["input_ids"][0]  # noqa: E731
    return {"clean": ids[0], "corrupt": ids[1], "mask": mask, "last": mask.sum(1) - 1,
            "answer": torch.tensor([one(r["answer"]) for r in rows]),
            "wrong": torch.tensor([one(r["wrong"]) for r in rows])}


def take(d: dict, rows: slice) -> dict:
    return {k: v[rows] for k, v in d.items()}


def logit_diff(model, d: dict, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=d["mask"], use_cache=False).logits
    at = logits[torch.arange(len(ids)), d["last"]]
    return at.gather(1, d["answer"][:, None])[:, 0] - at.gather(1, d["wrong"][:, None])[:, 0]


# --- the graph -------------------------------------------------------------------------------------------------


def nodes(cfg) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, str, int]]]:
    """Senders (name, layer, slot: 0 input, 1 head, 2 MLP) and receivers (name, layer, kind, index)."""
    L, H, G = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    senders = [("input", -1, 0)]
    receivers = []
    for l in range(L):
        senders += [(f"L{l}H{h}", l, 1) for h in range(H)] + [(f"MLP{l}", l, 2)]
        receivers += [(f"L{l}H{h}.q", l, "q", h) for h in range(H)]
        receivers += [(f"L{l}G{g}.k", l, "k", g) for g in range(G)] + [(f"L{l}G{g}.v", l, "v", g) for g in range(G)]
        receivers.append((f"MLP{l}", l, "mlp", 0))
    receivers.append(("logits", L, "logits", 0))
    return senders, receivers


def feeds(sender: tuple[str, int, int], receiver: tuple[str, int, str, int]) -> bool:
    _, ls, slot = sender
    _, lr, kind, _ = receiver
    if slot == 0 or kind == "logits":
        return True
    if kind == "mlp":
        return ls < lr or (ls == lr and slot == 1)
    return ls < lr


# --- what each run writes --------------------------------------------------------------------------------------


def writes(model, d: dict, ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every sender's write into the residual stream `[pairs, pos, d_model]`, and the metric."""
    cfg, inner = model.config, model.model
    H, dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    out, hooks = {}, []
    hooks.append(inner.embed_tokens.register_forward_hook(lambda m, a, o: out.__setitem__("input", o.detach())))
    for l, layer in enumerate(inner.layers):
        def head_hook(m, a, l=l):
            z = a[0].detach()
            for h in range(H):
                out[f"L{l}H{h}"] = z[..., h * dh:(h + 1) * dh] @ m.weight[:, h * dh:(h + 1) * dh].T
        hooks.append(layer.self_attn.o_proj.register_forward_pre_hook(head_hook))
        hooks.append(layer.mlp.register_forward_hook(lambda m, a, o, l=l: out.__setitem__(f"MLP{l}", o.detach())))
    with torch.no_grad():
        m = logit_diff(model, d, ids)
    for h in hooks:
        h.remove()
    return out, m


# --- independent EAP-IG ----------------------------------------------------------------------------------------


def receiver_grads(model, d: dict, emb: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """d(-sum M)/d(input of each receiver), via the projections' output gradients and each norm's VJP."""
    cfg, inner = model.config, model.model
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = cfg.hidden_size // H
    saved, grads, hooks = {}, {}, []

    def keep_grad(name):
        def hook(m, a, o):
            o.register_hook(lambda g: grads.__setitem__(name, g))
        return hook

    if emb is not None:
        hooks.append(inner.embed_tokens.register_forward_hook(lambda m, a, o: emb.clone().requires_grad_(True)))
    for l, layer in enumerate(inner.layers):
        hooks.append(layer.input_layernorm.register_forward_hook(
            lambda m, a, o, l=l: saved.__setitem__(("attn", l), a[0].detach())))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(
            lambda m, a, o, l=l: saved.__setitem__(("mlp", l), a[0].detach())))
        for kind in "qkv":
            hooks.append(getattr(layer.self_attn, f"{kind}_proj").register_forward_hook(keep_grad((kind, l))))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(keep_grad(("mlp", l))))
    hooks.append(inner.norm.register_forward_hook(lambda m, a, o: saved.__setitem__(("final",), a[0].detach())))
    hooks.append(inner.norm.register_forward_hook(keep_grad(("final",))))
    with torch.enable_grad():
        loss = -logit_diff(model, d, d["clean"]).sum()
        loss.backward()
    for h in hooks:
        h.remove()
    model.zero_grad(set_to_none=True)

    def pull(norm, x, v):  # v [n, pairs, pos, d]: gradients w.r.t. the norm's output -> w.r.t. its input
        x = x.clone().requires_grad_(True)
        with torch.enable_grad():
            y = norm(x)
            return torch.stack([torch.autograd.grad(y, x, vi, retain_graph=True)[0] for vi in v])

    out = {}
    for l, layer in enumerate(inner.layers):
        att = layer.self_attn
        vs, names = [], []
        for h in range(H):
            rows = slice(h * dh, (h + 1) * dh)
            vs.append(grads[("q", l)][..., rows] @ att.q_proj.weight[rows])
            names.append(f"L{l}H{h}.q")
        for kind in "kv":
            w = getattr(att, f"{kind}_proj").weight
            for g in range(G):
                rows = slice(g * dh, (g + 1) * dh)
                vs.append(grads[(kind, l)][..., rows] @ w[rows])
                names.append(f"L{l}G{g}.{kind}")
        pulled = pull(layer.input_layernorm, saved[("attn", l)], torch.stack(vs).detach())
        out.update(zip(names, pulled, strict=True))
        out[f"MLP{l}"] = pull(layer.post_attention_layernorm, saved[("mlp", l)], grads[("mlp", l)][None])[0]
    out["logits"] = pull(inner.norm, saved[("final",)], grads[("final",)][None])[0]
    return out


def eap_ig(model, d: dict, steps: int, batch: int) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Per-pair scores `[pairs, edges]` of every edge, EAP-IG with the inputs interpolated at k/steps."""
    senders, receivers = nodes(model.config)
    edges = [(s, r) for r in receivers for s in senders if feeds(s, r)]
    pairs = len(d["clean"])
    scores = np.zeros((pairs, len(edges)))
    for start in range(0, pairs, batch):
        part = take(d, slice(start, start + batch))
        clean, _ = writes(model, part, part["clean"])
        corrupt, _ = writes(model, part, part["corrupt"])
        total: dict[str, torch.Tensor] = {}
        for k in range(steps):
            a = k / steps
            g = receiver_grads(model, part, corrupt["input"] + a * (clean["input"] - corrupt["input"]))
            for name, v in g.items():
                total[name] = total.get(name, 0) + v / steps
        for e, (s, r) in enumerate(edges):
            diff = corrupt[s[0]] - clean[s[0]]
            scores[start:start + len(part["clean"]), e] = (diff * total[r[0]]).sum((1, 2)).double().numpy()
    return scores, [(s[0], r[0]) for s, r in edges]


# --- independent evaluator -------------------------------------------------------------------------------------


def run_circuit(model, d: dict, corrupt: dict[str, torch.Tensor], dropped: dict[str, list[str]]) -> np.ndarray:
    """M of the clean run where each receiver r's input gets sum over dropped[r] of (corrupt - this run)."""
    cfg, inner = model.config, model.model
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = cfg.hidden_size // H
    now: dict[str, torch.Tensor] = {}
    resid: dict[int, torch.Tensor] = {}
    hooks = []

    def delta(r: str) -> torch.Tensor | None:
        senders = dropped.get(r, [])
        if not senders:
            return None
        return sum(corrupt[s] - now[s] for s in senders)

    hooks.append(inner.embed_tokens.register_forward_hook(lambda m, a, o: now.__setitem__("input", o)))
    for l, layer in enumerate(inner.layers):
        att = layer.self_attn
        hooks.append(layer.register_forward_pre_hook(
            lambda m, a, kw, l=l: resid.__setitem__(l, a[0] if a else kw["hidden_states"]), with_kwargs=True))

        def proj_hook(kind, count, l=l, layer=layer):
            def hook(m, a, o):
                o = o.clone()
                for i in range(count):
                    name = f"L{l}H{i}.q" if kind == "q" else f"L{l}G{i}.{kind}"
                    dd = delta(name)
                    if dd is not None:
                        x = layer.input_layernorm(resid[l] + dd)
                        rows = slice(i * dh, (i + 1) * dh)
                        o[..., rows] = F.linear(x, m.weight[rows], None if m.bias is None else m.bias[rows])
                return o
            return hook

        hooks.append(att.q_proj.register_forward_hook(proj_hook("q", H)))
        hooks.append(att.k_proj.register_forward_hook(proj_hook("k", G)))
        hooks.append(att.v_proj.register_forward_hook(proj_hook("v", G)))

        def heads(m, a, l=l):
            z = a[0]
            for h in range(H):
                now[f"L{l}H{h}"] = z[..., h * dh:(h + 1) * dh] @ m.weight[:, h * dh:(h + 1) * dh].T
        hooks.append(att.o_proj.register_forward_pre_hook(heads))

        def mlp_in(m, a, o, l=l):
            dd = delta(f"MLP{l}")
            return None if dd is None else _norm(m, a[0] + dd)
        hooks.append(layer.post_attention_layernorm.register_forward_hook(mlp_in))
        hooks.append(layer.mlp.register_forward_hook(lambda m, a, o, l=l: now.__setitem__(f"MLP{l}", o)))

    def logits_in(m, a, o):
        dd = delta("logits")
        return None if dd is None else _norm(m, a[0] + dd)
    hooks.append(inner.norm.register_forward_hook(logits_in))
    try:
        with torch.no_grad():
            return logit_diff(model, d, d["clean"]).double().numpy()
    finally:
        for h in hooks:
            h.remove()


def _norm(norm, x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm written out (not the module: its hook would fire again)."""
    var = x.float().pow(2).mean(-1, keepdim=True)
    return norm.weight * (x * torch.rsqrt(var + norm.variance_epsilon))


def evaluate(model, d: dict, circuits: list[set[int]], edges: list[tuple[str, str]], batch: int) -> np.ndarray:
    """M per pair `[pairs, circuits]` of each circuit (a set of kept edge indices)."""
    pairs = len(d["clean"])
    out = np.zeros((pairs, len(circuits)))
    for start in range(0, pairs, batch):
        part = take(d, slice(start, start + batch))
        corrupt, _ = writes(model, part, part["corrupt"])
        for c, kept in enumerate(circuits):
            dropped: dict[str, list[str]] = {}
            for e, (s, r) in enumerate(edges):
                if e not in kept:
                    dropped.setdefault(r, []).append(s)
            out[start:start + len(part["clean"]), c] = run_circuit(model, part, corrupt, dropped)
    return out


def faithfulness(m: np.ndarray, full: np.ndarray, empty: np.ndarray) -> np.ndarray:
    return (m.mean(0) - empty.mean()) / (full.mean() - empty.mean())


def trapezoid(y: np.ndarray) -> float:
    x = np.asarray(FRACTIONS)
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)))


def top(scores: np.ndarray, k: int, signed: bool) -> set[int]:
    key = scores if signed else np.abs(scores)
    return {int(i) for i in np.argsort(-key, kind="stable")[:k]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=Path, required=True)
    ap.add_argument("--library", type=Path, required=True, help="the folder headscope circuit wrote")
    ap.add_argument("--model", type=Path, default=SMOLLM2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--curves", action="store_true", help="also this implementation's own CPR and CMD")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    d = read_pairs(args.pairs, tok)
    t0 = time.perf_counter()
    per_pair, edges = eap_ig(model, d, args.steps, args.batch)
    seconds = time.perf_counter() - t0
    scores = per_pair.mean(0)
    lib = {(r["sender"], r["receiver"]): float(r["score"]) for r in csv.DictReader(open(args.library / "edges.csv"))}
    claims = json.loads((args.library / "circuit.json").read_text())
    assert set(lib) == set(edges), "the graphs differ"
    lib_scores = np.array([lib[e] for e in edges])
    rho = spearmanr(lib_scores, scores).statistic
    rho_abs = spearmanr(np.abs(lib_scores), np.abs(scores)).statistic
    print(f"{len(d['clean'])} pairs, {len(edges):,} edges; independent EAP-IG ({args.steps} steps) in {seconds:.0f} s")
    print(f"Spearman(library, independent) over edges: signed {rho:.4f}, |score| {rho_abs:.4f}; max |diff| "
          f"{np.abs(lib_scores - scores).max():.2e} (max |score| {np.abs(scores).max():.2e})")
    with torch.no_grad():
        full = logit_diff(model, d, d["clean"]).double().numpy()
        empty = logit_diff(model, d, d["corrupt"]).double().numpy()
    by_fraction = {p["fraction"]: p for p in claims["curve"]}
    want = (0.01, 0.05, 0.1)
    circuits = [top(lib_scores, int(f * len(edges)), False) for f in want]
    t0 = time.perf_counter()
    got = faithfulness(evaluate(model, d, circuits, edges, args.batch), full, empty)
    print(f"library circuits under the independent evaluator ({time.perf_counter() - t0:.0f} s):")
    for f, v in zip(want, got, strict=True):
        c = by_fraction[f]
        print(f"  {f:.0%} ({c['edges']} edges): independent {v:+.4f}; circuit.json {c['faithfulness']:+.4f} "
              f"[{c['faithfulness_lo']:+.4f}, {c['faithfulness_hi']:+.4f}]")
    if args.curves:
        ks = [int(f * len(edges)) for f in FRACTIONS]
        circuits = [top(scores, k, False) for k in ks] + [top(scores, k, True) for k in ks]
        f = faithfulness(evaluate(model, d, circuits, edges, args.batch), full, empty)
        n = len(FRACTIONS)
        print(f"independent implementation's own curves: CMD {trapezoid(np.abs(1 - f[:n])):.4f}, CPR "
              f"{trapezoid(f[n:]):.4f}; library: CMD {claims['cmd']:.4f} [{claims['cmd_lo']:.4f}, "
              f"{claims['cmd_hi']:.4f}], CPR {claims['cpr']:.4f} [{claims['cpr_lo']:.4f}, {claims['cpr_hi']:.4f}]")
        print("  |score| curve: " + ", ".join(f"{x:.3f}" for x in f[:n]))
        print("  library:       " + ", ".join(f"{p['faithfulness']:.3f}" for p in claims["curve"]))


if __name__ == "__main__":
    main()

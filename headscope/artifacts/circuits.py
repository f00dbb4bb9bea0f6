"""The declarations of the files `headscope circuit` and `headscope compare` write (issues 44 and 42): edge scores and
circuits at every size, and what a compressed model kept and lost against its original."""

from __future__ import annotations

from .schema import PROVENANCE, Artifact, Field

__all__ = ["CIRCUIT_JSON", "COMPARE_CSV", "COMPARE_ITEMS_NPZ", "COMPARE_JSON", "EDGES_CSV"]

# headscope circuit (issue 44): edge attribution and circuits at every size (docs/circuits.md).
EDGES_CSV = Artifact(
    "edges.csv", "csv", {"circuit": ""}, "edge attribution: one row per edge of the graph (sender to receiver), "
    "its score followed by its bootstrap interval over pairs",
    (Field("sender", "input (the embeddings), L<layer>H<head> or MLP<layer>"),
     Field("receiver", "L<layer>H<head>.q, L<layer>G<group>.k, L<layer>G<group>.v (a KV group's keys and values), "
                       "MLP<layer> or logits"),
     Field("score", "EAP or EAP-IG: (a_sender,corrupt - a_sender,clean) . d(-M)/d(input of receiver), summed over "
                    "positions and d_model, mean over pairs; positive when patching the edge alone with the corrupt "
                    "run lowers M = logit(answer) - logit(wrong)")),
    bounds=True)
CIRCUIT_JSON = Artifact(
    "circuit.json", "json", {"circuit": ""}, "circuits at every size: the faithfulness curves by |score| and by "
    "signed score beside random circuits, CMD and CPR, each with its interval over pairs",
    (Field("curve", "per fraction of edges: edges, fraction, faithfulness with faithfulness_lo/_hi, random (a random "
                    "circuit of the same size) with random_lo/_hi; circuits by |score|"),
     Field("curve_signed", "the same for circuits by signed score"),
     Field("cmd", "area of |1 - faithfulness| over the fractions of curve (lower is better), cmd_lo, cmd_hi"),
     Field("cpr", "area under curve_signed (higher is better), cpr_lo, cpr_hi"),
     Field("total_edges", "edges in the graph"), Field("method", "eap or eap-ig"),
     Field("ig_steps", "EAP-IG's interpolation steps m (null for eap)"), Field("metric", "what M is"),
     Field("graph", "senders, receivers and how the graph is built"),
     Field("M_clean", "M on the clean texts (the full circuit), mean over pairs, with its interval"),
     Field("M_corrupt", "M on the corrupt texts, with its interval"),
     Field("M_empty", "M of the empty circuit (every edge patched: the corrupt run through the evaluator)"),
     Field("forwards", "forward and backward passes of the scores, forwards of the curves"),
     Field("pairs"), Field("intervals"), Field("seconds"), PROVENANCE),
    bounds=True)
# headscope compare (issue 42): what a compressed model kept and lost against its original; the compressing verbs
# write the same two files into their --out when they end with the check (--check, the default; docs/compare.md).
CHECKED = {"compare": "", "prune": "--save-model (unless --no-check)",
           "prune --unit": "--save-model (unless --no-check)", "gqa": "unless --no-check",
           "mla": "unless --no-check", "kvcache": "unless --no-check"}
COMPARE_CSV = Artifact(
    "compare.csv", "csv", CHECKED, "one row per capability: its value in BASE and OTHER, the paired change "
    "with its interval and the verdict (docs/compare.md)",
    (Field("capability", "lm, fidelity, ioi, induction, greater-than, masked, retrieval, pairs:<file stem>, "
                         "heads:<pair row> (what BASE's carrier heads of that task still carry), or roles:<role> (how "
                         "many heads hold the role, roles' census)"),
     Field("metric", "perplexity (lm), cosine (fidelity), logit_diff (pair tasks), needle_token_accuracy (retrieval), "
                     "carried_logit_diff (heads:<row>), heads (roles:<role>)"),
     Field("base", "the metric in BASE"), Field("other", "the metric in OTHER"),
     Field("delta", "other - base, on the same items"),
     Field("delta_lo", "lower bound of the change's paired bootstrap interval (items resampled for both models "
                       "together)"),
     Field("delta_hi", "upper bound of that interval"),
     Field("relative", "delta / |base|"),
     Field("verdict", "lost, kept, gained or cannot tell: the interval against the tolerance x |base|"),
     Field("n", "items the row was measured on (passages, pairs or haystacks)")))
COMPARE_JSON = Artifact(
    "compare.json", "json", CHECKED, "compare.csv's run: settings, both models' provenance, each row's items "
    "and per-item values",
    (Field("settings", "tolerance, interval settings, the rows measured"),
     Field("notes", "default rows left out and why"),
     Field("rows", "per row: what it measures, its items and their sha256 (fingerprint), the per-item sums of both "
                   "models (one value per item; a sum with more than one, e.g. per head, is a reference {in, key, "
                   "shape, sha256} to compare_items.npz), seconds, the change, (cannot tell) the items that would "
                   "decide it, and the --base-from folder its BASE side was reused from (or null)"),
     Field("base", "BASE's name, config and weights fingerprints"), Field("other", "OTHER's, the same"), PROVENANCE))
COMPARE_ITEMS_NPZ = Artifact(
    "compare_items.npz", "npz", {"compare": "--tasks heads (the roles:<role> rows)"}, "the per-item sums of more "
    "than one value per item (the role census's per head), exact, beside compare.json, which names each one's key "
    "and shape",
    (Field("<capability>/<model>/<sum>", "float64 [items, ...] sums of one row (roles:induction), model (base or "
                                         "other) and sum (induction_score|count): [items, layers, heads], or "
                                         "[items, 1, 1] for a sum the same on every head"),))

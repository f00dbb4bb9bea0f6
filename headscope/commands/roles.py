"""`headscope roles [MODEL]`: role census with baselines -> roles.csv, roles.json, syntax.csv."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys

from ..artifacts import ROLES_CSV, ROLES_JSON, SYNTAX_CSV, outputs
from ..data import read_conllu, read_texts
from ..io import atomic_write_text, prepare_out_dir
from ..provenance import provenance
from ..roles import roles, syntax_rows
from ..coref import read_documents
from ..syntax import RELATIONS
from ..table import to_jsonable
from ._common import add_data_args, add_model_arg, add_out_args, load_from_args

OUTPUTS = outputs("roles", optional=True)  # roles.csv, roles.json, syntax.csv (with --treebank)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("roles", help="role census: previous-token, sink, induction, syntactic, coreference heads ...",
                       description="Score every head for each role beside a baseline and name the heads that pass "
                                   "(see docs/roles.md). Writes roles.csv (analyze's statistics and a `roles` column), roles.json "
                                   "(every score, baseline and threshold) and syntax.csv (with --treebank).")
    add_model_arg(p)
    add_data_args(p)
    p.add_argument("--treebank", default=None, help="treebank for syntactic roles (Clark et al. 2019): ewt-test (built in: UD English-EWT test split) "
                        "or a CoNLL-U file")
    p.add_argument("--coref", default=None, help="coreference data: gum-test (built in: UD English-GUM test split) or a CoNLL-U file "
                        "with CorefUD Entity= annotations")
    add_out_args(p)
    p.set_defaults(func=run)


def _f(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def run(args: argparse.Namespace) -> int:
    out = prepare_out_dir(args.out, args.force, OUTPUTS)  # refuse before any slow work
    source = read_texts(args.data, args.limit)  # bad input fails before the model loads
    if args.treebank:
        read_conllu(args.treebank)
    if args.coref:
        read_documents(args.coref)
    hm = load_from_args(args)
    table = roles(hm, args.data, treebank=args.treebank, coref=args.coref, max_length=args.max_length,
                  batch_size=args.batch_size, limit=args.limit, seed=args.seed, progress=True)
    report = {**table.meta["roles"], "provenance": provenance("roles", hm, source, args)}
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / ROLES_CSV.name)
    atomic_write_text(out / ROLES_JSON.name, json.dumps(to_jsonable(report), indent=1, allow_nan=False) + "\n")
    written = [ROLES_CSV.name, ROLES_JSON.name]
    rows = syntax_rows(report)
    if rows:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
        atomic_write_text(out / SYNTAX_CSV.name, buf.getvalue())
        written.append(SYNTAX_CSV.name)

    t = report["text"]
    print(f"{hm.name}: {hm.n_layers} layers x {hm.n_heads} heads, {t['passages']} passages from {t['data']}; "
          f"first token: {t['first_token']}")
    print("\nrole census (score vs baseline: the uniform head's, the best fixed offset's, or the best coreference "
          "baseline's)")
    for role, heads in report["census"].items():
        shown = ", ".join(f"{e['head']} {_f(e['score'])}/{_f(e['baseline'])}" for e in heads[:8])
        more = f" (+{len(heads) - 8} more)" if len(heads) > 8 else ""
        print(f"  {role:<22} {len(heads):>3}  {shown}{more}")
    if not report["census"]:
        print("  no head passes any role's decision rule")
    syn = (report.get("syntax") or {}).get("relations")
    if syn:
        info = report["syntax"]["info"]
        print(f"\nsyntax ({info['sentences']} sentences, {info['skipped_long']} too long, "
              f"{info['unaligned_words']} unaligned words): best head per relation vs best fixed offset")
        print(f"  {'relation':<10} {'arcs':>6}  {'head':<6} {'acc':>5}  {'direction':<11}  {'offset':>6} {'acc':>5}")
        for rel in [r for r in RELATIONS if r in syn] + [r for r in syn if r not in RELATIONS and syn[r]["count"] >= 100]:
            r = syn[rel]
            print(f"  {rel:<10} {r['count']:>6}  {r['best_head']:<6} {_f(r['best_accuracy']):>5}  "
                  f"{r['best_direction']:<11}  {r['baseline_offset']:>+6d} {_f(r['baseline']):>5}")
    c = report.get("coreference")
    if c:
        print(f"\ncoreference ({c['anaphors']} anaphors): best head {c['best_head']} {_f(c['best_accuracy'])}, "
              f"nearest mention {_f(c['nearest_mention_baseline'])}, same head word {_f(c['same_head_word_baseline'])}, "
              f"chance {_f(c['chance'])}")
    print(f"\nwrote {', '.join(str(out / n) for n in written)}", file=sys.stderr)
    return 0

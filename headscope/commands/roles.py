"""`headscope roles [MODEL]`: role census with baselines -> roles.csv, roles.json, syntax.csv; with
`--long N` the long-range roles too (retrieval, streaming, echo, induction at N tokens) and, with
`--export-card FILE`, a head card for KV-compression tools."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import ROLES_CSV, ROLES_JSON, SYNTAX_CSV, outputs, write_csv
from ..data import read_texts
from ..distributed import check_ranks, is_main, local
from ..errors import HeadscopeError
from ..export.cards import (
    CARD_SCORES,
    card_scores,
    check_card_path,
    duo_pattern,
    head_card,
    write_card,
    write_duo,
)
from ..io import atomic_write_text, prepare_out_dir, staged
from ..learned.longctx import check_long_args, check_long_model, long_roles
from ..learned.longctx.confidence import card_record, card_warning, check_until_stable_long
from ..learned.options import RolesOptions
from ..learned.roles import read_coref, read_treebank, role_columns, roles, syntax_rows
from ..learned.syntax import RELATIONS
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..provenance import provenance
from ..table import HeadTable, to_jsonable
from ..uncertainty import check_until_stable
from ._common import interval_settings, load_from_args

OUTPUTS = outputs("roles", optional=True)  # roles.csv, roles.json, syntax.csv (with --treebank)


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "roles", RolesOptions,
        help="role census: previous-token, sink, induction, syntactic, coreference heads ...",
        description="Score every head for each role beside a baseline and name the heads that pass "
                    "(see docs/roles.md). Writes roles.csv (analyze's statistics and a `roles` column), roles.json "
                    "(every score, baseline and threshold) and syntax.csv (with --treebank).",
    )
    p.set_defaults(func=run)


DUO_SINK, DUO_RECENT = 4, 256  # what a streaming head keeps: kvcache's --sink and --window defaults


def _f(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    out = prepare_out_dir(args.out, args.force, OUTPUTS)  # refuse before any slow work
    long_n = getattr(args, "long", None)
    long_text = args.long_data
    if long_n is not None:
        check_long_args(None, long_n, args.haystacks, args.long_windows, args.stride, args.block)
        check_until_stable_long(args.until_stable, args.haystacks, args.long_windows)
        if args.long_windows:
            long_text = read_texts(args.long_data)
    card = _check_card(args)
    # Every source is read once, here, so bad input fails before the model loads; the passes get what was read.
    source = read_texts(args.data, args.limit)
    check_until_stable(args.until_stable, len(source))
    treebank = read_treebank(args.treebank) if args.treebank else None
    coref = read_coref(args.coref) if args.coref else None
    check_ranks(len(source), "passages")  # torchrun / --workers: every rank needs a passage
    hm = model or load_from_args(args)
    if long_n is not None:  # the model's positions and kind are known now: refuse before the short-text pass
        check_long_model(hm, long_n)
    table = roles(hm, source, treebank=treebank, coref=coref, max_length=args.max_length,
                  batch_size=args.batch_size, limit=args.limit, seed=args.seed, intervals=interval_settings(args),
                  until_stable=args.until_stable, progress=True)
    if not is_main():  # every rank holds the merged census; rank 0 alone runs --long, writes and prints
        return 0
    report = {**table.meta["roles"], "provenance": provenance("roles", hm, source, args)}
    card_values, card_note, card_config = None, "", None
    if long_n is not None:
        with local():  # not split across ranks (per-window maxima and needle answers): rank 0 alone
            lr = long_roles(hm, long_n, data=long_text, stride=args.stride, windows=args.long_windows,
                            haystacks=args.haystacks, block=args.block, seed=args.seed, progress=True,
                            checked=True, intervals=interval_settings(args), until_stable=args.until_stable)
        table, report = merge_long(table, report, lr)
        if card is not None:
            card_values, card_note = head_card(lr, args.card_score)
            card_config = card_record(lr, CARD_SCORES[args.card_score])
            report["long_context"]["card"] = {"file": str(card), "score": args.card_score, "note": card_note,
                                              "format": args.card_format, "config": card_config}
    rows = syntax_rows(report)
    with staged(out, args.force) as stage:  # roles.csv, roles.json (and syntax.csv) together, or none
        table.to_csv(stage / ROLES_CSV.name)
        atomic_write_text(stage / ROLES_JSON.name, json.dumps(to_jsonable(report), indent=1, allow_nan=False) + "\n")
        if rows:
            write_csv(stage, SYNTAX_CSV, rows)
    written = [str(out / ROLES_CSV.name), str(out / ROLES_JSON.name)] + ([str(out / SYNTAX_CSV.name)] if rows else [])
    if card_values is not None and card is not None:  # outside --out: written atomically once the set is in place
        written.append(_write_card(args, card, card_values, card_config, hm))

    t = report["text"]
    print(f"{hm.name}: {hm.n_layers} layers x {hm.n_heads} heads, {t['passages']} passages from {t['data']}; "
          f"first token: {t['first_token']}")
    _print_census(report)
    syn = (report.get("syntax") or {}).get("relations")
    if syn:
        info = report["syntax"]["info"]
        print(f"\nsyntax ({info['sentences']} sentences, {info['skipped_long']} too long, "
              f"{info['unaligned_words']} unaligned words): best head per relation vs best fixed offset")
        print(f"  {'relation':<10} {'arcs':>6}  {'head':<6} {'acc [95% interval]':<18}  {'direction':<11}  "
              f"{'offset':>6} {'acc':>5}")
        others = [r for r in syn if r not in RELATIONS and syn[r]["count"] >= 100]
        for rel in [r for r in RELATIONS if r in syn] + others:
            r = syn[rel]
            print(f"  {rel:<10} {r['count']:>6}  {r['best_head']:<6} {_acc(r, r['best_head']):<18}  "
                  f"{r['best_direction']:<11}  {r['baseline_offset']:>+6d} {_f(r['baseline']):>5}")
    c = report.get("coreference")
    if c:
        print(f"\ncoreference ({c['anaphors']} anaphors): best head {c['best_head']} {_acc(c, c['best_head'])}, "
              f"nearest mention {_f(c['nearest_mention_baseline'])}, "
              f"same head word {_f(c['same_head_word_baseline'])}, "
              f"chance {_f(c['chance'])}")
    lc = report.get("long_context")
    if lc:
        _print_long(lc)
        if card_note:
            print(f"  head card: {card_note}")
        if card_config is not None:
            warning = card_warning(card_config)
            if warning:
                print(f"  {warning}")
    print(f"\nwrote {', '.join(written)}", file=sys.stderr)
    return 0


def _write_card(args: argparse.Namespace, card: Path, values: dict[str, list[float]], config: dict[str, Any] | None,
                hm: Any) -> str:
    """Write the head card in --card-format, its config recording the ranking's stability and data."""
    if args.card_format == "duo":
        write_duo(card, duo_pattern(card_scores(values, hm.n_layers, hm.n_heads), hm.n_kv_heads),
                  sink=DUO_SINK, recent=DUO_RECENT, force=args.force, source=f"headscope roles: {hm.name}, "
                  f"--card-score {args.card_score}", config=config)
    else:
        write_card(card, values, config)
    return str(card)


def _acc(r: dict[str, Any], head: str) -> str:
    """The best head's accuracy with its interval over sentences (windows), where roles.json has one."""
    acc = float(r["best_accuracy"])
    if "accuracy_lo" not in r:
        return _f(acc)
    l, h = (int(x) for x in head[1:].split("H"))
    return f"{_f(acc)} [{_f(float(r['accuracy_lo'][l][h]))}, {_f(float(r['accuracy_hi'][l][h]))}]"


def _entry(e: dict[str, Any]) -> str:
    """`L0H3 0.91 [0.88, 0.93]/0.12`: a census head's score, its interval where it has one, and its baseline."""
    bounds = f" [{_f(e['lo'])}, {_f(e['hi'])}]" if "lo" in e else ""
    return f"{e['head']} {_f(e['score'])}{bounds}/{_f(e['baseline'])}"


def _print_census(report: dict[str, Any]) -> None:
    """The census with intervals, how many heads are uncertain, the scores' stability and --until-stable."""
    iv, t = report["intervals"], report["text"]
    print(f"\nrole census (score [{iv['level']:.0%} interval] / baseline: the uniform head's, the best fixed "
          f"offset's, or the best coreference baseline's); a role is assigned where its rule passes on the "
          f"interval's conservative bound")
    for role, heads in report["census"].items():
        shown = ", ".join(_entry(e) for e in heads[:8])
        more = f" (+{len(heads) - 8} more)" if len(heads) > 8 else ""
        print(f"  {role:<22} {len(heads):>3}  {shown}{more}")
    if not report["census"]:
        print("  no head passes any role's decision rule on its bound")
    n = report["uncertain_heads"]
    if n:
        counts: dict[str, int] = {}
        for names in report["uncertain"].values():
            for r in names:
                counts[r] = counts.get(r, 0) + 1
        detail = ", ".join(f"{r} {c}" for r, c in sorted(counts.items(), key=lambda kv: -kv[1]))
        print(f"  uncertain: {n} head(s) pass a rule on the point estimate but not on its bound ({detail}); "
              f"roles.csv's uncertain_roles names them")
    else:
        print("  uncertain: no head (every role passing on its point estimate passes on its bound too)")
    print(f"  intervals: {iv['method']} bootstrap, {iv['B']} resamples of the {t['passages']} passages (induction: "
          f"of the {report['induction']['sequences']} sequences), seed {iv['seed']}")
    stab = {k: v for k, v in report["stability"].items() if isinstance(v.get("spearman_brown"), float)
            and math.isfinite(v["spearman_brown"])}
    if stab:
        worst = min(stab, key=lambda k: stab[k]["spearman_brown"])
        print(f"  stability: split-half Spearman-Brown of the role scores' rankings from "
              f"{min(v['spearman_brown'] for v in stab.values()):.2f} ({worst}) to "
              f"{max(v['spearman_brown'] for v in stab.values()):.2f}; every score's in roles.json")
    u = t.get("until_stable")
    if u:
        state = "reached" if u["reached"] else "NOT reached"
        now = min(u["stability"].values()) if u["stability"] else math.nan
        print(f"  --until-stable {u['target']}: {state} with {u['passages']} of the {u['available']} passages "
              f"available (lowest text-score stability {_f(now)})"
              + ("" if u["reached"] else "; raise --limit or give more data"))


def _check_card(args: argparse.Namespace) -> Path | None:
    """The head-card path, refused before any work when it cannot be written or would replace a file."""
    if getattr(args, "export_card", None) is None:
        return None
    if args.long is None:
        raise HeadscopeError("--export-card needs --long N (the card holds long-range scores)")
    return check_card_path(args.export_card, args.card_format, args.force)


def merge_long(table: HeadTable, report: dict[str, Any], lr: dict[str, Any]) -> tuple[HeadTable, dict[str, Any]]:
    """roles.csv gains the long-range score columns and roles; roles.json their census and `long_context`."""
    shape = (table.n_layers, table.n_heads)
    bounds = (lr.get("uncertainty") or {}).get("bounds", {})
    cols: dict[str, np.ndarray] = {}
    for name in role_columns("long"):  # every long-range score with its interval (NaN: under 2 haystacks/windows)
        cols[name] = np.asarray(lr["scores"][name], float) if name in lr["scores"] else np.full(shape, np.nan)
        for side in ("lo", "hi"):
            cols[f"{name}_{side}"] = np.asarray(bounds[name][side], float) if name in bounds else np.full(shape, np.nan)
    role_col = np.array(table["roles"], dtype=object).reshape(shape)
    roles_map = dict(report["roles"])
    for head, names in lr["roles"].items():
        l, h = (int(x) for x in head[1:].split("H"))
        role_col[l, h] = ";".join([r for r in str(role_col[l, h]).split(";") if r] + names)
        roles_map[head] = list(roles_map.get(head, [])) + names
    table = table.with_columns({"roles": role_col, **cols})
    report = {**report, "roles": roles_map, "census": {**report["census"], **lr["census"]}, "long_context": lr}
    return table, report


def _print_long(lc: dict[str, Any]) -> None:
    """The long-range census, needle accuracy and the windows scored."""
    print(f"\nlong-range roles at {lc['length']} tokens (score/baseline)")
    t = lc.get("text")
    if t:
        print(f"  text: {t['windows']} window(s) of {t['data']}, {t['counted_tokens']} queries counted; streaming = "
              f"sink {t['sink']} + recent {t['recent']}, echo/induction at distance >= {t['far']}")
    n = lc.get("needles")
    if n:
        print(f"  needles: {len(n['haystacks'])} haystack(s), answered exactly {n['needle_accuracy']:.2f}, "
              f"answer tokens right {n['token_accuracy']:.2f}; retrieval score over the {n['succeeded']} answered")
    stab = (lc.get("uncertainty") or {}).get("stability", {})
    if stab:
        print("  split-half stability of the rankings (Spearman-Brown): " + ", ".join(
            f"{k} {_f(v['spearman_brown'])} ({v['passages']} {'haystacks' if k.startswith('retrieval') else 'windows'})"
            for k, v in stab.items()) + "; intervals in roles.csv (<score>_lo/_hi)")
    u = lc.get("until_stable")
    if u:
        print(f"  --until-stable {u['target']}: {u['haystacks']} of up to {u['haystacks_cap']} haystacks, "
              f"{u['windows']} of up to {u['windows_cap']} windows")
    for role, heads in lc["census"].items():
        shown = ", ".join(f"{e['head']} {_f(e['score'])}/{_f(e['baseline'])}" for e in heads[:8])
        more = f" (+{len(heads) - 8} more)" if len(heads) > 8 else ""
        print(f"  {role:<22} {len(heads):>3}  {shown}{more}")
    if not lc["census"]:
        print("  no head passes a long-range role's rule")

"""Role scores with their intervals: oracles on hand-built heads, batch-size invariance on every family,
held shares, the conservative-bound decision, --until-stable for roles, and the CLI's bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headscope.cli import main
from headscope.learned.roles import RoleSettings, Thresholds, roles
from headscope.learned.roles.confidence import role_intervals, split_roles
from headscope.stats import COUNT
from headscope.uncertainty import IntervalSettings, PassageSums
from tests.families import FAMILIES, model
from tests.test_passages import _passages, _rel
from tests.test_roles import REPEAT, positional_model


@pytest.mark.parametrize("family", FAMILIES)
def test_role_scores_their_intervals_and_roles_do_not_depend_on_the_batch_size(family):
    hm = model(family)
    data = _passages(hm)
    tables = {b: roles(hm, data, RoleSettings(batch_size=b, max_length=64, repeat_length=REPEAT, n_sequences=5, seed=1))
              for b in (1, 3, 16)}
    first = tables[1]
    assert {"sink_mass_lo", "sink_mass_hi", "induction_score_lo", "uniform_distance_hi"} <= set(first.columns)
    for b in (3, 16):
        for col in first.columns:
            if col in ("roles", "uncertain_roles"):
                assert np.array_equal(first[col], tables[b][col]), f"{family}: {col} at batch {b}"
                continue
            diff = _rel(first[col], tables[b][col])
            assert diff < 1e-6, f"{family}: {col} at batch {b} differs by {diff:.2e} from batch 1"
        for role, share in first.meta["roles"]["held_share"].items():
            diff = _rel(share, tables[b].meta["roles"]["held_share"][role])
            assert diff < 1e-6, f"{family}: held share of {role} at batch {b} differs by {diff:.2e}"
    # layers without softmax heads (Qwen3.5's linear attention) score NaN and have NaN bounds, nothing else
    for col in ("sink_mass", "offset_m2_mass", "induction_score"):
        v, lo, hi = (np.asarray(first[c], float) for c in (col, f"{col}_lo", f"{col}_hi"))
        assert np.array_equal(np.isnan(v), np.isnan(lo)) and np.array_equal(np.isnan(v), np.isnan(hi)), col
        ok = ~np.isnan(v)
        assert np.all(lo[ok] <= v[ok] + 1e-12) and np.all(v[ok] <= hi[ok] + 1e-12), col
        if hm.headless_layers:
            assert np.isnan(v[list(hm.headless_layers)]).all(), col
    for share in first.meta["roles"]["held_share"].values():
        s = np.asarray(share, float)
        assert np.all((s[~np.isnan(s)] >= 0) & (s[~np.isnan(s)] <= 1))


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_strong_previous_token_head_stays_above_and_a_dead_head_holds_zero(family):
    """Head 0 puts all its weight on the previous token: its lower bound stays above the 0.5 threshold, it
    holds the role in every resample and is assigned it. Heads 0, 2, 6 never look ahead (dead for the
    next-token role): their next-token mass's interval holds 0 and no resample gives them that role."""
    hm = positional_model(family)
    g = torch.Generator().manual_seed(3)
    data = [torch.randint(5, 100, (n,), generator=g).tolist() for n in (16, 14, 12, 16, 10, 15, 13, 11)]
    table = roles(hm, data, RoleSettings(repeat_length=REPEAT, n_sequences=6, batch_size=4))
    rep = table.meta["roles"]
    th = Thresholds()
    prev = rep["score_intervals"]["offset_m1_mass"]
    assert np.asarray(prev["lo"], float)[0, 0] > th.offset_mass
    assert rep["held_share"]["previous_token"][0][0] == 1.0
    assert "previous_token" in table["roles"][0, 0].split(";")
    assert "previous_token" not in table["uncertain_roles"][0, 0].split(";")
    assert rep["decided_on"]["previous_token"] == "bound"
    entry = next(e for e in rep["census"]["previous_token"] if e["head"] == "L0H0")
    assert entry["lo"] > th.offset_mass and entry["lo"] <= entry["score"] <= entry["hi"]
    if not hm.causal:
        nxt = rep["score_intervals"]["offset_p1_mass"]
        for h in (0, 2, 6):
            lo, hi = float(np.asarray(nxt["lo"])[0, h]), float(np.asarray(nxt["hi"])[0, h])
            assert lo <= 1e-6 and hi >= 0.0 and hi < 1e-3, (h, lo, hi)
            assert rep["held_share"]["next_token"][0][h] == 0.0, h


def test_a_noisy_score_at_its_threshold_is_uncertain_and_a_clear_one_assigned():
    """Simulated per-passage sink masses: a head at 0.9 is assigned, a head whose mean sits just above the
    threshold with wide passage-to-passage spread passes on its estimate but not its bound (uncertain)."""
    rng = np.random.default_rng(0)
    n = 40
    queries = np.full((n, 1, 2), 20.0)
    mass = np.stack([rng.beta(90, 10, n), np.clip(rng.normal(0.52, 0.25, n), 0, 1)], 1)[:, None, :] * queries
    base = np.full_like(queries, 0.05) * queries
    sums = PassageSums({"sink_mass": mass, "sink_mass" + COUNT: queries,
                        "sink_mass_uniform": base, "sink_mass_uniform" + COUNT: queries})
    th = Thresholds()
    iv = role_intervals([sums], th, IntervalSettings(B=400, seed=3))
    value = mass.sum(0) / queries.sum(0)
    assert value[0, 1] > th.sink_mass  # the point estimate passes
    lo = iv.bounds["sink_mass"][0]
    assert lo[0, 0] > th.sink_mass and lo[0, 1] < th.sink_mass
    assert iv.held_share["sink"][0, 0] == 1.0 and 0.2 < iv.held_share["sink"][0, 1] < 0.9
    point = {(0, 0): ["sink"], (0, 1): ["sink"]}
    sure = {(0, 0): ["sink"]}
    assigned, uncertain = split_roles(point, sure, iv.roles)
    assert assigned == {(0, 0): ["sink"]} and uncertain == {(0, 1): ["sink"]}
    # a role without intervals (not decided on bounds) is assigned on its estimate
    assigned, uncertain = split_roles({(0, 1): ["coreference"]}, {}, iv.roles)
    assert assigned == {(0, 1): ["coreference"]} and not uncertain


def test_same_seed_same_role_intervals():
    hm = model("llama")
    data = _passages(hm, 6)

    def seeded(seed):
        return RoleSettings(repeat_length=REPEAT, n_sequences=4, max_length=64,
                            intervals=IntervalSettings(B=200, seed=seed))

    a, b = (roles(hm, data, seeded(7)) for _ in range(2))
    c = roles(hm, data, seeded(8))
    assert np.array_equal(a["sink_mass_lo"], b["sink_mass_lo"]) and np.array_equal(a["sink_mass_hi"], b["sink_mass_hi"])
    assert not np.array_equal(a["sink_mass_lo"], c["sink_mass_lo"])
    assert a.meta["roles"]["intervals"] == {"level": 0.95, "B": 200, "method": "bca", "seed": 7,
                                            "resampled": "passages, with replacement"}


def test_until_stable_reads_chunks_and_says_whether_it_reached(tmp_path):
    hm = model("gpt2")
    data = _passages(hm, 40, seed=2) * 1
    # an easy target is reached before the data runs out, at a chunk's end; an impossible one reads everything
    easy = roles(hm, data, RoleSettings(repeat_length=REPEAT, n_sequences=4, max_length=48, until_stable=0.05, chunk=8))
    u = easy.meta["roles"]["text"]["until_stable"]
    used = u["passages"]
    assert u["reached"] and used < 40 and used % 8 == 0 and easy.meta["roles"]["text"]["passages"] == used
    assert min(u["stability"].values()) >= 0.05
    assert easy.meta["roles"]["stability"]["sink_mass"]["passages"] == used
    hard = roles(hm, data, RoleSettings(repeat_length=REPEAT, n_sequences=4, max_length=48, until_stable=0.999999,
                                        chunk=8))
    u = hard.meta["roles"]["text"]["until_stable"]
    assert not u["reached"] and u["passages"] == 40 and u["available"] == 40
    # the passages read are the first ones: the same as a plain run on them
    plain = roles(hm, data[:used], RoleSettings(repeat_length=REPEAT, n_sequences=4, max_length=48))
    for col in ("sink_mass", "sink_mass_lo", "entropy", "entropy_hi"):
        assert _rel(easy[col], plain[col]) < 1e-6, col  # float32 forwards of other batches: rounding only


@pytest.mark.parametrize("argv, message", [
    (["--ci", "1.5"], "--ci"), (["--bootstrap", "50"], "--bootstrap"), (["--until-stable", "1.0"], "--until-stable"),
    (["--until-stable", "0.9", "--limit", "5"], "at least 8 passages"),
])
def test_roles_bad_uncertainty_options_are_refused_before_anything_is_written(tmp_path, capsys, argv, message):
    out = tmp_path / "o"
    rc = main(["roles", "minilm", "--out", str(out), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_roles_cli_writes_bounds_uncertain_roles_and_intervals(tmp_path, capsys):
    out = tmp_path / "r"
    rc = main(["roles", "minilm", "--limit", "10", "--max-length", "32", "--bootstrap", "200", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "uncertain:" in text and "intervals: bca bootstrap, 200 resamples of the 10 passages" in text
    header = (out / "roles.csv").read_text().splitlines()[0].split(",")
    assert {"sink_mass_lo", "sink_mass_hi", "uncertain_roles", "entropy_lo"} <= set(header)
    rep = json.loads((out / "roles.json").read_text())
    assert rep["intervals"]["B"] == 200 and rep["uncertain_heads"] == len(rep["uncertain"])
    for head, names in rep["uncertain"].items():
        assert not set(names) & set(rep["roles"][head]), head


# --- syntax and coreference accuracies over sentences ------------------------------------------------
def test_per_sentence_hits_add_up_and_do_not_depend_on_the_batch_size(minilm):
    """Each sentence's hits sum to the totals, the better-direction accuracy of the summed rows is the
    reported one, and batches of 1, 3 and 16 give the same per-sentence rows and intervals."""
    from headscope.data import read_conllu
    from headscope.learned.roles.confidence import RoleIntervals, add_member
    from headscope.learned.syntax import best_accuracy, dependency_accuracy

    sents = read_conllu("ewt-test")[:12]
    runs = {b: dependency_accuracy(minilm, sents, max_length=96, batch_size=b) for b in (1, 3, 16)}
    c = runs[1]
    for rel in ("det", "nsubj", "case"):
        sums = c.relation_sums(rel)
        assert sums.rows == c.sentences
        assert np.array_equal(sums.total()[f"{rel}|dep_to_head"], c.dep_to_head[rel])
        assert sums.total()[f"{rel}|count"] == c.total[rel]
        assert np.allclose(best_accuracy(rel)(sums.total()), c.accuracy(rel, "best"))
        bounds = {}
        for b, run in runs.items():
            assert np.array_equal(run.relation_sums(rel)[f"{rel}|head_to_dep"], sums[f"{rel}|head_to_dep"]), (b, rel)
            iv = RoleIntervals()
            bounds[b] = add_member(iv, "syntactic", rel, run.relation_sums(rel), best_accuracy(rel),
                                   np.full((6, 12), 0.3), Thresholds(), IntervalSettings(B=200))
        for b in (3, 16):
            assert np.array_equal(bounds[1][0], bounds[b][0]) and np.array_equal(bounds[1][1], bounds[b][1])
        lo, hi = bounds[1]
        acc = c.accuracy(rel, "best")
        assert np.all(lo <= acc + 1e-12) and np.all(acc <= hi + 1e-12) and np.all((lo >= 0) & (hi <= 1))


def test_a_sure_syntactic_head_is_assigned_and_a_coin_flip_is_not():
    """Simulated per-sentence hits: a head right on 90% of 300 arcs clears a 0.5 baseline + 0.1 margin on its
    lower bound; one right on 25 of 40 arcs (0.625) passes on its estimate only (its bound is below 0.6)."""
    from headscope.learned.roles.confidence import RoleIntervals, add_member
    from headscope.learned.syntax import best_accuracy

    rng = np.random.default_rng(5)

    def sums(p: float, sentences: int) -> PassageSums:
        hits = rng.permutation(np.arange(sentences) < round(p * sentences)).astype(float)[:, None, None]
        return PassageSums({"det|dep_to_head": hits, "det|head_to_dep": np.zeros_like(hits),
                            "det|count": np.ones(sentences)})

    iv = RoleIntervals()
    th = Thresholds()
    lo_sure, _ = add_member(iv, "syntactic", "det", sums(0.9, 300), best_accuracy("det"), np.full((1, 1), 0.5), th,
                            IntervalSettings(B=400))
    assert lo_sure[0, 0] >= 0.6 and iv.held_share["syntactic:det"][0, 0] > 0.99
    iv = RoleIntervals()
    s = sums(0.625, 40)
    assert float(best_accuracy("det")(s.total())[0, 0]) == 0.625  # the estimate passes 0.5 + 0.1
    lo, _ = add_member(iv, "syntactic", "det", s, best_accuracy("det"), np.full((1, 1), 0.5), th,
                       IntervalSettings(B=400))
    assert lo[0, 0] < 0.6 and 0.3 < iv.held_share["syntactic:det"][0, 0] < 0.95
    assert "syntactic:det" in iv.roles and iv.conservative["syntax_det"][0, 0] == lo[0, 0]


def test_coreference_windows_add_up(minilm):
    from headscope.learned.coref import COREF_ACCURACY, coreference_accuracy, read_documents
    from headscope.learned.roles.assign import _limit_docs

    docs, _ = read_documents("gum-test")
    c, _ = coreference_accuracy(minilm, _limit_docs(docs, 30), max_length=96, batch_size=5)
    sums = c.window_sums()
    assert np.array_equal(sums.total()["hits"], c.hits)
    assert np.all(sums.total()["hits|count"] == c.total)
    assert np.allclose(COREF_ACCURACY(sums.total()), np.asarray(c.to_dict()["accuracy"]))


# --- similar: the js of the top pairs over passages ----------------------------------------------------
def test_per_passage_js_adds_up_and_its_intervals_do_not_depend_on_the_batch_size():
    from headscope.learned.similarity import SimilaritySettings, similarity

    hm = model("bert")
    data = _passages(hm, 7)
    sims = {b: similarity(hm, data, SimilaritySettings(batch_size=b, max_length=64, cka_batch=8, weights=False))
            for b in (1, 3, 16)}
    s = sims[1]
    rows = s.js_rows
    assert rows.rows == 7 and float(rows.total()["js|count"]) == s.meta["js_queries"]
    assert np.allclose(rows.total()["js"] / rows.total()["js|count"], s["js"], atol=1e-12)
    pairs = [("L0H0", "L0H1"), ("L0H1", "L1H0"), ("L1H0", "L1H1")]
    lo, hi = s.js_intervals(pairs, IntervalSettings(B=300))
    value = np.array([s.pair(a, b)["js"] for a, b in pairs])
    assert np.all(lo <= value + 1e-12) and np.all(value <= hi + 1e-12) and np.all(hi > lo)
    for b in (3, 16):
        assert _rel(sims[b]["js"], s["js"]) < 1e-6, b
        lo_b, hi_b = sims[b].js_intervals(pairs, IntervalSettings(B=300))
        assert _rel(lo_b, lo) < 1e-6 and _rel(hi_b, hi) < 1e-6, b


# --- tasks: Spearman between rankings over heads -----------------------------------------------------------
def test_spearman_interval_over_heads_covers_the_true_rank_correlation():
    """Heads as a sample: 72 heads from a bivariate normal with correlation 0.6, whose Spearman is
    (6/pi) asin(0.3); the 95% interval holds it in 93-97% of 1,000 simulated data sets."""
    import math

    from headscope.uncertainty import spearman, spearman_interval

    rng = np.random.default_rng(11)
    rho = 0.6
    truth = 6 / math.pi * math.asin(rho / 2)
    hits = 0
    for _ in range(1000):
        x = rng.normal(size=72)
        y = rho * x + math.sqrt(1 - rho ** 2) * rng.normal(size=72)
        lo, hi = spearman_interval(spearman(x, y), 72)
        hits += lo <= truth <= hi
    assert 0.93 <= hits / 1000 <= 0.97, hits / 1000
    assert all(math.isnan(v) for v in spearman_interval(0.5, 3))


# --- kvcache: chosen heads against random heads at equal bytes, needles --------------------------------------
def test_paired_perplexity_difference_and_its_verdict():
    import math

    from headscope.capacity.kvcache.paired import add_paired, perplexity_difference
    from headscope.uncertainty import binomial_interval

    rng = np.random.default_rng(4)
    tokens = rng.integers(200, 400, 12).astype(float)
    base = rng.normal(3.0, 0.3, 12) * tokens  # per-passage summed NLL of the random control
    better = base - 0.05 * tokens  # 0.05 nats per token better on every passage
    st = IntervalSettings(B=400)
    d = perplexity_difference({"passage_nll": better, "passage_tokens": tokens},
                              {"passage_nll": base, "passage_tokens": tokens}, st)
    want = math.exp(better.sum() / tokens.sum()) - math.exp(base.sum() / tokens.sum())
    assert abs(d["difference"] - want) < 1e-12 and d["lo"] < want < d["hi"] < 0
    assert d["verdict"].startswith("the chosen heads beat random heads beyond noise") and d["B"] == 400
    # the same caches on noisy passages: the paired difference holds 0
    noisy = base + rng.normal(0, 0.05, 12) * tokens
    d = perplexity_difference({"passage_nll": noisy, "passage_tokens": tokens},
                              {"passage_nll": base, "passage_tokens": tokens}, st)
    assert d["lo"] < 0 < d["hi"] and d["verdict"].startswith("not distinguishable")
    # rows: the score row gets its control's paired difference; needles their exact interval
    answers = [{"correct": c} for c in (True, True, False, True)]
    rows = [{"method": "score", "budget": 0.25, "passage_nll": better, "passage_tokens": tokens, "needles": 4,
             "answers": answers},
            {"method": "random", "budget": 0.25, "passage_nll": base, "passage_tokens": tokens, "needles": 4,
             "answers": answers[::-1]}]
    add_paired(rows, st)
    assert rows[0]["ppl_vs_random_hi"] < 0 and "ppl_vs_random" not in rows[1]
    assert (rows[0]["needle_accuracy_lo"], rows[0]["needle_accuracy_hi"]) == binomial_interval(3, 4)


# --- the report: intervals on role scores and bars, uncertain heads grey -----------------------------------
def test_report_reads_role_intervals_and_marks_uncertain_heads(tmp_path):
    from headscope.report.heads import heads_part
    from headscope.report.roles import census_rows, role_bar_rows, role_scores, roles_part
    from headscope.report.sources import Sources

    hm = model("bert")
    settings = RoleSettings(repeat_length=REPEAT, n_sequences=4, max_length=64, intervals=IntervalSettings(B=200),
                            thresholds=Thresholds(sink_mass=0.0, min_ratio=0.0))
    table = roles(hm, _passages(hm, 8), settings)
    rj = json.loads(json.dumps(table.meta["roles"], default=lambda a: np.asarray(a).tolist()))
    # make one sink head uncertain by hand: its role moves from the census to `uncertain`
    head = rj["census"]["sink"][0]["head"]
    rj["census"]["sink"] = rj["census"]["sink"][1:]
    rj["uncertain"] = {head: ["sink"]}
    rows = census_rows(rj["census"], rj["uncertain"])
    sink = next(r for r in rows if r["role"] == "sink")
    assert sink["uncertain"] == 1 and "[" in sink["best"]
    rec = role_scores(rj, 2, hm.n_heads)[head]["sink_mass"]
    assert rec["lo"] <= rec["score"] <= rec["hi"] and 0.0 <= rec["held in resamples"] <= 1.0
    bars = role_bar_rows(rj)
    grey = [b for b in bars if b["uncertain"]]
    assert grey == [{**grey[0], "role": "sink", "head": head}] and grey[0]["lo"] <= grey[0]["score"]
    (tmp_path / "roles.json").write_text(json.dumps(rj))
    figs: dict[str, bytes] = {}  # the report draws its figures into memory; the page's save writes them
    part = roles_part(Sources.scan([tmp_path]), 2, hm.n_heads, figs)
    assert figs["report-roles.png"][:4] == b"\x89PNG" and "report-roles.png" in part.plots
    cells = np.array(table["uncertain_roles"], dtype=object)
    cells[0, 0] = "sink"
    grid = heads_part(table.with_columns({"uncertain_roles": cells}), Sources.scan([tmp_path]), None, "[CLS]")
    assert grid.data["uncertain"][0] == "sink"
    assert any("marked uncertain (grey in the grid)" in s for s in grid.text["q1"])

"""The report's long-range section reads roles.json's `long_context` (and says what to run without it)."""

from __future__ import annotations

import json

from headscope.artifacts import ROLES_JSON
from headscope.report.longctx import longctx_part
from headscope.report.sources import Sources


def _roles_json(tmp_path, long_context=None):
    keys = {f.name: None for f in ROLES_JSON.fields if f.required}
    keys.update({"model": "m", "n_layers": 1, "n_heads": 2, "causal": True, "thresholds": {}, "scores": {},
                 "baselines": {}, "roles": {}, "census": {}})
    if long_context is not None:
        keys["long_context"] = long_context
    (tmp_path / ROLES_JSON.name).write_text(json.dumps(keys))
    return Sources.scan([tmp_path])


def test_long_section(tmp_path):
    lc = {"length": 2048, "scores": {"retrieval_score": [[0.05, 0.4]], "streaming_share": [[0.95, 0.2]]},
          "baselines": {"retrieval_score_uniform": [[0.001, 0.001]], "streaming_share_uniform": [[0.3, 0.3]]},
          "census": {"retrieval": [{"head": "L0H1", "score": 0.4, "baseline": 0.001}],
                     "streaming": [{"head": "L0H0", "score": 0.95, "baseline": 0.3}]},
          "needles": {"haystacks": [{"exact": True}, {"exact": False}], "token_accuracy": 0.6, "succeeded": 1}}
    part = longctx_part(_roles_json(tmp_path, lc))
    (panel,) = part.panels
    rows = {r["role"].split(" ")[0]: r for r in panel["rows"]}
    assert rows["retrieval"]["best head"] == "L0H1" and rows["retrieval"]["score"] == 0.4
    assert rows["retrieval"]["uniform baseline"] == 0.001 and rows["retrieval"]["heads"] == 1
    assert rows["streaming"]["best head"] == "L0H0" and rows["streaming"]["holders"] == "L0H0"
    assert "1 of 2" in panel["text"][0] and part.text["q1"]


def test_long_section_missing(tmp_path):
    (panel,) = longctx_part(_roles_json(tmp_path)).panels
    assert "--long" in panel["note"] and not panel["rows"]
    assert not longctx_part(Sources.scan([tmp_path / "nothing"])).panels  # no roles.json: the roles section says so

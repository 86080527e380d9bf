"""Self-contained HTML pages for a dump comparison and for a diagnosis.

One file, no network: the CSS and the JavaScript are inline, the data is embedded as JSON. The
page shows each record's error along execution order (layers shaded, the culprit marked), a
per-layer summary, a sortable and filterable table of records, the replay verdicts and the
checklist diffs.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._atomic import atomic_write
from ..compare._results import DumpComparison, RecordComparison, layer_of

if TYPE_CHECKING:
    from ..diagnosis._results import Diagnosis
    from ..replay._verdict import ReplayResult
    from ..runtime._environment import ChecklistDiff


def _num(value: float | None) -> float | str | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else str(value)


def _record(index: int, r: RecordComparison) -> dict[str, Any]:
    m = r.metrics
    return {
        "i": index,
        "name": r.name,
        "slot": r.slot,
        "op": r.op,
        "module": r.module or "",
        "layer": layer_of(r.module) or "",
        "step": r.step,
        "rank": r.rank,
        "status": r.status,
        "error": _num(r.error_level),
        "cosine": _num(getattr(m, "cosine", None)),
        "max_abs": _num(getattr(m, "max_abs_err", None)),
        "dtype": r.target_dtype or "",
        "shape": "" if r.shape is None else "x".join(map(str, r.shape)),
        "reason": r.reason,
    }


def _layers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        layer = row["layer"] or "(outside layers)"
        entry = out.setdefault(
            layer,
            {
                "layer": layer,
                "first": row["i"],
                "last": row["i"],
                "records": 0,
                "fail": 0,
                "warn": 0,
                "worst": 0.0,
            },
        )
        entry["last"] = row["i"]
        entry["records"] += 1
        if row["status"] in ("fail", "warn"):
            entry[row["status"]] += 1
        error = row["error"]
        level = math.inf if isinstance(error, str) else (error or 0.0)
        entry["worst"] = max(entry["worst"], level)
    for entry in out.values():
        entry["worst"] = _num(entry["worst"])
    return list(out.values())


def comparison_data(result: DumpComparison) -> dict[str, Any]:
    rows = [_record(i, r) for i, r in enumerate(result.records)]
    d = result.first_divergence
    culprit = None
    if d is not None:
        culprit = next((i for i, r in enumerate(result.records) if r is d.record), None)
    return {
        "verdict": result.verdict,
        "golden": str(result.golden.path),
        "target": str(result.target.path),
        "counts": result.counts(),
        "matched_calls": result.matched_calls,
        "unmatched": [f"{u.side}: {u.name}" for u in result.unmatched],
        "records": rows,
        "layers": _layers(rows),
        "culprit": culprit,
        "different_models": None
        if result.different_models is None
        else result.different_models.to_dict(),
        "divergence": None
        if d is None
        else {
            "name": d.name,
            "module": d.module,
            "layer": d.layer,
            "cause": d.cause,
            "reason": d.reason,
            "step": d.step,
            "rank": d.rank,
        },
    }


def _replay_data(r: ReplayResult) -> dict[str, Any]:
    return {"name": r.name, "device": r.device, "verdict": r.verdict, "reason": r.reason}


def _diff_data(diff: ChecklistDiff | None) -> list[dict[str, Any]] | None:
    if diff is None:
        return None
    return [
        {"key": c.key, "golden": str(c.golden), "target": str(c.target), "category": c.category}
        for c in diff.changes
    ]


def diagnosis_data(d: Diagnosis) -> dict[str, Any]:
    return {
        "finding": d.finding,
        "first_token": list(d.first_token),
        "step": d.step,
        "steps": [{"name": s.name, "finding": s.finding} for s in d.steps],
        "replays": [_replay_data(r) for r in d.replays],
        "exported_test": None if d.exported_test is None else str(d.exported_test),
        "config": _diff_data(d.config_diff),
        "environment": _diff_data(d.environment_diff),
        "weights": [
            {
                "key": w.name,
                "golden": str(w.golden),
                "target": str(w.target),
                "category": w.statistic,
            }
            for w in d.weight_changes
        ],
        "golden_tokens": [list(r) for r in d.golden_tokens],
        "target_tokens": [list(r) for r in d.target_tokens],
        "comparison": None if d.comparison is None else comparison_data(d.comparison),
    }


#: Inside the JSON script block, the characters that could end it, open a comment or a tag, or
#: (U+2028, U+2029) end a line in older JavaScript: JSON's own escapes keep the value exact.
_JSON_IN_SCRIPT = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)

_PLACEHOLDER = re.compile("%(TITLE|KIND|DATA)%")


def _page(title: str, kind: str, data: dict[str, Any]) -> str:
    """The template with its placeholders filled in one pass: a name that holds ``%DATA%``
    stays that text, as nothing is substituted into what was already substituted."""
    parts = {
        "TITLE": html.escape(title, quote=True),
        "KIND": json.dumps(kind).translate(_JSON_IN_SCRIPT),
        "DATA": json.dumps(data, allow_nan=False).translate(_JSON_IN_SCRIPT),
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _TEMPLATE)


def dump_comparison_html(result: DumpComparison) -> str:
    """The page for a :class:`DumpComparison`."""
    return _page(
        f"pytest-precision: {result.verdict}", "comparison", {"comparison": comparison_data(result)}
    )


def diagnosis_html(d: Diagnosis) -> str:
    """The page for a :class:`Diagnosis`."""
    culprit = f" - {d.divergence.name}" if d.divergence is not None else ""
    return _page(
        f"pytest-precision diagnosis: {d.finding}{culprit}", "diagnosis", diagnosis_data(d)
    )


def golden_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The session's golden records as flat rows (scalars only; nested values as JSON)."""
    keys: list[str] = []
    for record in records:
        keys += [k for k in record if k not in keys]
    front = [k for k in ("test", "name", "status", "reason") if k in keys]
    order = front + [k for k in keys if k not in front]
    return [
        {
            k: _num(v)
            if isinstance(v, float)
            else (v if isinstance(v, (str, int, bool)) or v is None else json.dumps(v, default=str))
            for k in order
            for v in [record.get(k)]
        }
        for record in records
    ]


def goldens_html(records: list[dict[str, Any]]) -> str:
    """The page for a session's golden comparisons (``--precision-html``): one row per item."""
    return _page("pytest-precision: goldens", "goldens", {"goldens": records})


def write_html(path: str | os.PathLike[str], page: str) -> Path:
    """Write ``page`` to ``path``, making missing folders as ``--json`` and ``--csv`` do."""
    target = Path(path)
    atomic_write(target, page.encode())
    return target


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%TITLE%</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#eee;cursor:pointer;user-select:none}tr.fail td{background:#fde2e2}
tr.warn td{background:#fff4d6}tr.culprit td{background:#f88;font-weight:bold}
.verdict{font-weight:bold;padding:2px 8px;border-radius:4px;background:#eee}
.verdict.bad{background:#f88}.verdict.ok{background:#9d9}
#chart{border:1px solid #ccc;background:#fff}.muted{color:#777}
ol.steps li{margin:2px 0}code{background:#f4f4f4;padding:0 3px}
</style></head><body>
<h1 id="title">%TITLE%</h1>
<div id="summary"></div>
<div id="dumpview">
<h2>Error along execution order</h2>
<p class="muted">Relative error of each record (log scale); shaded bands are layers, the red
line is the culprit.</p>
<svg id="chart" width="960" height="260" role="img" aria-label="error per record"></svg>
<h2>Per layer</h2><div id="layers"></div>
<h2>Records</h2>
<p><input id="filter" placeholder="filter: name, module, reason" size="40">
<select id="status"><option value="">every status</option><option>fail</option>
<option>warn</option><option>pass</option><option>skip</option></select>
<span id="shown" class="muted"></span></p>
<div id="records"></div>
</div>
<script type="application/json" id="data">%DATA%</script>
<script>
"use strict";
const KIND = %KIND%;
const DATA = JSON.parse(document.getElementById("data").textContent);
const SVG = "http://www.w3.org/2000/svg";
// Every value from the data goes in as a text node or an attribute value, never as markup:
// names come from dumps made elsewhere, and markup in them must show as text.
function el(tag, attrs, ...kids) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(k == null ? "" : String(k)));
  return e;
}
const fmt = v => v == null ? "" : (typeof v === "number" ? (Math.abs(v) < 1e-3 && v !== 0 ?
  v.toExponential(2) : +v.toPrecision(4)) : v);
function table(rows, cols, cls) {
  const head = el("thead", null, el("tr", null, ...cols.map(c => el("th", null, c))));
  const body = el("tbody", null, ...rows.map(r => el("tr", cls ? {class: cls(r)} : null,
    ...cols.map(c => el("td", null, fmt(r[c]))))));
  return el("table", null, head, body);
}
const summary = document.getElementById("summary");
if (KIND === "diagnosis") {
  const bad = DATA.finding !== "no difference";
  summary.append(el("p", null, "Finding: ", el("span", {class: "verdict " + (bad ? "bad" : "ok")}, DATA.finding),
    " first divergent token per row: " + DATA.first_token.map(p => p == null ? "equal" : p).join(", ")));
  summary.append(el("h2", null, "Steps"), el("ol", {class: "steps"},
    ...DATA.steps.map(s => el("li", null, el("b", null, s.name), ": ", s.finding))));
  summary.append(el("h2", null, "Replay"), DATA.replays.length ?
    table(DATA.replays, ["name", "device", "verdict", "reason"]) : el("p", {class: "muted"}, "no op replayed"));
  if (DATA.exported_test) summary.append(el("p", null, "Exported test: ", el("code", null, DATA.exported_test)));
  summary.append(el("h2", null, "Checklist"));
  for (const [label, diff] of [["config", DATA.config], ["environment", DATA.environment], ["weights", DATA.weights]]) {
    if (diff == null) continue;
    summary.append(el("h3", null, label), diff.length ? table(diff, ["key", "golden", "target", "category"]) :
      el("p", {class: "muted"}, "no difference"));
  }
} else if (KIND === "goldens") {
  summary.append(table(DATA.goldens, Object.keys(DATA.goldens[0] || {test: ""}),
    r => r.status === "fail" ? "fail" : (r.status === "warn" ? "warn" : "")));
}
const C = DATA.comparison || null;
if (C) {
  summary.append(el("h2", null, "Dump comparison"), el("p", null, "Verdict: ",
    el("span", {class: "verdict " + (C.verdict === "pass" ? "ok" : "bad")}, C.verdict), " ", C.golden, " vs ", C.target));
  const m = C.different_models;
  if (m) summary.append(el("p", null, "Not the same model: ", m.differing.length, " of ", m.compared,
    " parameters differ in name or shape, first: ", m.differing.slice(0, 3).map(x => x.name).join(", ")));
  const d = C.divergence;
  if (d) summary.append(el("p", null, "Culprit: ", el("b", null, d.name), " in ", el("code", null, d.module),
    " (layer ", d.layer, "), cause ", d.cause, ": ", d.reason));
}
if (!DATA.comparison) document.getElementById("dumpview").style.display = "none";
const records = C ? C.records : [];
const level = r => typeof r.error === "string" ? Infinity : (r.error || 0);
function chart() {
  const svg = document.getElementById("chart"), W = 960, H = 260, P = 30;
  if (!records.length) { svg.append(el("svg:text", {x: 20, y: 40}, "no records")); return; }
  const ys = records.map(level).map(v => v > 0 ? Math.log10(Math.min(v, 1e6)) : -12);
  const lo = Math.min(-8, ...ys), hi = Math.max(1, ...ys.filter(isFinite));
  const x = i => P + (W - 2 * P) * (records.length > 1 ? i / (records.length - 1) : 0.5);
  const y = v => H - P - (H - 2 * P) * (v - lo) / (hi - lo || 1);
  C.layers.forEach((l, k) => { if (l.layer !== "(outside layers)") svg.append(
    el("svg:rect", {x: x(l.first), y: P, width: Math.max(1, x(l.last) - x(l.first)), height: H - 2 * P,
      fill: k % 2 ? "#eef3ff" : "#f6f9ff"}, el("svg:title", null, l.layer)),
    el("svg:text", {x: x(l.first), y: P - 4, "font-size": 10}, l.layer)); });
  svg.append(el("svg:polyline", {fill: "none", stroke: "#36c", "stroke-width": 1,
    points: ys.map((v, i) => x(i) + "," + y(v)).join(" ")}));
  records.forEach((r, i) => { if (r.status === "fail") svg.append(el("svg:circle",
    {cx: x(i), cy: y(ys[i]), r: 2, fill: "#c33"}, el("svg:title", null, r.name + " " + r.slot))); });
  if (C.culprit != null) svg.append(el("svg:line", {id: "culprit", x1: x(C.culprit), x2: x(C.culprit), y1: P,
    y2: H - P, stroke: "red", "stroke-width": 2}, el("svg:title", null, "culprit")));
  for (let e = Math.ceil(lo); e <= hi; e += 2) svg.append(el("svg:text", {x: 2, y: y(e), "font-size": 10}, "1e" + e));
}
chart();
if (C) document.getElementById("layers").append(table(C.layers, ["layer", "records", "fail", "warn", "worst"],
  l => l.fail ? "fail" : (l.warn ? "warn" : "")));
const COLS = ["i", "name", "slot", "module", "status", "error", "cosine", "max_abs", "dtype", "shape", "reason"];
let sortKey = "i", sortDir = 1;
function render() {
  const q = document.getElementById("filter").value.toLowerCase(), st = document.getElementById("status").value;
  const rows = records.filter(r => (!st || r.status === st) &&
    (!q || (r.name + " " + r.module + " " + r.reason + " " + r.slot).toLowerCase().includes(q)));
  rows.sort((a, b) => { const u = sortKey === "error" ? level(a) : a[sortKey], v = sortKey === "error" ? level(b) : b[sortKey];
    return (u < v ? -1 : u > v ? 1 : 0) * sortDir; });
  const box = document.getElementById("records");
  box.replaceChildren(table(rows, COLS, r => (C && r.i === C.culprit ? "culprit " : "") + r.status));
  box.querySelectorAll("th").forEach((th, k) => th.onclick = () => {
    sortDir = sortKey === COLS[k] ? -sortDir : 1; sortKey = COLS[k]; render(); });
  document.getElementById("shown").textContent = rows.length + " of " + records.length + " records";
}
document.getElementById("filter").oninput = render;
document.getElementById("status").onchange = render;
render();
document.body.setAttribute("data-rendered", "yes");
</script></body></html>
"""  # noqa: E501 (inline JavaScript)

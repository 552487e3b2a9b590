"""bench_peers' statistics and formatting: medians over repetitions, ratios, the Markdown tables."""

from __future__ import annotations

import statistics

from peer_adapters import JC_SYSTEMS


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(records: list[dict], systems: list[str], workloads: list[str]) -> dict:
    """Medians per (system, workload) and per-repetition ratios to mp and to ipp."""
    by = {(r["system"], r["rep"]): r for r in records}
    reps = sorted({r["rep"] for r in records})
    out: dict = {}
    for s in systems:
        rs = [by[(s, k)] for k in reps if (s, k) in by]
        row: dict = {
            "startup_s": median([r.get("startup_s") for r in rs]),
            "cluster_start_s": median([r.get("cluster_start_s") for r in rs]),
            "preload_s": median([r.get("preload_s") for r in rs]),
            "first_map_s": median([r.get("first_map_s") for r in rs]),
            "stop_s": median([r.get("stop_s") for r in rs]),
            "errors": sorted({r["error"] for r in rs if r.get("error")}),
            "skipped": {k: v for r in rs for k, v in r.get("skipped", {}).items()},
            "leaked_pids": [p for r in rs for p in r.get("leaked_pids", [])],
            "reps_ok": sum(1 for r in rs if r.get("ok")),
            "workloads": {},
        }
        for name in workloads:
            ws = [r["workloads"][name] for r in rs if name in r.get("workloads", {})]
            if not ws:
                continue
            cell = {
                "reps": len(ws),
                "items": ws[0].get("items"),
                "wall_s": median([w["wall_s"] for w in ws]),
                "wall_min_s": min(w["wall_s"] for w in ws),
                "wall_max_s": max(w["wall_s"] for w in ws),
                "ideal_s": median([w.get("ideal_s") for w in ws]),
                "efficiency": median([w.get("efficiency") for w in ws]),
                "us_per_item": median([w.get("us_per_item") for w in ws]),
                "overhead_us_per_item": median([w.get("overhead_us_per_item") for w in ws]),
                "cpu_driver_s": median([w.get("cpu", {}).get("driver_s") for w in ws]),
                "cpu_rest_s": median([w.get("cpu", {}).get("rest_s") for w in ws]),
                "correct": all(w.get("correct", False) for w in ws),
            }
            for key in (
                "transfers_per_worker",
                "mb_transferred",
                "deserialisations",
                "on_over_off",
                "wall_off_s",
                "efficiency_off",
            ):
                if key in ws[0]:
                    cell[key] = median([w.get(key) for w in ws])
            chunks = [w["job"]["chunks"] for w in ws if w.get("job") and w["job"].get("chunks") is not None]
            if chunks:
                cell["chunks"] = median(chunks)
            for base, key, field in (
                ("mp", "ratio_to_mp", "wall_s"),
                ("ipp", "speedup_vs_ipp", "wall_s"),
                ("ipp", "overhead_speedup_vs_ipp", "overhead_us_per_item"),
            ):
                ratios = []
                for k in reps:
                    mine, theirs = by.get((s, k)), by.get((base, k))
                    if not mine or not theirs:
                        continue
                    a = mine.get("workloads", {}).get(name, {}).get(field)
                    b = theirs.get("workloads", {}).get(name, {}).get(field)
                    if a and b:
                        ratios.append(a / b if key == "ratio_to_mp" else b / a)
                cell[key] = median(ratios)
            row["workloads"][name] = cell
        for base, key in (("mp", "startup_ratio_to_mp"),):
            ratios = [
                by[(s, k)]["startup_s"] / by[(base, k)]["startup_s"]
                for k in reps
                if (s, k) in by and (base, k) in by and by[(s, k)].get("startup_s") and by[(base, k)].get("startup_s")
            ]
            row[key] = median(ratios)
        out[s] = row
    return out


# -- formatting ----------------------------------------------------------------------------
def fmt(v, kind="num"):
    if v is None:
        return "—"
    if kind == "pct":
        return f"{100 * v:.0f} %"
    if kind == "x":
        return f"{v:.2f}×" if v < 10 else f"{v:.0f}×"
    if kind == "us":
        return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"
    if kind == "s":
        return f"{v:.3f}" if v < 1 else f"{v:.2f}"
    return f"{v:.3g}"


def tables(summary: dict, systems: list[str], workloads: list[str]) -> str:
    main_cols = [
        ("start-up s", lambda r: fmt(r["startup_s"], "s")),
        ("first map s", lambda r: fmt(r.get("first_map_s"), "s")),
        ("noop µs/item", lambda r: _w(r, "noop", "us_per_item", "us")),
        ("noop100k µs/item", lambda r: _w(r, "noop100k", "us_per_item", "us")),
        ("sleep1ms eff", lambda r: _w(r, "sleep1ms", "efficiency", "pct")),
        ("sleep10ms eff", lambda r: _w(r, "sleep10ms", "efficiency", "pct")),
        ("cpu10ms eff", lambda r: _w(r, "cpu10ms", "efficiency", "pct")),
        ("tail eff", lambda r: _w(r, "tail", "efficiency", "pct")),
        ("bigarray s", lambda r: _w(r, "bigarray", "wall_s", "s")),
        ("bigarray transfers/worker", lambda r: _w(r, "bigarray", "transfers_per_worker")),
    ]
    keep = {
        "noop": "noop µs/item",
        "noop100k": "noop100k µs/item",
        "sleep1ms": "sleep1ms eff",
        "sleep10ms": "sleep10ms eff",
        "cpu10ms": "cpu10ms eff",
        "tail": "tail eff",
        "bigarray": "bigarray",
    }
    cols = [c for c in main_cols if not any(c[0].startswith(v) and k not in workloads for k, v in keep.items())]
    lines = ["| system | " + " | ".join(c[0] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for s in systems:
        if s in summary:
            lines.append(f"| `{s}` | " + " | ".join(c[1](summary[s]) for c in cols) + " |")
    ratio_wls = [
        w for w in ("noop", "noop100k", "sleep1ms", "sleep10ms", "cpu10ms", "tail", "bigarray") if w in workloads
    ]
    if "mp" in summary:
        lines += _ratio_tables(summary, systems, workloads, ratio_wls)
    else:
        lines += ["", "(no `mp` in this run: no ratios to multiprocessing)"]
    if "ipp" in summary:
        lines += _ipp_table(summary, systems, workloads)
    lines += _notes(summary, systems, workloads)
    return "\n".join(lines)


def _ratio_tables(summary, systems, workloads, ratio_wls):
    lines = [
        "",
        "Wall time ÷ `mp` (multiprocessing.Pool, chunksize=1), median of per-repetition ratios (< 1: faster than mp):",
        "",
    ]
    lines += ["| system | start-up | " + " | ".join(ratio_wls) + " |", "|---" * (len(ratio_wls) + 2) + "|"]
    for s in systems:
        if s in summary:
            r = summary[s]
            cells = [fmt(r.get("startup_ratio_to_mp"), "x")] + [_w(r, w, "ratio_to_mp", "x") for w in ratio_wls]
            lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    return lines


def _ipp_table(summary, systems, workloads):
    lines = [
        "",
        "Speed-up over ipyparallel: wall (ipp wall ÷ system wall) and overhead per item "
        "((wall − ideal) ÷ items, ipp ÷ system); target for jupyter_cluster ≥ 30× on noop and sleep1ms.",
        "",
    ]
    sp_wls = [w for w in ("noop", "sleep1ms", "sleep10ms", "cpu10ms") if w in workloads]
    head = [f"{w} wall" for w in sp_wls] + [f"{w} overhead" for w in sp_wls if w != "noop"]
    lines += ["| system | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for s in systems:
        if s in summary and s != "ipp":
            cells = [_w(summary[s], w, "speedup_vs_ipp", "x") for w in sp_wls]
            cells += [_w(summary[s], w, "overhead_speedup_vs_ipp", "x") for w in sp_wls if w != "noop"]
            lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    return lines


def _notes(summary, systems, workloads):
    extra = []
    for s in systems:
        r = summary.get(s)
        if not r:
            continue
        if r.get("cluster_start_s") is not None:
            extra.append(
                f"- `{s}`: `%cluster start` (the run's workers) took {fmt(r['cluster_start_s'], 's')} s (median), after "
                f"`%load_ext jupyter_cluster` had imported the engine in the background "
                f"({fmt(r.get('preload_s'), 's')} s still to wait when the start-up clock began)."
            )
        p = r["workloads"].get("progress")
        if p:
            extra.append(
                f"- `{s}`: progress widget + job telemetry on vs off, {p['items']:,} items: "
                f"{fmt(p['wall_s'], 's')} s vs {fmt(p.get('wall_off_s'), 's')} s (on ÷ off = {p.get('on_over_off', 0):.3f}; "
                f"efficiency {fmt(p.get('efficiency'), 'pct')} vs {fmt(p.get('efficiency_off'), 'pct')})."
            )
        b = r["workloads"].get("bigarray")
        if b:
            extra.append(
                f"- `{s}`: bigarray moved {b.get('mb_transferred', 0):,.0f} MB "
                f"({b.get('deserialisations')} deserialisations in worker processes) for {b['items']:,} items."
            )
        if r["errors"]:
            extra.append(f"- `{s}`: errors: {'; '.join(r['errors'])}")
        for k, v in r["skipped"].items():
            if k in workloads and k not in ("bigarray", "progress"):
                extra.append(f"- `{s}`: {k} skipped: {v}")
        if r["leaked_pids"]:
            extra.append(f"- `{s}`: processes left behind and ended by pid: {r['leaked_pids']}")
        wrong = [w for w, c in r["workloads"].items() if not c["correct"]]
        if wrong:
            extra.append(f"- `{s}`: WRONG RESULTS in {', '.join(wrong)}")
    return ["", "Notes:", ""] + extra if extra else []


def _w(row, name, key, kind="num"):
    return fmt(row["workloads"].get(name, {}).get(key), kind)


def targets(summary: dict) -> str:
    """The issue's targets for the jupyter_cluster front ends, measured vs wanted."""
    checks = [
        ("sleep1ms efficiency ≥ 95 %", "sleep1ms", "efficiency", lambda v: v >= 0.95, "pct"),
        ("cpu10ms efficiency ≥ 95 %", "cpu10ms", "efficiency", lambda v: v >= 0.95, "pct"),
        ("sleep10ms efficiency ≥ 98 %", "sleep10ms", "efficiency", lambda v: v >= 0.98, "pct"),
        ("noop faster than mp chunksize=1 (ratio < 1)", "noop", "ratio_to_mp", lambda v: v < 1, "x"),
        ("noop100k < 10 µs per item", "noop100k", "us_per_item", lambda v: v < 10, "us"),
        ("≥ 30× ipp on noop", "noop", "speedup_vs_ipp", lambda v: v >= 30, "x"),
        ("≥ 30× ipp on sleep1ms (wall)", "sleep1ms", "speedup_vs_ipp", lambda v: v >= 30, "x"),
        ("≥ 30× ipp on sleep1ms (overhead per item)", "sleep1ms", "overhead_speedup_vs_ipp", lambda v: v >= 30, "x"),
        ("bigarray ≈ 1 transfer per worker", "bigarray", "transfers_per_worker", lambda v: v <= 1.5, "num"),
        ("progress on within 5 % of off", "progress", "on_over_off", lambda v: v <= 1.05, "num"),
    ]
    jc = [s for s in JC_SYSTEMS if s in summary]
    if not jc:
        return ""
    lines = ["| target | " + " | ".join(f"`{s}`" for s in jc) + " |", "|---" * (len(jc) + 1) + "|"]
    for label, wname, key, ok, kind in checks:
        cells = []
        for s in jc:
            v = summary[s]["workloads"].get(wname, {}).get(key)
            cells.append("—" if v is None else f"{fmt(v, kind)} {'✓' if ok(v) else '✗'}")
        if any(c != "—" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    cs = summary.get("jc-parallel", {}).get("cluster_start_s")
    if cs is not None:
        lines.append(f"| `%cluster start` < 2 s | {fmt(cs, 's')} s {'✓' if cs < 2 else '✗'} |" + " |" * (len(jc) - 1))
    return "\n".join(lines)

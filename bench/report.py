#!/usr/bin/env python3
"""Turn sheaf-bench JSON lines into a markdown report and a gnuplot bar chart.

Usage:
    python3 bench/report.py RESULTS.jsonl [more.jsonl ...]
        [--markdown OUT.md] [--plot OUT.png]
        [--title "..."] [--machine "free text"] [--command "how to reproduce"]

Input: the output of `sheaf-bench --json` (one JSON object per line), any
number of files ("-" reads stdin).  Lines that are not JSON objects (human
text, progress output, blank lines) are skipped, as are objects without the
"workload", "system" and "trees_per_sec" fields.  Bare nan/inf tokens, which
printf-style writers produce, are accepted.  If the same measurement (same
workload, device, mode, hidden, batch, threads, system and strategy) appears
more than once, the last one read wins and a note goes to stderr.

Results are grouped by (workload, device, mode, hidden, batch).  Everything
is generic: any workload, device, hidden size, batch size or sheaf strategy
that appears in the input gets its own table, row, column or bar.  When a
table mixes runs with different --threads values, threads becomes part of
the row as well.  Workloads that report a "steps" field (e.g. shift_reduce)
get a "steps" column: sequential steps per batch for each kind of system.

Outputs (at least one of --markdown / --plot is required):

  --markdown OUT.md  A title, the machine description (--machine), a
      "how to reproduce" line (--command), the plot (linked relative to
      OUT.md, when one was written), then one table per workload+device,
      with rows = (mode, hidden, batch) and columns: per-example trees/s,
      each sheaf strategy's trees/s, hand trees/s, best sheaf strategy,
      best sheaf / hand, best sheaf / per-example, then for the best
      strategy: launches per batch, trace+schedule ms per batch and that as
      a % of the batch's wall time (1000 * batch / trees_per_sec ms),
      the largest max |diff| vs per-example over all systems of the row, and
      (train) the largest gradient difference from per-example over its
      largest gradient.

  --plot OUT.png  ONE png file, drawn by gnuplot (pngcairo): grouped bars of
      trees/s on a log y axis, one group per configuration (x labels like
      "train h128 b64"), one bar per system (per-example, each sheaf
      strategy, hand).  Each workload+device gets its own panel; with more
      than one, the panels are stacked vertically in the same file
      (multiplot) and the image grows by about 450 px per panel (width
      1000 px, a single panel is 1000x600).  The gnuplot data and script are
      written to a temporary directory that is removed afterwards.  If
      gnuplot is not installed a warning is printed and the markdown is
      still written (exit status 0); if gnuplot fails, its error is printed
      and the exit status is 3.

Exit status: 0 on success, 2 on bad usage, unreadable input or no JSON
results at all, 3 if gnuplot ran and failed.

Needs only the Python 3 standard library (and gnuplot for the plot).
"""

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

SHEAF = "sheaf"
PER_EXAMPLE = "per-example"
HAND = "hand"
HAND_ALT = "hand-alt"  # another hand version (hand:<variant>): shown beside hand, not ranked
KNOWN_STRATEGIES = ["lazy", "agenda", "depth"]  # display order; others follow in input order
MODE_ORDER = {"train": 0, "infer": 1}

# printf("%g") writes nan / -nan / inf / -inf, which JSON does not allow.
_BARE_NONFINITE = re.compile(r'(?<=[:\[,])(\s*)(-?)(nan|inf)\b', re.IGNORECASE)


def warn(msg):
    print("report.py: " + msg, file=sys.stderr)


def die(msg, status=2):
    warn(msg)
    sys.exit(status)


def _fix_nonfinite(line):
    def repl(m):
        if m.group(3).lower() == "nan":
            return m.group(1) + "NaN"
        return m.group(1) + ("-Infinity" if m.group(2) else "Infinity")
    return _BARE_NONFINITE.sub(repl, line)


def parse_line(line):
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        try:
            obj = json.loads(_fix_nonfinite(line))
        except ValueError:
            return None
    return obj if isinstance(obj, dict) else None


def num(rec, key):
    """A finite-or-not float from rec[key], or None if absent / not a number."""
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def read_results(paths):
    records, skipped, bad = [], 0, 0
    for path in paths:
        try:
            f = sys.stdin if path == "-" else open(path, encoding="utf-8", errors="replace")
        except OSError as e:
            die("cannot read %s: %s" % (path, e))
        with f:
            for line in f:
                rec = parse_line(line)
                if rec is None:
                    if line.strip():
                        skipped += 1
                    continue
                if not isinstance(rec.get("workload"), str) or not isinstance(rec.get("system"), str) \
                        or num(rec, "trees_per_sec") is None:
                    bad += 1
                    continue
                records.append(rec)
    if skipped:
        warn("skipped %d non-JSON line(s)" % skipped)
    if bad:
        warn("skipped %d JSON object(s) without workload/system/trees_per_sec" % bad)
    return records


def cfg_value(rec, key):
    v = rec.get(key)
    return None if v is None or v == "" else v


def sort_key_value(v):
    """Sort numbers numerically, then strings, then missing values."""
    if v is None:
        return (2, 0, "")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, v, "")
    return (1, 0, str(v))


class Row:
    """All systems measured for one configuration of one table."""

    def __init__(self, mode, hidden, batch, threads):
        self.mode, self.hidden, self.batch, self.threads = mode, hidden, batch, threads
        self.per_example = None  # record
        self.hand = None         # record
        self.hand_alt = {}       # variant -> record ("hand:<variant>": other hand code, or a kernel reference)
        self.sheaf = {}          # strategy -> record
        self.steps = {}          # system label -> its "steps" value

    def label(self, with_threads):
        parts = [str(self.mode) if self.mode is not None else "?"]
        if self.hidden is not None:
            parts.append("h%s" % self.hidden)
        if self.batch is not None:
            parts.append("b%s" % self.batch)
        if with_threads and self.threads is not None:
            parts.append("t%s" % self.threads)
        return " ".join(parts)

    def best_sheaf(self, helper=None):
        """(strategy, record) with the highest trees/s, or (None, None). A "+prefetch"
        strategy records the next batch on a second host thread, and a "+overlap" one
        runs the batch as two parts on two threads (their kernels one at a time), so
        each is ranked apart (helper="+prefetch" or "+overlap") from the one-thread
        strategies."""
        best = (None, None)
        for strategy, rec in self.sheaf.items():
            if helper_of(strategy) != helper:
                continue
            tps = num(rec, "trees_per_sec")
            if tps is None or math.isnan(tps):
                continue
            if best[1] is None or tps > num(best[1], "trees_per_sec"):
                best = (strategy, rec)
        return best

    def records(self):
        out = [r for r in (self.per_example, self.hand) if r is not None]
        return out + list(self.hand_alt.values()) + list(self.sheaf.values())


class Table:
    """One workload on one device."""

    def __init__(self, workload, device):
        self.workload, self.device = workload, device
        self.rows = {}        # (mode, hidden, batch, threads) -> Row
        self.strategies = []  # sheaf strategies in display order
        self.other_systems = []  # systems that are neither per-example, sheaf nor hand
        self.hand_alts = []      # hand variants measured, in the order first seen
        self.thread_values = set()

    @property
    def name(self):
        return "%s on %s" % (self.workload, self.device if self.device is not None else "?")

    def has_steps(self):
        return any(row.steps for row in self.rows.values())

    def sorted_rows(self):
        def key(row):
            return (MODE_ORDER.get(row.mode, len(MODE_ORDER)), str(row.mode), sort_key_value(row.hidden),
                    sort_key_value(row.batch), sort_key_value(row.threads))
        return sorted(self.rows.values(), key=key)

    def mixed_threads(self):
        return len(self.thread_values) > 1


def keep(by_name, names, name, rec):
    """Files rec under name (a sheaf strategy, a hand variant), listing the name
    in the table's display order once; whether it replaced an earlier record."""
    replaced = name in by_name
    by_name[name] = rec
    if name not in names:
        names.append(name)
    return replaced


def build_tables(records):
    tables = {}   # (workload, device) -> Table, in order of first appearance
    duplicates = 0
    for rec in records:
        tkey = (rec["workload"], cfg_value(rec, "device"))
        table = tables.get(tkey)
        if table is None:
            table = tables[tkey] = Table(*tkey)
        threads = cfg_value(rec, "threads")
        table.thread_values.add(threads)
        rkey = (cfg_value(rec, "mode"), cfg_value(rec, "hidden"), cfg_value(rec, "batch"), threads)
        row = table.rows.get(rkey)
        if row is None:
            row = table.rows[rkey] = Row(*rkey)
        system = rec["system"]
        if system == PER_EXAMPLE:
            duplicates += row.per_example is not None
            row.per_example = rec
        elif system == HAND:
            duplicates += row.hand is not None
            row.hand = rec
        elif system == HAND_ALT:
            duplicates += keep(row.hand_alt, table.hand_alts, str(rec.get("strategy") or "alt"), rec)
        elif system == SHEAF:
            duplicates += keep(row.sheaf, table.strategies, str(rec.get("strategy") or "default"), rec)
        else:
            if system not in table.other_systems:
                table.other_systems.append(system)
            continue
        steps = rec.get("steps")
        if steps is not None:
            # One figure per kind of system: per-example (sequential), sheaf (batched rounds), hand.
            label = "sheaf" if rec.get("system") == "sheaf" else rec.get("system")
            row.steps.setdefault(label, steps)
    if duplicates:
        warn("%d measurement(s) appeared more than once; the last one read was used" % duplicates)
    for table in tables.values():
        known = [s for s in KNOWN_STRATEGIES if s in table.strategies]
        table.strategies = known + [s for s in table.strategies if s not in known]
        if table.other_systems:
            warn("%s: ignored unknown system(s): %s" % (table.name, ", ".join(table.other_systems)))
    # Drop tables whose rows hold nothing we know how to show.
    return [t for t in tables.values() if any(r.records() for r in t.rows.values())]


# ---------------------------------------------------------------- formatting

DASH = "–"


def fmt_tps(v):
    if v is None:
        return DASH
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if abs(v) < 10:
        return "%.1f" % v
    return "{:,}".format(int(round(v)))


def fmt_ratio(v):
    if v is None or math.isnan(v) or math.isinf(v):
        return DASH
    return "%.2fx" % v


def fmt_count(v):
    if v is None or math.isnan(v):
        return DASH
    if abs(v - round(v)) < 0.05:
        return "%d" % round(v)
    return "%.1f" % v


def fmt_ms(v):
    if v is None or math.isnan(v):
        return DASH
    if v >= 100:
        return "%.0f" % v
    if v >= 10:
        return "%.1f" % v
    return "%.2f" % v


def fmt_pct(v):
    if v is None or math.isnan(v) or math.isinf(v):
        return DASH
    return "%.0f%%" % v if v >= 10 else "%.1f%%" % v


def relative_grad_diff(row):
    """Train rows: the largest gradient difference from per-example over the
    row's systems, over per-example's largest gradient (None: not measured)."""
    scale = num(row.per_example, "max_abs_grad") if row.per_example is not None else None
    diffs = [num(r, "max_abs_grad_diff_vs_per_example") for r in row.records() if r is not row.per_example]
    diffs = [d for d in diffs if d is not None]
    if not diffs or not scale:
        return None
    return max(diffs) / scale


def fmt_diff(v):
    if v is None:
        return DASH
    if math.isnan(v):
        return "**nan**"
    if v == 0:
        return "0"
    return "%.1e" % v


def fmt_plain(v):
    if isinstance(v, float) and v == int(v):
        return str(int(v))
    return str(v)


def md_escape(s):
    return str(s).replace("|", "\\|")


def tps_of(rec):
    return None if rec is None else num(rec, "trees_per_sec")


HELPERS = ("+prefetch", "+overlap")


def helper_of(strategy):
    """"+prefetch" or "+overlap" for a system with a second host thread (its
    label "auto+prefetch", "auto+overlap/seq"), else None."""
    for h in HELPERS:
        if h in str(strategy):
            return h
    return None


def safe_div(a, b):
    if a is None or b is None or b == 0 or math.isnan(b):
        return None
    return a / b


def table_markdown(table):
    threads_col = table.mixed_threads()
    steps_col = table.has_steps()
    head = ["mode", "hidden", "batch"]
    if threads_col:
        head.append("threads")
    if steps_col:
        head.append("steps")
    head.append("per-example trees/s")
    head += ["sheaf %s trees/s" % s for s in table.strategies]
    helper_cols = [h for h in HELPERS if any(helper_of(s) == h for s in table.strategies)]
    head += ["hand trees/s"]
    head += ["hand:%s trees/s" % v for v in table.hand_alts]
    head += ["best sheaf", "best sheaf / hand"]
    auto_col = "auto" in table.strategies
    if auto_col:
        head.append("auto / hand")
    head += ["best sheaf / hand:%s" % v for v in table.hand_alts]
    head += ["best sheaf / per-example"]
    head += ["best %s / hand" % h for h in helper_cols]
    head += ["launches / batch", "trace+sched ms / batch", "trace+sched % of wall", "max \\|diff\\| vs per-example",
             "train: max \\|grad diff\\| / max \\|grad\\|"]
    align = ["---"] * (3 + threads_col + steps_col) + ["---:"] * (len(head) - 3 - threads_col - steps_col)
    align[head.index("best sheaf")] = "---"
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]

    for row in table.sorted_rows():
        cells = [md_escape(row.mode if row.mode is not None else DASH),
                 md_escape(row.hidden if row.hidden is not None else DASH),
                 md_escape(row.batch if row.batch is not None else DASH)]
        if threads_col:
            cells.append(md_escape(row.threads if row.threads is not None else DASH))
        if steps_col:
            cells.append(md_escape(", ".join(f"{k} {fmt_plain(v)}" for k, v in row.steps.items()) if row.steps else DASH))
        pe = tps_of(row.per_example)
        hand = tps_of(row.hand)
        cells.append(fmt_tps(pe))
        for s in table.strategies:
            cells.append(fmt_tps(tps_of(row.sheaf.get(s))))
        cells.append(fmt_tps(hand))
        for v in table.hand_alts:
            cells.append(fmt_tps(tps_of(row.hand_alt.get(v))))
        strategy, best = row.best_sheaf()
        best_tps = tps_of(best)
        cells.append(md_escape(strategy) if strategy else DASH)
        cells.append(fmt_ratio(safe_div(best_tps, hand)))
        if auto_col:
            cells.append(fmt_ratio(safe_div(tps_of(row.sheaf.get("auto")), hand)))
        for v in table.hand_alts:
            cells.append(fmt_ratio(safe_div(best_tps, tps_of(row.hand_alt.get(v)))))
        cells.append(fmt_ratio(safe_div(best_tps, pe)))
        for h in helper_cols:
            cells.append(fmt_ratio(safe_div(tps_of(row.best_sheaf(helper=h)[1]), hand)))
        if best is not None:
            launches = num(best, "launches_per_batch")
            trace, sched = num(best, "trace_ms_per_batch"), num(best, "sched_ms_per_batch")
            overhead = None if trace is None and sched is None else (trace or 0.0) + (sched or 0.0)
            batch = row.batch if isinstance(row.batch, (int, float)) and not isinstance(row.batch, bool) else None
            wall_ms = safe_div(1000.0 * batch, best_tps) if batch is not None else None
            pct = None if overhead is None else safe_div(100.0 * overhead, wall_ms)
            cells += [fmt_count(launches), fmt_ms(overhead), fmt_pct(pct)]
        else:
            cells += [DASH, DASH, DASH]
        diffs = [num(r, "max_abs_diff_vs_per_example") for r in row.records() if r is not row.per_example]
        diffs = [d for d in diffs if d is not None]
        if any(math.isnan(d) for d in diffs):
            cells.append(fmt_diff(float("nan")))
        else:
            cells.append(fmt_diff(max(diffs)) if diffs else DASH)
        cells.append(fmt_diff(relative_grad_diff(row)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def describe_values(table, key, label):
    values = []
    for row in table.rows.values():
        for rec in row.records():
            v = cfg_value(rec, key)
            if v is not None and v not in values:
                values.append(v)
    if not values:
        return None
    values.sort(key=sort_key_value)
    return "%s %s" % (label, ", ".join(fmt_plain(v) for v in values))


def write_markdown(path, tables, args, plot_written):
    out = ["# " + (args.title or "Sheaf benchmark results"), ""]
    if args.machine:
        out += ["**Machine:** " + args.machine.strip(), ""]
    if args.command:
        out += ["**How to reproduce:** `" + args.command.strip().replace("`", "'") + "`", ""]
    sources = ", ".join("`%s`" % os.path.basename(p) if p != "-" else "stdin" for p in args.results)
    out += ["Generated by `bench/report.py` from %s." % sources, ""]
    if plot_written:
        md_dir = os.path.dirname(os.path.abspath(path))
        rel = os.path.relpath(os.path.abspath(args.plot), md_dir).replace(os.sep, "/")
        out += ["![trees/s per configuration and system](%s)" % rel, ""]

    for table in tables:
        out += ["## %s" % md_escape(table.name), ""]
        facts = [d for d in (describe_values(table, "trees", "items per timed pass:"),
                             describe_values(table, "repeat", "timed passes (median reported):"),
                             describe_values(table, "threads", "threads:")) if d]
        if facts:
            out += ["; ".join(facts) + ".", ""]
        out += table_markdown(table)
        out.append("")

    out += [
        "Columns: trees/s is the median over the timed passes. *best sheaf* is the fastest sheaf "
        "one-thread strategy of the row; the ratios, launches and trace+schedule time are that strategy's. "
        "Picked after the fact from several noisy medians, it reads high: *auto / hand* is the ratio of "
        "Sheaf's default strategy, chosen before the run. "
        "A *+prefetch* system records and schedules the next batch on a second host thread while the "
        "current one runs (sheaf::Prefetcher); it is ranked apart in *best +prefetch / hand*. "
        "A *+overlap* system runs the batch as two parts on two threads whose kernels take turns: one "
        "part's host work (recording, control flow, scheduling) while the other's kernels run "
        "(sheaf::Overlap); it is ranked apart in *best +overlap / hand*. "
        "A strategy ending in */seq* runs the same model written with Sheaf's sequence ops "
        "(dsl::lstm over a sentence's rows, dsl::attention) instead of cell by cell; */inline* records "
        "its sheaf::Functions op by op; */eager* runs every node as soon as it can, also while control "
        "flow waits (GraphOptions::defer_unawaited off); */unpacked* leaves every product to OpenBLAS "
        "(GraphOptions::pack_weights off: no weights laid out once for Sheaf's product kernel). "
        "A *hand:VARIANT* column is another hand-batched version beside *hand* (docs/benchmarks.md): "
        "other LibTorch code (hand:mask, hand:lstm, hand:bmm), or hand code given Sheaf's own kernels "
        "(hand:sheaf-gemm, hand:sheaf-cell: how much of a lead is the kernel), each with its ratio. "
        "*trace+sched % of wall* compares trace+schedule time per batch with the wall time per batch "
        "(1000 × batch / trees/s ms). *max |diff|* is the largest difference from the per-example "
        "outputs over all systems of the row; *max |grad diff| / max |grad|* (training rows) the largest "
        "difference of any parameter's gradient of the first batch from per-example's, over the largest "
        "per-example gradient.",
        "",
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


# ---------------------------------------------------------------- plotting

# per-example grey, sheaf strategies in blues/greens/purples, hand orange.
PER_EXAMPLE_COLOR = "#8c8c8c"
HAND_COLOR = "#e6550d"
SHEAF_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#393b79", "#637939", "#7b4173", "#3182bd"]


def gp_quote(s):
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def panel_series(table):
    """[(title, color, getter)] for the bars of one panel."""
    series = [("per-example", PER_EXAMPLE_COLOR, lambda r: r.per_example)]
    for i, s in enumerate(table.strategies):
        series.append(("sheaf " + s, SHEAF_COLORS[i % len(SHEAF_COLORS)], lambda r, s=s: r.sheaf.get(s)))
    series.append(("hand", HAND_COLOR, lambda r: r.hand))
    return series


def write_plot(path, tables, args):
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        warn("gnuplot not found; no plot written (install gnuplot to get %s)" % path)
        return False
    n = len(tables)
    width, height = 1000, 600 if n == 1 else 450 * n + 60
    with tempfile.TemporaryDirectory(prefix="sheaf-report-") as tmp:
        script = [
            "set terminal pngcairo noenhanced size %d,%d font 'Sans,10'" % (width, height),
            "set output %s" % gp_quote(os.path.abspath(path)),
            "set datafile separator '\\t'",
            "set datafile missing '?'",
            "set style data histograms",
            "set style histogram clustered gap 1",
            "set style fill solid 0.9 border rgb '#333333'",
            "set boxwidth 0.9",
            "set logscale y 10",
            "set format y '%.0s%c'",
            "set ylabel 'trees/s (log scale)'",
            "set grid ytics mytics lc rgb '#dddddd'",
            "set mytics 10",
            "set xtics nomirror scale 0",
            "set ytics nomirror",
            "set key outside right top vertical Left reverse samplen 2 spacing 1.3",
            "set rmargin 18",
        ]
        if n > 1:
            script.append("set multiplot layout %d,1 title %s font ',13'"
                          % (n, gp_quote(args.title or "Sheaf benchmark: trees/s")))
        for t_index, table in enumerate(tables):
            rows = table.sorted_rows()
            # Leave out systems with no usable value in this panel (gnuplot warns about empty columns).
            series = [sr for sr in panel_series(table)
                      if any((tps_of(sr[2](row)) or 0) > 0 and math.isfinite(tps_of(sr[2](row))) for row in rows)]
            data_path = os.path.join(tmp, "panel%d.tsv" % t_index)
            values = []
            with open(data_path, "w", encoding="utf-8") as f:
                f.write("\t".join(['"config"'] + [gp_quote(title) for title, _, _ in series]) + "\n")
                for row in rows:
                    cells = [gp_quote(row.label(table.mixed_threads()))]
                    for _, _, get in series:
                        v = tps_of(get(row))
                        if v is None or not math.isfinite(v) or v <= 0:
                            cells.append("?")
                        else:
                            values.append(v)
                            cells.append("%.6g" % v)
                    f.write("\t".join(cells) + "\n")
            if values:
                lo = 10 ** math.floor(math.log10(min(values) * 0.9))
                hi = 10 ** math.ceil(math.log10(max(values) * 1.5))
            else:
                lo, hi = 1, 10
            labels = [row.label(table.mixed_threads()) for row in rows]
            # ~7 px per character at 10 pt on a ~780 px wide plot area: rotate labels that would collide.
            crowded = len(rows) * (7 * max(len(l) for l in labels) + 12) > 780
            pad = max(0.0, (4 - len(rows)) / 2.0)  # keep bars a sensible width when there are few groups
            panel_title = table.name
            if n == 1:
                panel_title = (args.title + ": " if args.title else "") + table.name
            script += [
                "set title %s font ',12'" % gp_quote(panel_title),
                "set yrange [%g:%g]" % (lo, hi),
                "set xrange [%g:%g]" % (-0.6 - pad, len(rows) - 0.4 + pad),
                "set xtics rotate by 30 right" if crowded else "set xtics norotate",
            ]
            plots = []
            for i, (title, color, _) in enumerate(series):
                col = i + 2
                using = "%d:xtic(1)" % col if i == 0 else "%d" % col
                plots.append("%s using %s title columnheader(%d) lc rgb '%s'"
                             % (gp_quote(data_path), using, col, color))
            script.append("plot " + ", \\\n     ".join(plots))
        if n > 1:
            script.append("unset multiplot")
        script.append("set output")
        script_path = os.path.join(tmp, "plot.gp")
        with open(script_path, "w", encoding="utf-8") as f:
            f.write("\n".join(script) + "\n")
        proc = subprocess.run([gnuplot, script_path], capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(path):
            sys.stderr.write(proc.stderr)
            die("gnuplot failed (exit status %d); no plot written" % proc.returncode, status=3)
        noise = [l for l in proc.stderr.splitlines() if l.strip()]
        if noise:
            sys.stderr.write("\n".join(noise) + "\n")
    return True


# ---------------------------------------------------------------- main

def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Summarise sheaf-bench --json output as a markdown report and a gnuplot PNG.",
        epilog="See the docstring at the top of bench/report.py for the exact outputs.")
    parser.add_argument("results", nargs="+", metavar="RESULTS.jsonl",
                        help="sheaf-bench --json output files ('-' for stdin)")
    parser.add_argument("--markdown", metavar="OUT.md", help="write the markdown report here")
    parser.add_argument("--plot", metavar="OUT.png", help="write the bar chart here (needs gnuplot)")
    parser.add_argument("--title", help="report / plot title")
    parser.add_argument("--machine", help="free text describing the machine")
    parser.add_argument("--command", help="the command that produced the results (a 'how to reproduce' line)")
    args = parser.parse_args(argv)
    if not args.markdown and not args.plot:
        parser.error("nothing to do: give --markdown OUT.md and/or --plot OUT.png")

    records = read_results(args.results)
    if not records:
        die("no JSON results found in %s (expected the output of `sheaf-bench --json`)"
            % ", ".join(args.results))
    tables = build_tables(records)
    if not tables:
        die("no per-example / sheaf / hand results found in %s" % ", ".join(args.results))

    plot_written = False
    if args.plot:
        plot_written = write_plot(args.plot, tables, args)
    if args.markdown:
        write_markdown(args.markdown, tables, args, plot_written)

    rows = sum(len(t.rows) for t in tables)
    written = [p for p in (args.markdown, args.plot if plot_written else None) if p]
    print("report.py: %d result(s), %d table(s), %d row(s) -> %s"
          % (len(records), len(tables), rows, ", ".join(written) if written else "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""GPU time per training step of train_gpt (Nsight Compute) and PyTorch (torch.profiler),
side by side by kind of kernel: the summary of scripts/profile-gpt.sh. Standard library only.

    python3 scripts/profile_gpt_summary.py --ncu RAW --torch CSV --warmup W --steps P
        [--meta DIR/meta.json] [--gpubind-eager-log LOG] [--gpubind-graph-log LOG]
        [--torch-log LOG] [--out FILE.md]

--ncu: what `ncu --csv --metrics gpu__time_duration.sum` printed for a train_gpt run of
exactly W + P eager steps (the program's own output and ncu's `==PROF==` lines around
the CSV are skipped). Every train step launches `encoder_fwd` exactly once, first; the
kernels before the first `encoder_fwd` (initialisation) and those of the first W steps
are dropped, and the run must hold exactly W + P of them (else the summary fails rather
than misattribute kernels). --torch: `scripts/torch_gpt.py --profile P --profile-csv`'s
table (name, calls, total_us) of the last P steps of its run. Either side may be left
out (its column shows "-"). The logs give each run's unprofiled `RESULT ... tokens_per_s`,
turned into milliseconds per step with the batch and context of --meta.

Prints a markdown table (ms per step by class, each side's share, the ratio
gpubind / torch) and the top 15 kernels of each side, and writes it to --out.
"""
import argparse
import csv
import json
import re
import sys
from collections import defaultdict

# The kernel train_gpt launches once per training step, first (the token and position
# embeddings of the forward pass).
STEP_MARKER = "encoder_fwd"

# (class, pattern), first match wins: attention before GEMM (flash-attention's names
# carry cutlass template arguments), GEMM before GELU/bias (cuBLASLt names may name
# their epilogue). Checked against train_gpt's kernels (the `extern "C" __global__`
# functions of examples/train_gpt/*.cu) by scripts/test_profile_gpt_summary.py.
CLASSES = [
    ("memcpy/memset (not kernels)", r"^Mem(cpy|set)\b"),
    # Fused attention (train_gpt's attn_*; SDPA's flash, memory-efficient or cuDNN
    # kernels) and, in train_gpt's unfused mode, its causal softmax and q/k/v layout
    # shuffles (its batched products count as GEMM); colsum_finish_qkv adds up the QKV
    # bias gradient's sums that the mma attention backward takes.
    (
        "attention",
        r"flash|fmha|sdpa|attention|^attn_|softmax_causal|permute_qkv|^unpermute$"
        r"|^colsum_finish_qkv$",
    ),
    ("GEMM (cuBLAS/cuBLASLt)", r"gemm|gemv|nvjet|cutlass|xmma|cublas|s16816|s1688|tensorop"),
    # train_gpt's residual add comes with its layer norm (residual_layernorm_fwd);
    # colsum_finish adds up the layer norms' weight and bias gradients (and, with
    # --epilogues off, the biases').
    ("layernorm", r"layer_?norm|GammaBeta|RowwiseMoments|colsum_finish"),
    ("GELU / bias", r"gelu|bias_add|residual_bias|colsum_partial"),
    ("softmax / cross-entropy", r"^xent$|cross_?entropy|nll_loss|softmax"),
    # Gradient clipping and AdamW: train_gpt's sumsq_partial and adamw (cast_weights
    # writes the bf16 weights at start-up only); torch's foreach kernels
    # (multi_tensor_apply) and fused AdamW.
    ("optimizer (clip + AdamW)", r"adam|multi_tensor_apply|lpnorm|foreach|sumsq_partial|cast_weights"),
    # nn.Embedding: index_select forward; the backward sorts the indices (the only cub
    # sorts, scans and selects of the step) and reduces per segment.
    (
        "embedding",
        r"^encoder_|embedding|indexSelect|index_select|compute_grad_weight|sum_and_scatter"
        r"|partials?_per_segment|partial_segment|segment_offsets|DeviceRadixSort|DeviceScan"
        r"|DeviceSelect|DeviceUnique|DeviceSegmented",
    ),
    ("elementwise / copy / reduce", r"elementwise|copy|memset|fill|reduce|sum_finish|CatArray|arange"),
]
OTHER = "other"
ORDER = [c for c, _ in CLASSES if not c.startswith("memcpy")] + [CLASSES[0][0], OTHER]
_COMPILED = [(c, re.compile(p, re.I)) for c, p in CLASSES]
_COMPILED[0] = (CLASSES[0][0], re.compile(CLASSES[0][1]))  # case-sensitive: "Memcpy HtoD"

UNITS_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
            "s": 1e9, "second": 1e9}


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def classify(name):
    """The class of a kernel (or torch memcpy/memset activity) name."""
    for cls, pat in _COMPILED:
        if pat.search(name):
            return cls
    return OTHER


class SummaryError(Exception):
    pass


def ncu_rows(text):
    """(kernel name, duration in ns) of every gpu__time_duration.sum row of ncu's CSV
    output, in launch order; lines before the CSV header and non-CSV lines after it
    (the program's output, ncu's ==PROF== and ==WARNING== lines) are skipped."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID","')), None)
    if start is None:
        raise SummaryError('ncu output: no CSV header (a line starting "ID",)')
    header = next(csv.reader([lines[start]]))
    need = ["ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"]
    missing = [h for h in need if h not in header]
    if missing:
        raise SummaryError(f"ncu output: the CSV header lacks {missing}")
    col = {h: header.index(h) for h in need}
    rows = []
    for fields in csv.reader(l for l in lines[start + 1 :] if l.startswith('"')):
        if len(fields) != len(header) or fields[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        unit = fields[col["Metric Unit"]].strip()
        if unit not in UNITS_NS:
            raise SummaryError(f"ncu output: unknown time unit {unit!r}")
        value = float(fields[col["Metric Value"]].replace(",", ""))
        rows.append((int(fields[col["ID"]]), fields[col["Kernel Name"]], value * UNITS_NS[unit]))
    if not rows:
        raise SummaryError("ncu output: no gpu__time_duration.sum rows")
    rows.sort()
    return [(name, ns) for _, name, ns in rows]


def split_steps(rows, warmup, steps):
    """The kernels of the last `steps` training steps (each starts at STEP_MARKER) of a
    run of exactly `warmup + steps`, as a list of per-step lists."""
    marks = [i for i, (name, _) in enumerate(rows) if name == STEP_MARKER]
    if len(marks) != warmup + steps:
        raise SummaryError(
            f"ncu output: {len(marks)} {STEP_MARKER} launches (one per training step), expected "
            f"{warmup} warm-up + {steps} profiled = {warmup + steps}: a truncated profile, an "
            "eval or sample pass, or a renamed kernel"
        )
    bounds = marks[warmup:] + [len(rows)]
    return [rows[a:b] for a, b in zip(bounds, bounds[1:])]


def ncu_side(text, warmup, steps):
    """(per-kernel {name: [calls, ns]} over the profiled steps, per-step kernel counts)."""
    per_step = split_steps(ncu_rows(text), warmup, steps)
    table = defaultdict(lambda: [0, 0.0])
    for step in per_step:
        for name, ns in step:
            table[name][0] += 1
            table[name][1] += ns
    return dict(table), [len(s) for s in per_step]


def torch_side(text):
    """{name: [calls, ns]} of torch_gpt.py --profile's CSV (name, calls, total_us)."""
    rd = csv.DictReader(text.splitlines())
    if rd.fieldnames is None or not {"name", "calls", "total_us"} <= set(rd.fieldnames):
        raise SummaryError("torch CSV: expected the columns name, calls, total_us")
    table = {}
    for r in rd:
        calls, us = int(r["calls"]), float(r["total_us"])
        old = table.get(r["name"], [0, 0.0])
        table[r["name"]] = [old[0] + calls, old[1] + us * 1e3]
    if not table:
        raise SummaryError("torch CSV: no rows")
    return table


def by_class(table):
    out = defaultdict(float)
    for name, (_, ns) in table.items():
        out[classify(name)] += ns
    return out


def step_ms(log_text, tokens_per_step):
    """Milliseconds per step from the last RESULT line's tokens_per_s, or None."""
    found = re.findall(r"^RESULT .*\btokens_per_s=([0-9.]+)", log_text, re.M)
    if not found or float(found[-1]) <= 0:
        return None
    return 1e3 * tokens_per_step / float(found[-1])


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def share(x, total):
    return "-" if x is None or not total else f"{100 * x / total:.1f} %"


def top_table(title, table, steps, n=15):
    total = sum(ns for _, ns in table.values())
    lines = [f"### {title}: top {n} kernels by GPU time", "",
             "| kernel | class | calls / step | ms / step | share |", "|---|---|---:|---:|---:|"]
    for name, (calls, ns) in sorted(table.items(), key=lambda kv: -kv[1][1])[:n]:
        short = name if len(name) <= 100 else name[:97] + "..."
        short = short.replace("|", "\\|")
        lines.append(f"| `{short}` | {classify(name)} | {calls / steps:g} | "
                     f"{ns / steps / 1e6:.3f} | {share(ns, total)} |")
    return lines + [""]


def render(gb, tc, counts, steps, warmup, meta, timed):
    """The markdown summary; gb and tc are {name: [calls, ns]} over `steps` steps (or None)."""
    gcls = by_class(gb) if gb is not None else None
    tcls = by_class(tc) if tc is not None else None
    per = lambda cls, k: None if cls is None else cls.get(k, 0.0) / steps / 1e6  # noqa: E731
    gtot = None if gb is None else sum(ns for _, ns in gb.values()) / steps / 1e6
    ttot = None if tc is None else sum(ns for _, ns in tc.values()) / steps / 1e6
    what = ""
    if meta:
        what = f"model {meta.get('model')}, batch {meta.get('batch')}, context {meta.get('context')}; "
    out = [
        "## GPU time per training step: train_gpt (gpubind, eager) and PyTorch (eager, SDPA)",
        "",
        f"{what}{steps} profiled step(s) after {warmup} warm-up step(s); milliseconds per step.",
        "",
        "| kernel class | gpubind ms | gpubind share | torch ms | torch share | gpubind / torch |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for k in ORDER:
        g, t = per(gcls, k), per(tcls, k)
        if (g or 0) == 0 and (t or 0) == 0:
            continue
        out.append(f"| {k} | {fmt(g)} | {share(g, gtot)} | {fmt(t)} | {share(t, ttot)} | {ratio(g, t)} |")
    mc = CLASSES[0][0]
    gkern = None if gtot is None else gtot - per(gcls, mc)
    tkern = None if ttot is None else ttot - per(tcls, mc)
    out.append(f"| **kernels** | **{fmt(gkern)}** | | **{fmt(tkern)}** | | **{ratio(gkern, tkern)}** |")
    out.append(f"| **all GPU activity** | **{fmt(gtot)}** | | **{fmt(ttot)}** | | **{ratio(gtot, ttot)}** |")
    gk = None if counts is None else sum(counts) / steps
    tk = None
    if tc is not None:
        tk = sum(c for n, (c, _) in tc.items() if classify(n) != CLASSES[0][0]) / steps
    out.append(f"| kernels per step | {fmt(gk, 0)} | | {fmt(tk, 0)} | | {ratio(gk, tk)} |")
    if timed:
        ge, gg, te = timed.get("gpubind-eager"), timed.get("gpubind-graph"), timed.get("torch-eager")
        out.append(f"| step time, eager (unprofiled run) | {fmt(ge)} | {share(gtot, ge)} busy | {fmt(te)} "
                   f"| {share(ttot, te)} busy | {ratio(ge, te)} |")
        if gg is not None:
            out.append(f"| step time, train_gpt --graph (unprofiled run) | {fmt(gg)} | {share(gtot, gg)} busy "
                       f"| {fmt(te)} | {share(ttot, te)} busy | {ratio(gg, te)} |")
    out.append("")
    notes = [
        "gpubind: Nsight Compute's gpu__time_duration.sum of each kernel (kernels serialised, "
        "clocks and caches left as they are); torch: torch.profiler's CUDA kernel, memcpy and memset "
        "durations. Nsight Compute sees kernels only: train_gpt's uploads, loss read-back and "
        "memsets are not in its column.",
        "\"busy\": the share of an unprofiled step the summed GPU activity accounts for; the rest "
        "is the GPU waiting on the host (launches, synchronisation).",
    ]
    if counts is not None and len(set(counts)) > 1:
        notes.insert(0, f"**warning**: the profiled train_gpt steps launched different numbers of "
                        f"kernels: {counts}")
    out += notes + [""]
    if gb is not None:
        out += top_table("gpubind", gb, steps)
    if tc is not None:
        out += top_table("torch", tc, steps)
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ncu", help="ncu's raw output for train_gpt")
    ap.add_argument("--torch", help="torch_gpt.py --profile-csv's table")
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--meta", help="train_gpt --dump-init's meta.json")
    ap.add_argument("--gpubind-eager-log")
    ap.add_argument("--gpubind-graph-log")
    ap.add_argument("--torch-log")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be at least 1, --warmup at least 0")
    if not a.ncu and not a.torch:
        ap.error("give --ncu, --torch or both")
    try:
        gb = counts = tc = None
        if a.ncu:
            gb, counts = ncu_side(read(a.ncu), a.warmup, a.steps)
        if a.torch:
            tc = torch_side(read(a.torch))
        meta = json.loads(read(a.meta)) if a.meta else None
        timed = {}
        if meta:
            tokens = meta["batch"] * meta["context"]
            for label, log in [("gpubind-eager", a.gpubind_eager_log),
                               ("gpubind-graph", a.gpubind_graph_log), ("torch-eager", a.torch_log)]:
                if log:
                    timed[label] = step_ms(read(log), tokens)
    except (SummaryError, OSError, ValueError, KeyError) as e:
        print(f"profile_gpt_summary: {e}", file=sys.stderr)
        return 1
    text = render(gb, tc, counts, a.steps, a.warmup, meta, timed)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Summarises one compute-sanitizer run over a GPU suite (its log on stdin or as argv[1]).

Prints the sanitizer's totals split into driver API errors and everything else (memory
errors, leaks, race hazards, barrier errors), and lists the API errors grouped by call and
code with the tests they came from: a test's own lines ("test NAME ... ok") follow its
sanitizer reports, so each report belongs to the next test line. docs/faults.md explains
every API error the suites provoke on purpose.

Leaks are listed by the driver call that allocated them (the first host frame of the
report, so the run needs host backtraces: --show-backtrace yes) and by test. A leak is
explained, and does not fail the run, only when named with --explained CALL or
--explained CALL@TEST (scripts/gpu-check.sh passes gpu_ipc's, which docs/faults.md
explains: compute-sanitizer does not count cuMemFree of a pool import as a free, and one
test's exporter child dies without freeing on purpose).

Exit status: 0 when the only findings are API errors and explained leaks, 1 when anything
else was found or no sanitizer summary was seen (a crashed or killed run), 2 on bad usage.

usage: sanitizer_summary.py [LOG] [--explained CALL[@TEST]]...
"""
import re
import sys
from collections import defaultdict

API = re.compile(r"Program hit (\S+) \(error (\d+)\).* on CUDA API call to (\w+)")
TEST = re.compile(r"^test (\S+) \.\.\. ")
ERRORS = re.compile(r"ERROR SUMMARY: (\d+) error")
RACES = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
LEAKS = re.compile(r"LEAK SUMMARY: (\d[\d,]*) bytes leaked in (\d+) allocations")
NOT_PRINTED = re.compile(r"\((\d+) errors? not printed\)")
LEAK = re.compile(r"Leaked ([\d,]+) bytes at")
FRAME = re.compile(r"Host Frame: (\w+)")


def summarise(lines):
    api = defaultdict(lambda: [0, set()])  # (call, code) -> [count, tests]
    pending = []  # API errors waiting for their test's line
    leaks = []  # [bytes, allocating call or None, test or None]
    pending_leaks = []
    in_leak = False
    total = hazards = leaked = None
    not_printed = 0
    for line in lines:
        if m := LEAK.search(line):
            leak = [int(m.group(1).replace(",", "")), None, None]
            leaks.append(leak)
            pending_leaks.append(leak)
            in_leak = True
            continue
        if in_leak and (m := FRAME.search(line)):
            pending_leaks[-1][1] = m.group(1)
            in_leak = False
        if m := API.search(line):
            in_leak = False
            pending.append((m.group(3), m.group(1)))
        elif m := TEST.match(line):
            in_leak = False
            for key in pending:
                api[key][0] += 1
                api[key][1].add(m.group(1))
            pending = []
            for leak in pending_leaks:
                leak[2] = m.group(1)
            pending_leaks = []
        if m := ERRORS.search(line):
            total = int(m.group(1))
        if m := RACES.search(line):
            hazards = int(m.group(1))
        if m := LEAKS.search(line):
            leaked = int(m.group(1).replace(",", ""))
        if m := NOT_PRINTED.search(line):
            not_printed += int(m.group(1))
    for key in pending:  # reports after the last test line (suite start-up or exit)
        api[key][0] += 1
        api[key][1].add("(suite start-up or exit)")
    return api, total, hazards, leaked, not_printed, leaks


def explained(leak, allowed):
    _, call, test = leak
    return call is not None and (call in allowed or f"{call}@{test}" in allowed)


def main():
    args, allowed = [], set()
    it = iter(sys.argv[1:])
    for a in it:
        if a == "--explained":
            allowed.add(next(it, ""))
        elif a.startswith("--"):
            print(__doc__, file=sys.stderr)
            return 2
        else:
            args.append(a)
    if len(args) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    src = open(args[0], errors="replace") if args else sys.stdin
    api, total, hazards, leaked, not_printed, leaks = summarise(src)
    n_api = sum(c for c, _ in api.values())
    ok = True
    if total is None and hazards is None:
        print("sanitizer: no summary line (the run crashed or was killed)")
        return 1
    n_explained = sum(1 for l in leaks if explained(l, allowed))
    if total is not None:
        other = total - n_api - n_explained
        print(
            f"sanitizer: {total} errors reported = {n_api} driver API errors + "
            f"{n_explained} explained leaks + {other} others"
        )
        ok &= other == 0
    if hazards is not None:
        print(f"sanitizer: {hazards} race hazards")
        ok &= hazards == 0
    if leaked is not None:
        unexplained = sum(b for b, *_ in (l for l in leaks if not explained(l, allowed)))
        print(f"sanitizer: {leaked} bytes leaked, {unexplained} of them unexplained")
        ok &= unexplained == 0 and (leaked == 0 or bool(leaks))
    by_call = defaultdict(lambda: [0, 0, set()])
    for b, call, test in leaks:
        e = by_call[(call or "unknown (no host backtrace)", explained((b, call, test), allowed))]
        e[0] += 1
        e[1] += b
        e[2].add(test or "(suite start-up or exit)")
    for (call, ok_leak), (n, b, tests) in sorted(by_call.items()):
        tag = "explained" if ok_leak else "UNEXPLAINED"
        print(f"  leak ({tag}) allocated by {call}: {n}x, {b} bytes, in {', '.join(sorted(tests))}")
    if not_printed:
        print(f"sanitizer: {not_printed} errors not printed (raise --print-limit to see them)")
        ok = False
    for (call, code), (count, tests) in sorted(api.items()):
        print(f"  API error {call} -> {code}: {count}x in {', '.join(sorted(tests))}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

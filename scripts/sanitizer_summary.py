#!/usr/bin/env python3
"""Summarises one compute-sanitizer run over a GPU suite (its log on stdin or as argv[1]).

Prints the sanitizer's totals split into driver API errors and everything else (memory
errors, leaks, race hazards, barrier errors), and lists the API errors grouped by call and
code with the tests they came from: a test's own lines ("test NAME ... ok") follow its
sanitizer reports, so each report belongs to the next test line. docs/faults.md explains
every API error the suites provoke on purpose.

Exit status: 0 when the only findings are API errors, 1 when anything else was found or no
sanitizer summary was seen (a crashed or killed run), 2 on bad usage.
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


def summarise(lines):
    api = defaultdict(lambda: [0, set()])  # (call, code) -> [count, tests]
    pending = []  # API errors waiting for their test's line
    total = hazards = leaked = None
    not_printed = 0
    for line in lines:
        if m := API.search(line):
            pending.append((m.group(3), m.group(1)))
        elif m := TEST.match(line):
            for key in pending:
                api[key][0] += 1
                api[key][1].add(m.group(1))
            pending = []
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
    return api, total, hazards, leaked, not_printed


def main():
    if len(sys.argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = open(sys.argv[1], errors="replace") if len(sys.argv) == 2 else sys.stdin
    api, total, hazards, leaked, not_printed = summarise(src)
    n_api = sum(c for c, _ in api.values())
    ok = True
    if total is None and hazards is None:
        print("sanitizer: no summary line (the run crashed or was killed)")
        return 1
    if total is not None:
        other = total - n_api
        print(f"sanitizer: {total} errors reported = {n_api} driver API errors + {other} others")
        ok &= other == 0
    if hazards is not None:
        print(f"sanitizer: {hazards} race hazards")
        ok &= hazards == 0
    if leaked is not None:
        print(f"sanitizer: {leaked} bytes leaked")
        ok &= leaked == 0
    if not_printed:
        print(f"sanitizer: {not_printed} errors not printed (raise --print-limit to see them)")
        ok = False
    for (call, code), (count, tests) in sorted(api.items()):
        print(f"  API error {call} -> {code}: {count}x in {', '.join(sorted(tests))}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

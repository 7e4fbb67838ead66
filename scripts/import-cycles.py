#!/usr/bin/env python3
"""File-level import cycles inside a Rust module tree.

Usage: cycles.py SRC_ROOT MODULE_DIR   (e.g. cycles.py src src/collective)

An edge A -> B means file A names an item (a `use` path, or a path in code starting
with `crate::`, `super::`, `self::`, a child module or an imported module) that is
defined in file B; re-exports (`pub use`) are followed to the defining file. Comments
are ignored. Prints every strongly connected set of two or more files (a cycle), and
exits 1 if there is one.
"""
import re, sys, pathlib

src = pathlib.Path(sys.argv[1]); top = pathlib.Path(sys.argv[2])
files = {}  # module path tuple -> file
for f in sorted(top.rglob('*.rs')):
    rel = f.relative_to(src).with_suffix('')
    parts = list(rel.parts)
    if parts[-1] == 'mod': parts = parts[:-1]
    files[tuple(parts)] = f
texts = {}
def strip_comments(t):
    t = re.sub(r'/\*.*?\*/', '', t, flags=re.S)
    out = []
    for line in t.split('\n'):
        i = 0; instr = False; cut = len(line)
        while i < len(line):
            c = line[i]
            if instr:
                if c == '\\': i += 2; continue
                if c == '"': instr = False
            elif line.startswith('//', i): cut = i; break
            elif c == '"': instr = True
            i += 1
        out.append(line[:cut])
    return '\n'.join(out)
for m, f in files.items(): texts[m] = strip_comments(f.read_text())

def parse_tree(s):
    """`a::{b, c::{d as e}, f::*}` -> list of (segments, alias)."""
    s = s.replace(' ', '').replace('\n', '')
    def rec(prefix, s):
        out = []
        # split top-level commas
        depth = 0; cur = ''; parts = []
        for ch in s:
            if ch == '{': depth += 1
            if ch == '}': depth -= 1
            if ch == ',' and depth == 0: parts.append(cur); cur = ''
            else: cur += ch
        if cur: parts.append(cur)
        for p in parts:
            if '{' in p:
                head, rest = p.split('{', 1)
                head = [x for x in head.split('::') if x]
                out += rec(prefix + head, rest[:-1])
            else:
                alias = None
                if 'as' in p and re.search(r'\bas\b', p.replace('as', ' as ')):
                    m = re.match(r'(.*?)as(\w+)$', p)
                    if m and p.endswith(m.group(2)) and '::' in p or (m and not '::' in m.group(1)):
                        p, alias = m.group(1), m.group(2)
                segs = prefix + [x for x in p.split('::') if x]
                if segs and segs[-1] == 'self': segs = segs[:-1]
                out.append((segs, alias or (segs[-1] if segs else None)))
        return out
    return rec([], s)

# Inline `mod x { ... }` blocks (tests) belong to their file: their `super` is the file's
# own module.
uses = {}      # module -> list of (segs, alias, inline_depth)
inline_spans = {}  # module -> [(start, end)] of inline `mod x { ... }` blocks
for m, t in texts.items():
    lst = []
    spans = []
    depth_stack = []  # brace depth where an inline mod began
    depth = 0
    for mt in re.finditer(r'\bmod\s+\w+\s*\{|\buse\s+([^;]+);|[{}]', t):
        tok = mt.group(0)
        if tok == '{': depth += 1; continue
        if tok == '}':
            depth -= 1
            if depth_stack and depth_stack[-1][0] == depth:
                spans.append((depth_stack.pop()[1], mt.end()))
            continue
        if tok.startswith('mod'):
            depth_stack.append((depth, mt.start())); depth += 1; continue
        for segs, alias in parse_tree(mt.group(1)):
            lst.append((segs, alias, len(depth_stack)))
    uses[m] = lst
    inline_spans[m] = spans

def absolute(mod, segs, inline):
    segs = list(segs)
    if not segs: return None
    if segs[0] == 'crate': return ['crate'] + segs[1:]
    base = list(mod)
    relative = segs[0] in ('super', 'self')
    if inline and segs[0] == 'super':  # `super` of an inline module is the file's module
        segs = segs[1:]
        inline -= 1
    while segs and segs[0] == 'super': base = base[:-1]; segs = segs[1:]
    if segs and segs[0] == 'self': segs = segs[1:]
    elif not relative and segs and tuple(base + [segs[0]]) not in files and not is_binding(tuple(base), segs[0]):
        return None  # an external crate or std
    return ['crate'] + base + segs

def is_binding(mod, name):
    return any(a == name for _, a, _ in uses.get(mod, []))

def defines(mod, name):
    return re.search(r'\b(fn|struct|enum|trait|type|const|static|union)\s+' + re.escape(name) + r'\b', texts[mod]) \
        or re.search(r'macro_rules!\s*' + re.escape(name) + r'\b', texts[mod])

def resolve(path, seen=None):
    """crate-absolute segment list -> defining file, or None (outside the tree)."""
    seen = seen or set()
    key = tuple(path)
    if key in seen: return None
    seen.add(key)
    segs = path[1:]
    mod = ()
    for i, s in enumerate(segs):
        if tuple(list(mod) + [s]) in files or (not mod and s == top.relative_to(src).parts[0]):
            mod = tuple(list(mod) + [s]); continue
        if mod not in files: return None
        if s == '*': return files[mod]
        if defines(mod, s): return files[mod]
        for useg, alias, inl in uses[mod]:
            if alias == s and inl == 0:
                a = absolute(mod, useg, 0)
                if a is None: return None
                return resolve(a + segs[i + 1:], seen)
        # glob imports
        for useg, alias, inl in uses[mod]:
            if useg and useg[-1] == '*' and inl == 0:
                a = absolute(mod, useg[:-1], 0)
                if a:
                    r = resolve(a + [s], seen)
                    if r: return r
        return files[mod]
    return None  # a module itself

edges = {f: set() for f in files.values()}
for m, t in texts.items():
    f = files[m]
    names = set()
    for segs, alias, inl in uses[m]:
        a = absolute(m, segs, inl)
        if a is None: continue
        r = resolve(a)
        if r and r != f: edges[f].add(r)
        if r is None and alias: names.add((alias, tuple(a)))
    # inline paths
    for mt in re.finditer(r'\b((?:crate|super|self)(?:::\w+)+)', t):
        inl = sum(1 for a0, b0 in inline_spans[m] if a0 <= mt.start() < b0)
        a = absolute(m, mt.group(1).split('::'), inl)
        if a:
            r = resolve(a)
            if r and r != f: edges[f].add(r)
    # paths through imported modules and child modules
    kids = [(k[-1], ['crate'] + list(k)) for k in files if len(k) == len(m) + 1 and k[:-1] == m]
    for name, a in list(names) + kids:
        for mt in re.finditer(r'(?<![\w:])' + re.escape(name) + r'((?:::\w+)+)', t):
            r = resolve(list(a) + mt.group(1).split('::')[1:])
            if r and r != f: edges[f].add(r)

# Tarjan
index = {}; low = {}; stack = []; on = set(); sccs = []; n = [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index: strong(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(comp)
for v in edges:
    if v not in index: strong(v)
if '-v' in sys.argv:
    for f in sorted(edges): print(f, '->', sorted(str(x) for x in edges[f]))
for c in sccs:
    cs = set(c)
    print('cycle:', ', '.join(sorted(str(x.relative_to(top)) for x in c)))
    for a in sorted(c):
        for b in sorted(edges[a] & cs): print('   ', a.relative_to(top), '->', b.relative_to(top))
print(f'{len(files)} files, {sum(map(len, edges.values()))} edges, {len(sccs)} cycle(s)')
sys.exit(1 if sccs else 0)

#!/usr/bin/env python3
"""The picture of the code's includes and calls, for a set of C files.

For the .c and .h files under one or more folders (--root, relative to
the repository; default: the whole tree) it builds

  - the include graph: quoted #includes, resolved against the including
    file's folder, then the project's include directories (common/include,
    client/include, the build's generated include/), then every folder of
    the set;
  - the call graph between .c files, from their object files in the build
    (`nm` on BUILD/**/CMakeFiles/*.dir/**.o): A calls B when A's object has
    an undefined symbol that B's object defines;
  - the picture: both together, where a header with a .c file of its name
    in its folder counts with it (state.h with state.c), and any other
    header stands for the .c files that define the functions it declares
    (counted with the one such file, or an edge to each of several). Its
    circles are the files that cannot be read, built or tested one
    without the others; a header that declares things for two layers
    shows as one;

and prints the number of files, the circles (strongly connected components
of more than one file) of each graph, and the largest files by lines.
--dot FILE writes the combined picture for Graphviz.

  tests/tools/code_graph.py --root dispatcher --build build
  tests/tools/code_graph.py --build build          # the whole tree

Python 3, standard library only. Exit status 0; with --fail-on-circle, 1
when the combined picture has a circle.
"""

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

# The whole tree: the libraries, the daemons, the client and ferryctl.
DEFAULT_ROOTS = ["common/src", "common/include", "worker", "client",
                 "dispatcher"]
INCLUDE_DIRS = ["common/include", "client/include"]
SKIP_DIRS = {"tests", "build", ".git", "__pycache__", "python", "examples"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def repo_root():
    """The repository this script is in, else the one of the current
    folder, else the script's ../.."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (here, os.getcwd()):
        try:
            out = subprocess.run(["git", "-C", d, "rev-parse",
                                  "--show-toplevel"], capture_output=True,
                                 text=True, check=True)
            return out.stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            continue
    return os.path.normpath(os.path.join(here, "..", ".."))


def collect_files(repo, roots, with_tests):
    files = []
    for root in roots:
        top = os.path.join(repo, root)
        if os.path.isfile(top):
            files.append(os.path.relpath(top, repo))
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames
                                 if not d.startswith("build") and
                                 (with_tests or d not in SKIP_DIRS) and
                                 d not in (".git", "__pycache__"))
            for f in sorted(filenames):
                if f.endswith((".c", ".h")):
                    files.append(os.path.relpath(os.path.join(dirpath, f),
                                                 repo))
    return sorted(set(files))


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def include_graph(repo, files, build):
    """Edges file -> included file, both in `files`; and unresolved names."""
    fset = set(files)
    dirs = [os.path.join(repo, d) for d in INCLUDE_DIRS]
    if build:
        dirs.append(os.path.join(build, "include"))
    dirs += sorted({os.path.join(repo, os.path.dirname(f)) for f in files})
    edges = defaultdict(set)
    unresolved = set()
    for f in files:
        with open(os.path.join(repo, f), encoding="utf-8",
                  errors="replace") as fh:
            text = fh.read()
        for name in INCLUDE_RE.findall(text):
            here = os.path.join(repo, os.path.dirname(f))
            target = None
            for d in [here] + dirs:
                p = os.path.normpath(os.path.join(d, name))
                if os.path.isfile(p):
                    target = p
                    break
            if target is None:
                unresolved.add(name)
                continue
            rel = os.path.relpath(target, repo)
            if rel in fset and rel != f:
                edges[f].add(rel)
    return edges, unresolved


def object_files(build):
    """(object path, source path relative to the repository) pairs."""
    out = []
    for dirpath, dirnames, filenames in os.walk(build):
        if "CMakeFiles" not in dirpath:
            continue
        for f in filenames:
            if not f.endswith(".c.o"):
                continue
            obj = os.path.join(dirpath, f)
            rel = os.path.relpath(obj, build).split(os.sep)
            try:
                k = rel.index("CMakeFiles")
            except ValueError:
                continue
            # BUILD/<subdir>/CMakeFiles/<target>.dir/<path in subdir>.o;
            # CMake writes ".." as "__".
            sub = rel[:k]
            inner = [".." if p == "__" else p for p in rel[k + 2:]]
            out.append((obj, os.path.normpath(
                os.path.join(*(sub + inner))[:-2])))
    return out


def call_graph(repo, files, build):
    """Edges .c -> .c from the objects' symbols; and the objects used."""
    fset = {f for f in files if f.endswith(".c")}
    objs = [(o, s) for o, s in object_files(build) if s in fset]
    if not objs:
        return {}, 0, {}, {}
    defined = defaultdict(set)    # symbol -> sources defining it
    undefined = defaultdict(set)  # source -> symbols it needs
    by_obj = {}
    for o, s in objs:
        by_obj[o] = s
    names = sorted(by_obj)
    for i in range(0, len(names), 200):
        chunk = names[i:i + 200]
        res = subprocess.run(["nm", "-P", "-A"] + chunk, capture_output=True,
                             text=True)
        for line in res.stdout.splitlines():
            # "path.o: symbol T value size" (value, size absent for U)
            head, _, rest = line.partition(": ")
            parts = rest.split()
            if len(parts) < 2 or head not in by_obj:
                continue
            sym, kind = parts[0], parts[1]
            src = by_obj[head]
            if kind in ("U", "w", "v"):
                undefined[src].add(sym)
            elif kind.isupper():
                defined[sym].add(src)
    edges = defaultdict(set)
    why = defaultdict(set)
    for src, syms in undefined.items():
        for sym in syms:
            for dst in defined.get(sym, ()):
                if dst != src:
                    edges[src].add(dst)
                    why[(src, dst)].add(sym)
    return edges, len({s for _, s in objs}), defined, why


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative), largest first."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in nodes:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


COMMENT_RE = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"', re.S)
NAME_RE = re.compile(r'\b([A-Za-z_]\w*)\s*\(')


def header_names(repo, header, defined):
    """The functions of `defined` that a header declares (a prototype:
    NAME(...) then ';' or an attribute) and those it only names (an inline
    function's body, a macro)."""
    with open(os.path.join(repo, header), encoding="utf-8",
              errors="replace") as fh:
        text = COMMENT_RE.sub(" ", fh.read())
    declared, named = set(), set()
    for m in NAME_RE.finditer(text):
        name = m.group(1)
        if name not in defined:
            continue
        depth, j = 0, m.end() - 1
        while j < len(text):
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        rest = text[j + 1:j + 40].lstrip()
        if rest.startswith(";") or rest.startswith("__attribute__"):
            declared.add(name)
        else:
            named.add(name)
    return declared, named - declared


def modules(repo, files, defined):
    """Which node each file counts in, and the headers' own edges.

    A header with a .c file of its name in its folder is that file's
    interface: one node with it (what else it declares is the call
    graph's business). Any other header stands for the .c files
    that define the functions it declares: with one such file it counts
    with it, with several it is a node of its own with an edge to each
    (a header shared by two layers shows as a circle). A function a header
    only names (an inline body, a macro) is an edge of its node."""
    fset = set(files)
    cfiles = {f for f in files if f.endswith(".c")}
    mod, hedges = {}, defaultdict(set)
    for f in files:
        mod[f] = f
    for f in files:
        stem, ext = os.path.splitext(f)
        if ext != ".h":
            continue
        declared, named = header_names(repo, f, defined) if defined else \
            (set(), set())
        by = {d for n in declared for d in defined[n] if d in cfiles}
        uses = {d for n in named for d in defined[n] if d in cfiles}
        if stem + ".c" in fset:
            mod[f] = stem + ".c"
            by = set()
        elif len(by) == 1:
            mod[f] = next(iter(by))
            by = set()
        hedges[f] = by | uses
    return mod, hedges


def combine(files, inc, calls, mod, hedges):
    edges = defaultdict(set)
    for g in (inc, calls, hedges):
        for a, bs in g.items():
            for b in bs:
                if mod[a] != mod[b]:
                    edges[mod[a]].add(mod[b])
    return set(mod.values()), edges


def nedges(g):
    return sum(len(v) for v in g.values())


def show_circles(title, comps, strip):
    if not comps:
        print(f"circles ({title}): none")
        return
    print(f"circles ({title}): {len(comps)}, "
          f"{sum(len(c) for c in comps)} files in them")
    for c in comps:
        print(f"  [{len(c)}] " + " ".join(strip(f) for f in c))


def write_dot(path, nodes, edges, comps, mod, strip):
    incircle = {f for c in comps for f in c}
    label = defaultdict(list)
    for f, m in mod.items():
        label[m].append(os.path.basename(f))
    with open(path, "w", encoding="utf-8") as out:
        out.write("digraph code {\n  rankdir=BT;\n  node [shape=box, "
                  "fontname=\"monospace\", fontsize=10];\n")
        for n in sorted(nodes):
            names = "\\n".join(sorted(label[n], key=lambda s: s[-1]))
            color = ', color=red, fontcolor=red' if n in incircle else ''
            out.write(f'  "{strip(n)}" [label="{names}"{color}];\n')
        for a in sorted(edges):
            for b in sorted(edges[a]):
                red = (a in incircle and b in incircle and
                       any(a in c and b in c for c in comps))
                out.write(f'  "{strip(a)}" -> "{strip(b)}"'
                          f'{" [color=red]" if red else ""};\n')
        out.write("}\n")


def main(argv):
    ap = argparse.ArgumentParser(
        description="Include and call graph of C files: files, circles, "
                    "largest files.")
    ap.add_argument("--root", action="append",
                    help="a folder or file, relative to the repository "
                         "(repeatable; default: " + " ".join(DEFAULT_ROOTS)
                         + ")")
    ap.add_argument("--build", help="the CMake build folder whose objects "
                    "give the call graph (relative to the repository or "
                    "absolute); without it, includes only")
    ap.add_argument("--repo", help="the repository (default: this script's)")
    ap.add_argument("--top", type=int, default=10,
                    help="how many of the largest files to list (10)")
    ap.add_argument("--dot", help="write the combined picture as DOT here")
    ap.add_argument("--with-tests", action="store_true",
                    help="include tests/ and examples/ folders under a root")
    ap.add_argument("--edges", action="store_true",
                    help="also list every edge of the combined picture")
    ap.add_argument("--fail-on-circle", action="store_true",
                    help="exit 1 when the combined picture has a circle")
    args = ap.parse_args(argv)

    repo = os.path.abspath(args.repo or repo_root())
    roots = args.root or DEFAULT_ROOTS
    build = None
    if args.build:
        build = args.build if os.path.isabs(args.build) else \
            os.path.join(repo, args.build)
        if not os.path.isdir(build):
            sys.exit(f"code_graph: no build folder {build}")
    files = collect_files(repo, roots, args.with_tests)
    if not files:
        sys.exit("code_graph: no .c or .h file under " + " ".join(roots))
    prefix = os.path.commonpath(files) if len(roots) == 1 else ""
    if prefix and os.path.isfile(os.path.join(repo, prefix)):
        prefix = os.path.dirname(prefix)

    def strip(f):
        return os.path.relpath(f, prefix) if prefix else f

    lines = {f: count_lines(os.path.join(repo, f)) for f in files}
    inc, unresolved = include_graph(repo, files, build)
    calls, nobj, defined, why = call_graph(repo, files, build) if build \
        else ({}, 0, {}, {})
    mod, hedges = modules(repo, files, defined)
    nodes, comb = combine(files, inc, calls, mod, hedges)

    nc = sum(f.endswith(".c") for f in files)
    print(f"code_graph: {' '.join(roots)}"
          + (f" (objects: {os.path.relpath(build, repo)})" if build else ""))
    print(f"files: {len(files)} ({nc} .c, {len(files) - nc} .h), "
          f"{sum(lines.values())} lines")
    print(f"include edges: {nedges(inc)}; call edges: {nedges(calls)} "
          f"({nobj} of {nc} .c files have an object)" if build else
          f"include edges: {nedges(inc)}; no call graph (no --build)")
    print(f"picture (includes and calls, a header with its .c): "
          f"{len(nodes)} nodes, {nedges(comb)} edges")
    show_circles("includes", sccs(set(files), inc), strip)
    if build:
        show_circles("calls", sccs({f for f in files if f.endswith(".c")},
                                   calls), strip)
    comps = sccs(nodes, comb)
    show_circles("picture", comps, strip)
    print(f"largest files (of {len(files)}):")
    for f in sorted(files, key=lambda f: (-lines[f], f))[:args.top]:
        print(f"  {lines[f]:6d} {strip(f)}")
    if args.edges:
        print("edges of the picture (calls: the functions):")
        for a in sorted(comb):
            for b in sorted(comb[a]):
                syms = sorted(why.get((a, b), ()))
                more = f" ({len(syms) - 6} more)" if len(syms) > 6 else ""
                print(f"  {strip(a)} -> {strip(b)}"
                      + (": " + " ".join(syms[:6]) + more if syms else ""))
    if args.dot:
        write_dot(args.dot, nodes, comb, comps, mod, strip)
        print(f"wrote {args.dot}")
    return 1 if args.fail_on_circle and comps else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Finds circles between a crate's modules: parses every `crate::`, `super::` and child-module
path in its `src/` (test modules and comments left out) into a file-level import graph and
prints its strongly connected components of more than one file, largest first; then the same
graph with every file folded into its top-level module (`http/api/call.rs` is `http`), so a
circle of modules is found even where no two files import each other. Binaries (`main.rs`,
`src/bin/`) and `lib.rs` are left out: they are above everything.

Without `--src`, every crate of the workspace (the `members` of the root `Cargo.toml`) is
checked, each printed on its own.

Usage: scripts/module_cycles.py [--max N] [--src DIR]
  --max N    exit 1 when a component of any crate checked has more than N files, or more
             than N top-level modules
  --src DIR  only this tree's src/ (e.g. an older commit's, from `git archive`)
"""
import os
import re
import sys
import tomllib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
CHILD = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;", re.M)
USE_GROUP = re.compile(r"\buse\s+(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\}", re.S)


def module_of(src, file):
    rel = os.path.relpath(file, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def file_of(src, parts):
    """The file defining the longest prefix of `parts` that is a module, else `lib.rs` when it
    defines the item named (`crate::Simulator` of a `lib.rs` that holds it). A path that names
    neither (`crate::Config` re-exported by `lib.rs`, `crate::link` re-exported from another
    crate) is no edge: a re-export is not a dependency of `lib.rs`'s own."""
    for n in range(len(parts), 0, -1):
        base = os.path.join(src, *parts[:n])
        for candidate in (base + ".rs", os.path.join(base, "mod.rs")):
            if os.path.isfile(candidate):
                return os.path.relpath(candidate, src)
    lib = os.path.join(src, "lib.rs")
    if parts and os.path.isfile(lib):
        defines = re.compile(
            r"^\s*(?:pub(?:\([a-z]+\))?\s+)?(?:async\s+)?"
            r"(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+" + re.escape(parts[0]) + r"\b",
            re.M,
        )
        if defines.search(open(lib, encoding="utf-8").read()):
            return "lib.rs"
    return None


def edges(src, file):
    text = open(file, encoding="utf-8").read()
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
    text = re.sub(r"//[^\n]*", "", text)
    here = module_of(src, file)
    found = set()

    def add(root, rest):
        parts = [p for p in rest.split("::") if p]
        if root == "crate":
            base = []
        elif root == "self":
            base = here
        else:
            # `super` of `a/b.rs` and of `a/b/mod.rs` alike is module `a`.
            base = here[:-1]
            while parts and parts[0] == "super":
                parts, base = parts[1:], base[:-1]
        target = file_of(src, base + parts)
        if target and target != os.path.relpath(file, src):
            found.add(target)

    for root, prefix, group in USE_GROUP.findall(text):
        for item in re.split(r",", re.sub(r"\{[^}]*\}", "", group)):
            item = item.strip().split(" as ")[0].strip()
            if item and item != "self":
                add(root, prefix + "::" + item)
            elif item == "self":
                add(root, prefix)
    for root, rest in PATH.findall(text):
        add(root, rest)
    # Paths through this file's own child modules (`routes::handle`, `pub use api::X`).
    for child in CHILD.findall(text):
        for rest in re.findall(r"(?<![:\w])" + child + r"((?:::[A-Za-z_][A-Za-z0-9_]*)+)", text):
            add("self", child + rest)
        for group in re.findall(r"\buse\s+" + child + r"((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\}", text, re.S):
            add("self", child + group[0])
    return found


def components(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def file_graph(src):
    """Every library file of the tree `src` and the files it imports from."""
    graph = {}
    for dirpath, dirnames, names in os.walk(src):
        if os.path.relpath(dirpath, src) == ".":
            # `src/bin/*.rs` are binaries, like `main.rs`.
            dirnames[:] = [d for d in dirnames if d != "bin"]
        for name in names:
            if name.endswith(".rs") and name != "main.rs":
                path = os.path.join(dirpath, name)
                graph[os.path.relpath(path, src)] = edges(src, path)
    return graph


def top_module(file):
    """The top-level module a file belongs to: `http/api/call.rs` and `http/mod.rs` are `http`."""
    return file[:-3].split(os.sep)[0]


def module_graph(files):
    """The file graph folded into top-level modules; `lib.rs` left out (it only declares them)."""
    graph = {}
    for file, targets in files.items():
        here = top_module(file)
        if here == "lib":
            continue
        graph.setdefault(here, set())
        for target in targets:
            there = top_module(target)
            if there not in (here, "lib"):
                graph[here].add(there)
    return graph


def largest_first(graph):
    return sorted((c for c in components(graph) if len(c) > 1), key=len, reverse=True)


def circles_of(src):
    """The components of more than one file in the tree `src`, largest first."""
    return largest_first(file_graph(src))


def module_circles_of(src):
    """The components of more than one top-level module in the tree `src`, largest first, each
    with the imports that close it (`module -> module: files`)."""
    files = file_graph(src)
    graph = module_graph(files)
    out = []
    for component in largest_first(graph):
        inside = set(component)
        why = []
        for file, targets in sorted(files.items()):
            here = top_module(file)
            for target in sorted(targets):
                there = top_module(target)
                if here in inside and there in inside and here != there:
                    why.append(f"{file} -> {target}")
        out.append((component, why))
    return out


def workspace_crates():
    """(package name, src/) of every workspace member, in the order `Cargo.toml` lists them."""
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as manifest:
        members = tomllib.load(manifest)["workspace"]["members"]
    crates = []
    for member in members:
        with open(os.path.join(ROOT, member, "Cargo.toml"), "rb") as manifest:
            name = tomllib.load(manifest)["package"]["name"]
        crates.append((name, os.path.normpath(os.path.join(ROOT, member, "src"))))
    return crates


def main():
    limit = None
    if "--max" in sys.argv:
        limit = int(sys.argv[sys.argv.index("--max") + 1])
    if "--src" in sys.argv:
        src = sys.argv[sys.argv.index("--src") + 1]
        crates = [(src, src)]
    else:
        crates = workspace_crates()
    failed = False
    for name, src in crates:
        circles = circles_of(src)
        largest = len(circles[0]) if circles else 1
        label = name if name == src else f"{name} ({os.path.relpath(src, ROOT)})"
        print(f"{label}: largest strongly connected component: {largest} file(s)")
        for component in circles:
            print(f"  {len(component)}: {' '.join(component)}")
        modules = module_circles_of(src)
        most = len(modules[0][0]) if modules else 1
        print(f"{label}: largest circle of top-level modules: {most} module(s)")
        for component, why in modules:
            print(f"  {len(component)}: {' '.join(component)}")
            if limit is not None and len(component) > limit:
                for line in why:
                    print(f"      {line}")
        failed = failed or (limit is not None and max(largest, most) > limit)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Finds source files too long to read as one concern: counts the lines of every `.rs` file
under each workspace member's `src/` (the `members` of the root `Cargo.toml`, binaries
included), leaving out its inline test module (from a `#[cfg(test)]` before `mod NAME {` to
its closing brace) and whole files that are test modules (`#[cfg(test)] mod NAME;` in their
parent, and everything under such a module's folder). Blank lines and comments count: a
file is read whole.

Prints every file over the limit, longest first, and exits 1 when one of them is not on the
allow-list below.

Usage: scripts/file_sizes.py [--max N] [--all]
  --max N  the most lines a file may have (default 800)
  --all    print every file's count, longest first
"""
import os
import re
import sys
import tomllib

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# Files over the limit that the station runtime's move into the core is taking apart; each
# leaves this list once it is below the limit, and the list then stays empty.
ALLOWED: set[str] = set()

TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*([;{])")


def members():
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["workspace"]["members"]


def code_lines(text):
    """The file's lines, less its inline test modules (`#[cfg(test)] mod x { ... }`)."""
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    for match in TEST_MOD.finditer(text):
        if match.group(2) != "{":
            continue
        depth, end = 0, None
        for i in range(match.end() - 1, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    break
        end = len(text) if end is None else end
        lines -= text.count("\n", match.start(), end) + 1
    return lines


def test_files(path, text):
    """The files and folders that `path`'s `#[cfg(test)] mod x;` declarations name."""
    folder = os.path.dirname(path)
    stem = os.path.basename(path)[:-3]
    if stem not in ("mod", "lib", "main"):
        folder = os.path.join(folder, stem)
    for match in TEST_MOD.finditer(text):
        if match.group(2) == ";":
            yield os.path.join(folder, match.group(1))


def sizes():
    found = {}
    for member in members():
        src = os.path.normpath(os.path.join(ROOT, member, "src"))
        skip = set()
        for dirpath, dirnames, names in sorted(os.walk(src)):
            dirnames.sort()
            for name in sorted(names):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                text = open(path, encoding="utf-8").read()
                skip.update(test_files(path, text))
                module = path[:-3]
                if module.endswith(os.sep + "mod"):
                    module = os.path.dirname(module)
                if any(module == s or module.startswith(s + os.sep) for s in skip):
                    continue
                found[os.path.relpath(path, ROOT)] = code_lines(text)
    return found


def main(argv):
    limit, show_all = 800, False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--max":
            limit = int(args.pop(0))
        elif arg == "--all":
            show_all = True
        else:
            print(__doc__, file=sys.stderr)
            return 2
    found = sorted(sizes().items(), key=lambda item: -item[1])
    failed = False
    for path, lines in found:
        over = lines > limit
        if not (over or show_all):
            continue
        note = ""
        if over and path in ALLOWED:
            note = "  (allowed for now)"
        elif over:
            note = f"  over {limit}"
            failed = True
        print(f"{lines:6} {path}{note}")
    stale = sorted(p for p in ALLOWED if dict(found).get(p, 0) <= limit)
    for path in stale:
        print(f"{path} is allowed but no longer over {limit}: take it off the list", file=sys.stderr)
    if failed:
        print(f"files over {limit} lines (inline tests excluded): split them by meaning", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

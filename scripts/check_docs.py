#!/usr/bin/env python3
"""The documentation check CI runs (Python 3.11, standard library only).

Three checks, each failing the run with what is wrong and where:

1. Links: every relative link and image in every `.md` of the repository (not under `target/`,
   `.git/`, fuzz corpora and artifacts, virtual environments) names a file or directory that
   exists, and its `#anchor`, when it points into a Markdown file, is one of that file's
   headings as GitHub makes its anchors (lower case, punctuation dropped, spaces to `-`, a
   repeated heading `-1`, `-2`, ...) or an explicit `<a id>`/`<a name>`.
2. Configuration keys: the keys of `docs/configuration.md` (the first cell of each row of a
   `| key | default | what it does |` table, under a heading naming its `[section]`) are exactly
   those of `station-gateway --print-config` (set or commented out there), both ways.
3. Commands: every command in a fenced `sh` block of `README.md` and `docs/getting-started.md`
   is run, unless the line just above its block is `<!-- not run in CI: REASON -->`. The blocks
   of a page run in order, against what the page starts:
   - `cargo run [--release] [-p PKG] [--bin BIN] --` runs the debug build of that binary
     (`station-gateway` unless `--bin` says), built once by this script, and the built
     binaries come first on `PATH` (`$PWD/target/release` is read as that directory);
   - every fixed `127.0.0.1:PORT` of a page becomes one free port of this machine, the same one
     throughout the page, so the check runs beside anything else;
   - a block that starts the gateway (`station-gateway ...` other than `--help`,
     `--print-config`, `--version`) is a server: started (on the page's port for 5000 when it
     names no `--http`), awaited until `/readyz` answers 200, and stopped with Ctrl-C (SIGINT)
     before the page's next server block and at the end; it must then exit 0;
   - any other block runs whole in `bash -e -o pipefail` and must exit 0 within 90 s.

Usage: python3 scripts/check_docs.py [--no-run] [--no-build] [--bin-dir DIR] [--show-output]
  --no-run    links and configuration keys only (still needs the binary for --print-config)
  --no-build  use the binaries already in --bin-dir
  --bin-dir   where the debug binaries are (default: $CARGO_TARGET_DIR/debug or target/debug)
  --show-output  print what each command block printed
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".git", "target", "node_modules", ".venv", "venv", "pyenv", "corpus", "artifacts", "coverage"}
COMMAND_PAGES = ["README.md", "docs/getting-started.md"]
SHELL_INFOS = {"sh", "bash", "shell"}
NOT_RUN = re.compile(r"^<!--\s*not run in CI:\s*(\S.*?)\s*-->$")
FENCE = re.compile(r"^(\s{0,3})(`{3,}|~{3,})\s*([^`\s]*)")


# ---------------------------------------------------------------- Markdown reading

def markdown_files() -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".") or d == ".ci")
        for name in sorted(filenames):
            if name.endswith(".md"):
                found.append(Path(dirpath) / name)
    return found


def split_fences(text: str):
    """Yields (kind, lines, start_line, info) where kind is 'prose' or 'code'."""
    lines = text.split("\n")
    prose: list[str] = []
    prose_start = 1
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            if prose:
                yield "prose", prose, prose_start, ""
            fence = m.group(2)
            info = m.group(3).lower()
            start = i + 1
            body = []
            i += 1
            while i < len(lines) and not re.match(r"^\s{0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", lines[i]):
                body.append(lines[i])
                i += 1
            yield "code", body, start + 1, info
            i += 1
            prose = []
            prose_start = i + 1
            continue
        prose.append(lines[i])
        i += 1
    if prose:
        yield "prose", prose, prose_start, ""


def strip_code_spans(line: str) -> str:
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def heading_text(raw: str) -> str:
    """The text GitHub renders for a heading's source."""
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    parts = re.split(r"(`+[^`]*`+)", text)
    out = []
    for part in parts:
        if part.startswith("`"):
            out.append(part.strip("`"))
        else:
            out.append(part.replace("*", ""))
    return "".join(out).strip()


def github_slug(text: str) -> str:
    slug = text.lower()
    slug = "".join(ch for ch in slug if ch.isalnum() or ch in " -_")
    return slug.replace(" ", "-")


def anchors_of(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path in cache:
        return cache[path]
    text = path.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for kind, lines, _start, _info in split_fences(text):
        if kind != "prose":
            continue
        for line in lines:
            for m in re.finditer(r"<a\s+(?:id|name)=\"([^\"]+)\"", line):
                anchors.add(m.group(1))
            m = re.match(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = github_slug(heading_text(m.group(2)))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    cache[path] = anchors
    return anchors


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HREF = re.compile(r"<(?:a|img)\s[^>]*(?:href|src)=\"([^\"]+)\"")


def check_links() -> list[str]:
    problems = []
    cache: dict[Path, set[str]] = {}
    files = markdown_files()
    for md in files:
        rel = md.relative_to(ROOT)
        text = md.read_text(encoding="utf-8")
        for kind, lines, start, _info in split_fences(text):
            if kind != "prose":
                continue
            for offset, line in enumerate(lines):
                visible = strip_code_spans(line)
                targets = [m.group(1) for m in LINK.finditer(visible)]
                targets += [m.group(1) for m in HREF.finditer(visible)]
                m = REF_DEF.match(visible)
                if m:
                    targets.append(m.group(1))
                for target in targets:
                    why = resolve(md, target, cache)
                    if why:
                        problems.append(f"{rel}:{start + offset}: link {target!r}: {why}")
    print(f"links: {len(files)} Markdown files checked")
    return problems


def resolve(md: Path, target: str, cache: dict[Path, set[str]]) -> str | None:
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return None  # an absolute URL: not checked here
    path_part, _, anchor = target.partition("#")
    path_part = urllib.parse.unquote(path_part.split("?", 1)[0])
    anchor = urllib.parse.unquote(anchor)
    if path_part:
        dest = (ROOT / path_part.lstrip("/")) if path_part.startswith("/") else (md.parent / path_part)
        dest = dest.resolve()
        if not dest.exists():
            return f"{dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist"
    else:
        dest = md
    if anchor and dest.is_file() and dest.suffix == ".md":
        if anchor not in anchors_of(dest, cache):
            return f"no heading makes the anchor #{anchor} in {dest.relative_to(ROOT)}"
    return None


# ---------------------------------------------------------------- configuration keys

def print_config_keys(text: str) -> set[str]:
    """Every key of the --print-config example, set or commented out, as section.key."""
    keys = set()
    section = ""
    for line in text.split("\n"):
        s = line.strip()
        if not s:
            section = ""  # a blank line ends a section's block: what follows is top level
            continue
        m = re.match(r"^(?:#\s*)?\[\[?([A-Za-z0-9_.]+)\]\]?\s*$", s)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^(?:#\s?)?([a-z][a-z0-9_]*)\s*=", s)
        if m:
            keys.add(f"{section}.{m.group(1)}" if section else m.group(1))
    canonical = set()
    for key in keys:
        # A [[station]] table's sub-tables override the gateway's sections of the same name.
        m = re.match(r"^station\.(lease|legacy|history|config_files)\.(.+)$", key)
        canonical.add(f"{m.group(1)}.{m.group(2)}" if m else key)
    return canonical


def documented_keys(text: str) -> set[str]:
    keys = set()
    section: str | None = None
    in_key_table = False
    for line in text.split("\n"):
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            heading = m.group(1)
            sm = re.search(r"`\[\[?([A-Za-z0-9_.]+)\]\]?`", heading)
            if sm:
                section = sm.group(1)
            elif heading.strip().lower() == "top level":
                section = ""
            else:
                section = None
            in_key_table = False
            continue
        if re.match(r"^\|\s*key\s*\|\s*default\s*\|", line):
            in_key_table = True
            continue
        if not line.startswith("|"):
            in_key_table = False
            continue
        if in_key_table and section is not None:
            cm = re.match(r"^\|\s*`([a-z][a-z0-9_]*)`\s*\|", line)
            if cm:
                keys.add(f"{section}.{cm.group(1)}" if section else cm.group(1))
    return keys


def check_config_keys(gateway: Path) -> list[str]:
    out = subprocess.run([str(gateway), "--print-config"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return [f"station-gateway --print-config failed ({out.returncode}): {out.stderr.strip()}"]
    printed = print_config_keys(out.stdout)
    doc = ROOT / "docs" / "configuration.md"
    documented = documented_keys(doc.read_text(encoding="utf-8"))
    problems = [f"docs/configuration.md: `{k}` is in --print-config but not documented" for k in sorted(printed - documented)]
    problems += [f"docs/configuration.md: `{k}` is documented but not in --print-config" for k in sorted(documented - printed)]
    print(f"configuration keys: {len(printed)} in --print-config, {len(documented)} documented")
    return problems


# ---------------------------------------------------------------- commands

def shell_blocks(page: Path):
    """Yields (line, script, reason-not-run or None) for each sh block of a page."""
    text = page.read_text(encoding="utf-8")
    previous_prose: list[str] = []
    for kind, lines, start, info in split_fences(text):
        if kind == "prose":
            previous_prose = lines
            continue
        if info not in SHELL_INFOS:
            previous_prose = []
            continue
        above = [ln.strip() for ln in previous_prose if ln.strip()]
        marker = NOT_RUN.match(above[-1]) if above else None
        yield start, "\n".join(lines), (marker.group(1) if marker else None)
        previous_prose = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Page:
    """Runs one page's blocks in order: its ports, its servers."""

    def __init__(self, page: Path, bin_dir: Path, show_output: bool = False):
        self.show_output = show_output
        self.page = page
        self.bin_dir = bin_dir
        self.ports: dict[str, int] = {}
        self.server: subprocess.Popen | None = None
        self.server_log: Path | None = None
        self.env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        self.env.pop("RUST_LOG", None)
        # Commands run in a folder of their own, never in the working tree: what a page's
        # example writes (a captured stream, a state file) is removed with it, and two checks at
        # once do not share it.
        self.workdir = tempfile.mkdtemp(prefix="check-docs-")

    def rewrite(self, script: str) -> str:
        script = script.replace("$PWD/target/release", str(self.bin_dir))

        def cargo_run(m: re.Match) -> str:
            return (m.group("bin") or "station-gateway") + " "

        script = re.sub(
            r"cargo run(?: --release)?(?: -p \S+)?(?: --bin (?P<bin>\S+))? -- ?", cargo_run, script
        )

        def port(m: re.Match) -> str:
            fixed = m.group(1)
            if fixed == "0":
                return m.group(0)
            if fixed not in self.ports:
                self.ports[fixed] = free_port()
            return f"127.0.0.1:{self.ports[fixed]}"

        return re.sub(r"127\.0\.0\.1:(\d+)", port, script)

    @staticmethod
    def is_server(script: str) -> bool:
        try:
            words = shlex.split(script.replace("\\\n", " "), comments=True)
        except ValueError:
            return False
        if not words or words[0] != "station-gateway":
            return False
        if "\n" in script.replace("\\\n", " ").strip():
            return False
        return not ({"--help", "-h", "--print-config", "--version", "-V"} & set(words))

    def start_server(self, script: str, line: int) -> str | None:
        self.stop_server()
        command = script.replace("\\\n", " ").strip()
        if "--http" not in command:
            if "5000" not in self.ports:
                self.ports["5000"] = free_port()
            command += f" --http 127.0.0.1:{self.ports['5000']}"
        fd, log = tempfile.mkstemp(prefix="check-docs-server-", suffix=".log")
        self.server_log = Path(log)
        print(f"  server: {command}")
        self.server = subprocess.Popen(
            ["bash", "-c", "exec " + command], cwd=self.workdir, env=self.env,
            stdout=fd, stderr=fd, start_new_session=True,
        )
        os.close(fd)
        deadline = time.monotonic() + 60
        http = None
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                return f"line {line}: the server exited ({self.server.returncode}):\n{self.server_log.read_text()[-2000:]}"
            m = re.search(r"HTTP listening on (https?://\S+)", self.server_log.read_text(errors="replace"))
            if m:
                http = m.group(1).rstrip("/")
                try:
                    with urllib.request.urlopen(http + "/readyz", timeout=2) as answer:
                        if answer.status == 200:
                            return None
                except Exception:
                    pass
            time.sleep(0.2)
        return f"line {line}: the server was not ready within 60 s (HTTP at {http}):\n{self.server_log.read_text()[-2000:]}"

    def stop_server(self) -> str | None:
        if self.server is None:
            return None
        server, self.server = self.server, None
        server.send_signal(signal.SIGINT)
        try:
            code = server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            return "the server did not stop within 20 s of Ctrl-C"
        log = self.server_log.read_text(errors="replace") if self.server_log else ""
        if self.server_log:
            self.server_log.unlink(missing_ok=True)
        if code != 0:
            return f"the server exited {code} after Ctrl-C:\n{log[-2000:]}"
        return None

    def run(self) -> tuple[list[str], int, int]:
        problems: list[str] = []
        ran = skipped = 0
        rel = self.page.relative_to(ROOT)
        try:
            for line, script, reason in shell_blocks(self.page):
                if reason:
                    skipped += 1
                    print(f"{rel}:{line}: not run: {reason}")
                    continue
                rewritten = self.rewrite(script)
                ran += 1
                if self.is_server(rewritten):
                    print(f"{rel}:{line}: run as a server")
                    why = self.start_server(rewritten, line)
                    if why:
                        problems.append(f"{rel}:{why}")
                        self.stop_server()
                    continue
                print(f"{rel}:{line}: run")
                try:
                    out = subprocess.run(
                        ["bash", "-e", "-o", "pipefail", "-c", rewritten], cwd=self.workdir, env=self.env,
                        capture_output=True, text=True, timeout=90,
                    )
                except subprocess.TimeoutExpired:
                    problems.append(f"{rel}:{line}: did not finish within 90 s:\n{rewritten}")
                    continue
                if self.show_output:
                    print(textwrap.indent((out.stdout + out.stderr).rstrip()[-3000:], "    | "))
                if out.returncode != 0:
                    problems.append(
                        f"{rel}:{line}: exited {out.returncode}:\n{rewritten}\n--- stdout\n{out.stdout[-2000:]}\n--- stderr\n{out.stderr[-2000:]}"
                    )
            why = self.stop_server()
            if why:
                problems.append(f"{rel}: {why}")
        finally:
            if self.server is not None:
                os.killpg(self.server.pid, signal.SIGKILL)
            shutil.rmtree(self.workdir, ignore_errors=True)
        return problems, ran, skipped


def check_commands(bin_dir: Path, run: bool, show_output: bool) -> list[str]:
    problems = []
    for name in COMMAND_PAGES:
        page = ROOT / name
        if not run:
            for line, _script, reason in shell_blocks(page):
                if reason is None:
                    print(f"{name}:{line}: would run (--no-run)")
            continue
        found, ran, skipped = Page(page, bin_dir, show_output).run()
        print(f"{name}: {ran} blocks run, {skipped} not run in CI (reason given above)")
        problems += found
    return problems


# ---------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-run", action="store_true")
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--bin-dir", type=Path)
    parser.add_argument("--show-output", action="store_true")
    args = parser.parse_args()
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    bin_dir = (args.bin_dir or target / "debug").resolve()

    problems = check_links()
    if not args.no_build:
        print("building the debug binaries the pages run: cargo build -p station-gateway -p station-simulator --bins")
        subprocess.run(
            ["cargo", "build", "-q", "-p", "station-gateway", "-p", "station-simulator", "--bins"],
            cwd=ROOT, check=True,
        )
    gateway = bin_dir / "station-gateway"
    if not gateway.exists():
        problems.append(f"{gateway} does not exist: build it, or leave out --no-build")
    else:
        problems += check_config_keys(gateway)
        problems += check_commands(bin_dir, run=not args.no_run, show_output=args.show_output)

    if problems:
        print(f"\ndocs check: {len(problems)} problem(s)", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print("docs check: every link resolves, every key is documented, every command ran or says why not")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Import circles among the files of each Rust crate: none may be left.

A file imports another when it names an item of the other's module (`crate::a::b`, `super::b`,
`self::b`, in a `use` or inline); a circle is a set of files that import each other round.
Comments and strings are left out. Exit 1 naming each circle's files and what ties them.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def module_of(src, file):
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def code_only(text):
    """The text with comments, strings and char literals blanked (a `//` in a URL is no comment)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif (raw := re.match(r'b?r(#*)"', text[i : i + 8])) is not None:
            close = '"' + raw.group(1)
            end = text.find(close, i + raw.end())
            i = n if end < 0 else end + len(close)
            out.append('""')
        elif text[i] == '"' or text.startswith('b"', i):
            i += 1 if text[i] == '"' else 2
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif (char := re.match(r"'(?:\\.[^']*|[^'\\])'", text[i : i + 12])) is not None:
            i += char.end()
            out.append("' '")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def paths_in(text):
    """Every path named, group imports (`crate::a::{b, c::d}`) spelled out."""
    found = []
    for head, prefix, inner in GROUP.findall(text):
        for item in re.split(r",(?![^{]*\})", inner):
            item = re.sub(r"\s+as\s+\w+", "", item.strip())
            if item and item != "self":
                found.append((head, prefix + "::" + item.split("::{")[0]))
            elif item == "self":
                found.append((head, prefix))
    found.extend(PATH.findall(GROUP.sub("", text)))
    return found


def crate_files(src):
    files = {}
    for file in sorted(src.rglob("*.rs")):
        if "bin" in file.relative_to(src).parts:
            continue
        files[module_of(src, file)] = file
    return files


def edges(src):
    files = crate_files(src)
    graph = {module: {} for module in files}
    for module, file in files.items():
        is_dir_module = file.stem in ("lib", "main", "mod")
        here = module if is_dir_module else module[:-1]
        for head, path in paths_in(code_only(file.read_text())):
            names = [n for n in path.split("::") if n]
            if head == "crate":
                base = ()
            elif head == "self":
                base = module
            else:
                base = here[:-1] if is_dir_module else here
                while names and names[0] == "super":
                    base, names = base[:-1], names[1:]
            target = base + tuple(names)
            while target and target not in files:
                target = target[:-1]
            if target in files and target != module:
                graph[module].setdefault(target, set()).add(names[-1] if names else "")
    return files, graph


def circles(graph):
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in graph:
        if node not in index:
            visit(node)
    return found


def main():
    failed = False
    for manifest in sorted(ROOT.glob("**/Cargo.toml")):
        src = manifest.parent / "src"
        if "target" in manifest.relative_to(ROOT).parts or not src.is_dir():
            continue
        files, graph = edges(src)
        for circle in circles(graph):
            failed = True
            print(f"gpuprof: an import circle in {src.relative_to(ROOT)}:", file=sys.stderr)
            for module in circle:
                for target, names in sorted(graph[module].items()):
                    if target in circle:
                        print(
                            f"  {files[module].relative_to(ROOT)} -> {files[target].relative_to(ROOT)}: "
                            f"{', '.join(sorted(names))}",
                            file=sys.stderr,
                        )
    if failed:
        print("gpuprof: move what both sides need below them (docs/architecture.md)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""List the C functions longer than a limit (150 lines by default) under the given paths.

    scripts/long_functions.py [--max N] [PATH ...]      (default: src)

A function is a top-level brace block whose opening line (or the lines just before it) reads like
a function definition: an identifier followed by a parameter list, not a struct, union, enum,
initialiser or `extern "C"` block. Its length counts from the line of its name to the line of its
closing brace, as a reader sees it. Comments, string and character literals are skipped when
counting braces; preprocessor lines are ignored (a function whose braces are split between
`#if` branches is not handled: the library has none). Prints "LINES path:line name", longest
first, and exits 1 when any function is over the limit (0 otherwise), so that it can gate a
check. Standard library only; .c, .h and .cu files (.cu kernels are listed too: the issue's
rule exempts the CUDA kernels, the reader decides).
"""
import argparse
import os
import re
import sys

NAME = re.compile(r"([A-Za-z_]\w*)\s*\([^;{}]*\)\s*(?:__attribute__\s*\(\(.*?\)\)\s*)*$", re.S)
NOT_FUNC = re.compile(r"\b(struct|union|enum)\b[^()]*$|=\s*$|\bextern\s+\"C\"\s*$", re.S)
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else"}


def strip(text):
    """The text with comments, string and character literals blanked (newlines kept) and
    preprocessor lines emptied, so that braces and parentheses can be counted."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":                      # a preprocessor line (with continuations)
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * max(0, min(j, n) - i - 1) + c)
            i = j + 1
            continue
        out.append(c)
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        i += 1
    return "".join(out)


def functions(path):
    """(name, first line, last line) of each top-level function definition in the file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip(f.read())
    found = []
    depth = 0
    head_start = 0          # offset where the text before the current top-level block begins
    open_at = None
    for i, c in enumerate(text):
        if c == "{":
            if depth == 0:
                open_at = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and open_at is not None:
                head = text[head_start:open_at]
                # the declaration just before the brace: after the last ';' or '}' at file level
                m = NAME.search(head.rstrip())
                if m and m.group(1) not in KEYWORDS and not NOT_FUNC.search(head.rstrip()):
                    first = text.count("\n", 0, head_start + m.start(1)) + 1
                    last = text.count("\n", 0, i) + 1
                    found.append((m.group(1), first, last))
                head_start = i + 1
                open_at = None
        elif c == ";" and depth == 0:
            head_start = i + 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=150, help="the longest allowed function, in lines (150)")
    ap.add_argument("paths", nargs="*", default=["src"])
    a = ap.parse_args()
    rows = []
    for p in a.paths:
        files = [p] if os.path.isfile(p) else [os.path.join(r, f) for r, _, fs in os.walk(p) for f in fs]
        for f in sorted(files):
            if f.endswith((".c", ".h", ".cu")):
                for name, first, last in functions(f):
                    if last - first + 1 > a.max:
                        rows.append((last - first + 1, f, first, name))
    for n, f, line, name in sorted(rows, key=lambda r: (-r[0], r[1], r[2])):
        print(f"{n:5d} {f}:{line} {name}")
    print(f"{len(rows)} function(s) over {a.max} lines", file=sys.stderr)
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())

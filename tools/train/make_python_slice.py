#!/usr/bin/env python3
"""Builds the corpus slice the EAGLE-3 head trains on: Python files of this Debian machine
(CPython's standard library and Debian's Python packages, test folders left out), in the JSONL.xz
layout of tools/corpus/build_corpus.py, small enough to carry to the GPU host (~2.1 MiB).

Files are taken in the order of their path's SHA-256 (a spread over every package, the same on
the same machine image), deduplicated by content, 200 B to 400 kB each, until --max-bytes of
text. --c-bytes adds that much of /usr/include's C and C++ headers after the Python, taken the
same way (the corpus's C category: the bundled draft model trained on both). Held-out files are
those common.is_heldout picks, as for the bundled models.

Usage: python3 tools/train/make_python_slice.py --out python-slice.jsonl.xz [--c-bytes N]
"""
import argparse
import hashlib
import json
import lzma
import os

PYTHON_ROOTS = ["/usr/lib/python3.11", "/usr/lib/python3/dist-packages"]
C_ROOTS = ["/usr/include"]
C_SUFFIXES = (".h", ".hpp", ".hh", ".hxx")


def candidates(roots, keep):
    """Paths under roots that keep() accepts, in the order of their path's SHA-256."""
    files = []
    for root in roots:
        for dirpath, dirnames, names in os.walk(root):
            dirnames.sort()
            if "__pycache__" in dirpath or "/test" in dirpath:
                continue
            for name in sorted(names):
                path = os.path.join(dirpath, name)
                if keep(name) and os.path.isfile(path) and not os.path.islink(path):
                    files.append(path)
    files.sort(key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    return files


def write(f, files, category, max_bytes, seen):
    """Writes documents of files until max_bytes of text; returns (files, characters)."""
    total, count = 0, 0
    for path in files:
        if total > max_bytes:
            break
        try:
            text = open(path, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        if not 200 <= len(text) <= 400_000:
            continue
        digest = hashlib.sha256(text.encode()).digest()
        if digest in seen:
            continue
        seen.add(digest)
        f.write(json.dumps({"path": path, "category": category, "text": text}) + "\n")
        total += len(text)
        count += 1
    return count, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=13_000_000, help="characters of Python")
    ap.add_argument("--c-bytes", type=int, default=0, help="characters of C/C++ headers after the Python")
    args = ap.parse_args()
    seen = set()
    with lzma.open(args.out, "wt", encoding="utf-8", preset=9) as f:
        count, total = write(f, candidates(PYTHON_ROOTS, lambda n: n.endswith(".py")), "python", args.max_bytes, seen)
        print(f"{args.out}: {count} Python files, {total} characters")
        if args.c_bytes > 0:
            count, total = write(f, candidates(C_ROOTS, lambda n: n.endswith(C_SUFFIXES)), "c", args.c_bytes, seen)
            print(f"{args.out}: {count} C/C++ header files, {total} characters")


if __name__ == "__main__":
    main()

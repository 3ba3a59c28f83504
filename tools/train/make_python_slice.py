#!/usr/bin/env python3
"""Builds the corpus slice the EAGLE-3 head trains on: Python files of this Debian machine
(CPython's standard library and Debian's Python packages, test folders left out), in the JSONL.xz
layout of tools/corpus/build_corpus.py, small enough to carry to the GPU host (~2.1 MiB).

Files are taken in the order of their path's SHA-256 (a spread over every package, the same on
the same machine image), deduplicated by content, 200 B to 400 kB each, until --max-bytes of
text. Held-out files are those common.is_heldout picks, as for the bundled models.

Usage: python3 tools/train/make_python_slice.py --out python-slice.jsonl.xz
"""
import argparse
import hashlib
import json
import lzma
import os

ROOTS = ["/usr/lib/python3.11", "/usr/lib/python3/dist-packages"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=13_000_000)
    args = ap.parse_args()
    files = []
    for root in ROOTS:
        for dirpath, dirnames, names in os.walk(root):
            dirnames.sort()
            if "__pycache__" in dirpath or "/test" in dirpath:
                continue
            for name in sorted(names):
                path = os.path.join(dirpath, name)
                if name.endswith(".py") and os.path.isfile(path) and not os.path.islink(path):
                    files.append(path)
    files.sort(key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    seen, total, count = set(), 0, 0
    with lzma.open(args.out, "wt", encoding="utf-8", preset=9) as f:
        for path in files:
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
            f.write(json.dumps({"path": path, "category": "python", "text": text}) + "\n")
            total += len(text)
            count += 1
            if total > args.max_bytes:
                break
    print(f"{args.out}: {count} files, {total} characters")


if __name__ == "__main__":
    main()

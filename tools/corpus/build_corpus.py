#!/usr/bin/env python3
"""Builds the deterministic training corpus for the bundled models from files that a stock
Debian 12 machine has: CPython's standard library and Debian's Python packages, C headers,
Perl modules and plain-text package documentation.

Output (in --out): corpus.jsonl.xz (one JSON object per document: path, category, text) and
manifest.tsv (path, category, bytes, sha256, Debian package, licence). Documents are ordered by
(category, path) and deduplicated by content, so the same machine image yields the same bytes.
"""
import argparse
import hashlib
import json
import lzma
import os
import re
import sys
from pathlib import Path

# (category, roots, filename pattern, cap in bytes for the category)
SOURCES = [
    ("python", ["/usr/lib/python3.11", "/usr/lib/python3/dist-packages"], r".*\.py$", 60_000_000),
    ("c", ["/usr/include"], r".*\.(h|hpp|hh|hxx)$", 45_000_000),
    ("perl", ["/usr/share/perl", "/usr/lib/x86_64-linux-gnu/perl"], r".*\.pm$", 12_000_000),
    ("text", ["/usr/share/doc"], r"(README.*|.*\.(txt|md|rst))$", 12_000_000),
]
MAX_FILE = 400_000  # generated tables and data dumps teach nothing useful
MIN_FILE = 200


def package_index():
    """Maps each installed path to its Debian package, from dpkg's file lists."""
    index = {}
    info = Path("/var/lib/dpkg/info")
    for lst in sorted(info.glob("*.list")):
        pkg = lst.name[: -len(".list")].split(":")[0]
        for line in lst.read_text(errors="replace").splitlines():
            index[line] = pkg
    return index


def licence_of(pkg, cache):
    if pkg in cache:
        return cache[pkg]
    lic = "unknown"
    copyright_file = Path("/usr/share/doc") / pkg / "copyright"
    try:
        for line in copyright_file.read_text(errors="replace").splitlines():
            if line.startswith("License:"):
                lic = line.split(":", 1)[1].strip() or lic
                break
    except OSError:
        pass
    cache[pkg] = lic
    return lic


def candidate_files(roots, pattern):
    rx = re.compile(pattern)
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            if "__pycache__" in dirpath:
                continue
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if rx.match(name) and os.path.isfile(path) and not os.path.islink(path):
                    yield path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    packages = package_index()
    licences = {}
    seen = set()
    total = 0
    with lzma.open(out / "corpus.jsonl.xz", "wt", encoding="utf-8", preset=6) as corpus, open(
        out / "manifest.tsv", "w", encoding="utf-8"
    ) as manifest:
        manifest.write("path\tcategory\tbytes\tsha256\tpackage\tlicence\n")
        for category, roots, pattern, cap in SOURCES:
            used = 0
            for path in candidate_files(roots, pattern):
                data = Path(path).read_bytes()
                if not (MIN_FILE <= len(data) <= MAX_FILE) or b"\0" in data:
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                digest = hashlib.sha256(data).hexdigest()
                if digest in seen:
                    continue
                if used + len(data) > cap:
                    break
                seen.add(digest)
                used += len(data)
                pkg = packages.get(os.path.realpath(path), packages.get(path, "unknown"))
                corpus.write(json.dumps({"path": path, "category": category, "text": text}) + "\n")
                manifest.write(f"{path}\t{category}\t{len(data)}\t{digest}\t{pkg}\t{licence_of(pkg, licences)}\n")
            print(f"{category}: {used / 1e6:.1f} MB", file=sys.stderr)
            total += used
    print(f"total: {total / 1e6:.1f} MB in {len(seen)} documents", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A small deterministic slice of the corpus for the drafter's training (carried to the GPU host
where the full corpus is not): Python from CPython's standard library and C headers, the same
files tools/corpus/build_corpus.py takes first, in its order, up to a byte budget per category.
Usage: corpus_slice.py OUT.jsonl.xz [PYTHON_MB] [C_MB]
"""
import json
import lzma
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "corpus"))
from build_corpus import MAX_FILE, MIN_FILE, candidate_files  # noqa: E402


def main():
    out = sys.argv[1]
    budgets = [("python", ["/usr/lib/python3.11"], r".*\.py$", float(sys.argv[2]) if len(sys.argv) > 2 else 8.0),
               ("c", ["/usr/include"], r".*\.(h|hpp|hh|hxx)$", float(sys.argv[3]) if len(sys.argv) > 3 else 2.0)]
    with lzma.open(out, "wt", encoding="utf-8", preset=9) as f:
        for category, roots, pattern, mb in budgets:
            used = 0
            for path in candidate_files(roots, pattern):
                data = Path(path).read_bytes()
                if not (MIN_FILE <= len(data) <= MAX_FILE) or b"\0" in data:
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if used + len(data) > mb * 1e6:
                    break
                used += len(data)
                f.write(json.dumps({"path": path, "category": category, "text": text}) + "\n")
            print(f"{category}: {used / 1e6:.1f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()

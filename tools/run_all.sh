#!/usr/bin/env bash
# Runs every GPU-host step in one go: tokenizers, the bundled target and draft (trained side by
# side), then the reference fixtures. Usage (from the repository root, on the GPU host):
#   tools/run_all.sh CORPUS_DIR WORK_DIR [TARGET_SECONDS] [DRAFT_SECONDS]
# CORPUS_DIR holds corpus.jsonl.xz from tools/corpus/build_corpus.py. Results land in
# WORK_DIR/models/{target,draft} and WORK_DIR/fixtures (copy them to models/ and tests/fixtures/).
set -euo pipefail
corpus="$1/corpus.jsonl.xz"
work="$2"
target_budget="${3:-360}"
draft_budget="${4:-300}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$work"
python3 tools/train/train_tokenizers.py --corpus "$corpus" --out "$work/tokenizers"
python3 tools/train/train_model.py --role target --corpus "$corpus" --tokenizer "$work/tokenizers/bytelevel" \
  --out "$work/models/target" --time-budget "$target_budget" --lr 1.5e-3 > "$work/target.log" 2>&1 &
target_pid=$!
python3 tools/train/train_model.py --role draft --corpus "$corpus" --tokenizer "$work/tokenizers/bytelevel" \
  --out "$work/models/draft" --time-budget "$draft_budget" --lr 3e-3 > "$work/draft.log" 2>&1 &
draft_pid=$!
wait $draft_pid || { tail -30 "$work/draft.log"; exit 1; }
wait $target_pid || { tail -30 "$work/target.log"; exit 1; }
grep -E "parameters|ms/step|held-out" "$work/target.log" "$work/draft.log"
python3 tools/fixtures/make_fixtures.py --out "$work/fixtures" --models "$work/models" \
  --tokenizers "$work/tokenizers" --corpus "$corpus"

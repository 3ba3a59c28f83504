#!/usr/bin/env python3
"""Trains the two tokenizers with the `tokenizers` library:
- bytelevel: byte-level BPE with a Llama-3 style regex pre-tokenizer (the bundled models use it);
- metaspace: SentencePiece-style BPE (metaspace pre-tokenizer, byte fallback), like Llama-2 or
  Mistral, used only by the tokenizer fixtures.
Each is written as tokenizer.json + tokenizer_config.json in its own folder.
"""
import argparse
import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from common import CHAT_TEMPLATE, SPECIAL_TOKENS, SPLIT_PATTERN, is_heldout, read_corpus


def training_texts(corpus, limit_bytes):
    used = 0
    for doc in read_corpus(corpus):
        if is_heldout(doc):
            continue
        used += len(doc["text"])
        if used > limit_bytes:
            return
        yield doc["text"]


def bytelevel(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def metaspace(vocab_size):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
        show_progress=False,
    )
    return tok, trainer


def write_config(folder, tok, kind):
    if kind == "bytelevel":
        cfg = {
            "bos_token": None,
            "eos_token": "<|endoftext|>",
            "pad_token": "<|pad|>",
            "unk_token": None,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "chat_template": CHAT_TEMPLATE,
            "model_max_length": 2048,
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
    else:
        cfg = {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "model_max_length": 2048,
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--metaspace-vocab-size", type=int, default=4096)
    ap.add_argument("--train-bytes", type=int, default=40_000_000)
    args = ap.parse_args()
    for kind, build, size in (("bytelevel", bytelevel, args.vocab_size),
                              ("metaspace", metaspace, args.metaspace_vocab_size)):
        tok, trainer = build(size)
        tok.train_from_iterator(training_texts(args.corpus, args.train_bytes), trainer=trainer)
        folder = Path(args.out) / kind
        folder.mkdir(parents=True, exist_ok=True)
        tok.save(str(folder / "tokenizer.json"))
        write_config(folder, tok, kind)
        print(f"{kind}: vocab {tok.get_vocab_size()}", flush=True)


if __name__ == "__main__":
    main()

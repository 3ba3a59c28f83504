"""Shared helpers for the training and fixture tools (run on the GPU host only)."""
import hashlib
import json
import lzma

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

# Llama-3 / GPT-4 style pre-tokenizer pattern.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def read_corpus(path):
    """Yields corpus documents (dicts with path, category, text) in corpus order."""
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def is_heldout(doc):
    """Deterministic 1 % held-out split by path."""
    return hashlib.sha256(doc["path"].encode()).digest()[0] < 3

#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/<target>/ from the repository's own fixtures
(model configs, chat templates, tokenizer fixture strings, server request examples) and small
hand-made files. Run from anywhere: python3 tests/fuzz/make_corpus.py. Only the standard library."""
import json
import random
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fuzz" / "corpus"


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


def safetensors(tensors, meta=None, pad=True):
    header, data = {}, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    put("safetensors", "f32", safetensors({"w": ("F32", [2, 2], f32)}, {"format": "pt"}))
    put("safetensors", "mixed", safetensors({"a": ("BF16", [3], b"\x80\x3f" * 3), "b": ("F16", [1, 2], b"\x00\x3c" * 2),
                                             "c": ("I32", [2], struct.pack("<2i", 7, -1))}))
    put("safetensors", "scalar_and_empty", safetensors({"s": ("F32", [], f32[:4]), "e": ("F32", [0, 4], b"")}))
    put("safetensors", "unpadded", safetensors({"w": ("F32", [1], f32[:4])}, pad=False))
    put("safetensors", "empty_header", struct.pack("<Q", 2) + b"{}")


def config_seeds():
    for cfg in sorted((ROOT / "tests" / "fixtures" / "models").glob("*/config.json")):
        put("config", "config_" + cfg.parent.name, b"\0" + cfg.read_bytes())
    put("config", "config_target", b"\0" + (ROOT / "models" / "target" / "config.json").read_bytes())
    for role in ("target", "draft"):
        g = ROOT / "models" / role / "generation_config.json"
        if g.exists():
            put("config", "generation_" + role, b"\1" + g.read_bytes())
    put("config", "generation_sampled", b"\1" + json.dumps(dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=40,
                                                                min_p=0.05, repetition_penalty=1.1,
                                                                eos_token_id=[2, 7])).encode())


def small_bpe(vocab, merges, **parts):
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": parts.pop("added", []),
            "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": parts.pop("unk", None),
                      "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                      "byte_fallback": parts.pop("byte_fallback", False), "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}
    spec.update(parts)
    return json.dumps(spec, ensure_ascii=False)


def tokenizer_load_seeds():
    fixtures = ROOT / "tests" / "fixtures" / "tokenizers"
    for kind in ("bytelevel", "metaspace", "bytelevel_nfc"):
        spec = json.loads((fixtures / kind / "tokenizer.json").read_text(encoding="utf-8"))
        # keep the first 300 tokens (every single character among them) and the merges among them
        vocab = dict(sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])[:300])
        merges = [m for m in spec["model"]["merges"]
                  if all(p in vocab for p in (m.split(" ") if isinstance(m, str) else m))
                  and "".join(m.split(" ") if isinstance(m, str) else m) in vocab]
        spec["model"]["vocab"], spec["model"]["merges"] = vocab, merges
        put("tokenizer_load", kind, json.dumps(spec, ensure_ascii=False))
    vocab = {c: i for i, c in enumerate(["a", "b", "c", "ab", "abc", " ", "▁", "<unk>", "<0x41>", "é", "e"])}
    merges = ["a b", "ab c"]
    added = [{"id": 11, "content": "<s>", "single_word": False, "lstrip": True, "rstrip": False,
              "normalized": False, "special": True},
             {"id": 12, "content": "hey", "single_word": True, "lstrip": False, "rstrip": True,
              "normalized": True, "special": False}]
    variants = {
        "normalizers": dict(normalizer={"type": "Sequence", "normalizers": [
            {"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": "▁"}, {"type": "Prepend", "prepend": "▁"},
            {"type": "NFD"}, {"type": "NFC"}, {"type": "NFKD"}]}),
        "metaspace": dict(pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                         "split": True},
                          decoder={"type": "Sequence", "decoders": [
                              {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                              {"type": "ByteFallback"}, {"type": "Fuse"},
                              {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                          unk="<unk>", byte_fallback=True),
        "split_digits_whitespace": dict(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "b"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Digits", "individual_digits": True}, {"type": "Whitespace"},
            {"type": "Punctuation", "behavior": "Isolated"}, {"type": "WhitespaceSplit"}]}),
        "bytelevel": dict(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                         "use_regex": True},
                          decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                   "use_regex": True}),
        "added_tokens": dict(added=added),
    }
    for name, parts in variants.items():
        put("tokenizer_load", "small_" + name, small_bpe(vocab, merges, **parts))


def tokenizer_encode_seeds():
    rows = [json.loads(l) for l in open(ROOT / "tests" / "fixtures" / "tokenizers" / "bytelevel" / "encode.jsonl",
                                        encoding="utf-8")]
    rnd = random.Random(5)
    picked = rows[:60] + rnd.sample(rows[60:], 90)
    for i, r in enumerate(picked):
        put("tokenizer_encode", f"text_{i:03d}", r["text"])
    put("tokenizer_encode", "invalid_utf8", b"ab\xff\xfe\xc3(\xe2\x82")


def chat_template_seeds():
    for t in sorted((ROOT / "tests" / "fixtures" / "chat_templates" / "templates").glob("*.jinja")):
        put("chat_template", t.name, t.read_bytes())
    put("chat_template", "features.jinja", """{%- set ns = namespace(n=0) -%}
{%- macro show(m) -%}[{{ m.role | upper }}] {{ m.content | trim }}{%- endmacro -%}
{{ bos_token }}{% for m in messages if m.role != 'tool' %}{% set ns.n = ns.n + 1 %}{{ show(m) }}
{%- if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %}{{ loop.index0 }}/{{ loop.length }}
{% endfor %}{{ ns.n }} {{ range(3) | list }} {{ "a,b" .split(",") | join("|") }} {{ {"k": [1, 2]} | items | list }}
{%- if add_generation_prompt %}<assistant>{% endif %}{{ raise_exception("x") if false }}{{ eos_token }}""")


def completion_request_seeds():
    bodies = {
        "completion": (0, {"prompt": "def f(x):", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
                           "min_p": 0.05, "seed": 3, "stop": ["\n\n", "def"], "n": 2, "echo": True}),
        "completion_tokens": (0, {"prompt": [[1, 2, 3], "text"], "stream": True,
                                  "stream_options": {"include_usage": True}, "ignore_eos": True,
                                  "speculative": {"method": "ngram", "num_draft_tokens": 4}}),
        "completion_penalties": (0, {"prompt": "x", "presence_penalty": 0.5, "frequency_penalty": -0.5,
                                     "repetition_penalty": 1.1, "user": "u", "model": "m"}),
        "chat": (1, {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
                     "max_completion_tokens": 8, "stream": False}),
        "chat_parts": (1, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                     {"type": "text", "text": "b"}]}],
                           "logprobs": False}),
        "chat_bad_role": (1, {"messages": [{"role": "robot", "content": "x"}]}),
    }
    for name, (endpoint, body) in bodies.items():
        put("completion_request", name, bytes([endpoint]) + json.dumps(body).encode())


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    safetensors_seeds()
    config_seeds()
    tokenizer_load_seeds()
    tokenizer_encode_seeds()
    chat_template_seeds()
    completion_request_seeds()
    for d in sorted(OUT.iterdir()):
        files = list(d.iterdir())
        print(f"{d.name}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()

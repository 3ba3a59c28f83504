#!/usr/bin/env python3
"""Writes a checkpoint with the exact shape of Llama-3.1-8B (bf16, random weights, 4 shards with
model.safetensors.index.json) for GPU benchmarks, with the bundled byte-level tokenizer padded
by reserved special tokens to Llama-3's 128,256-token vocabulary. Never committed: it is made on
the GPU host at benchmark time.

Usage: python3 tools/gpu/make_llama8b_shape.py OUT_DIR [--layers 32]
"""
import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "bfloat16",
}


def tensors(cfg, gen):
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def rnd(*shape):
        return (torch.randn(*shape, device="cuda", generator=gen, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()

    yield "model.embed_tokens.weight", rnd(v, h)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        yield p + "input_layernorm.weight", torch.ones(h, dtype=torch.bfloat16)
        yield p + "self_attn.q_proj.weight", rnd(nh * hd, h)
        yield p + "self_attn.k_proj.weight", rnd(kv * hd, h)
        yield p + "self_attn.v_proj.weight", rnd(kv * hd, h)
        yield p + "self_attn.o_proj.weight", rnd(h, nh * hd)
        yield p + "post_attention_layernorm.weight", torch.ones(h, dtype=torch.bfloat16)
        yield p + "mlp.gate_proj.weight", rnd(i, h)
        yield p + "mlp.up_proj.weight", rnd(i, h)
        yield p + "mlp.down_proj.weight", rnd(h, i)
    yield "model.norm.weight", torch.ones(h, dtype=torch.bfloat16)
    yield "lm_head.weight", rnd(v, h)


def padded_tokenizer(out, vocab):
    tok = json.loads((ROOT / "models/target/tokenizer.json").read_text())
    have = len(tok["model"]["vocab"])
    for added in tok["added_tokens"]:
        have = max(have, added["id"] + 1)
    for idx in range(have, vocab):
        tok["added_tokens"].append({"id": idx, "content": f"<|reserved_{idx}|>", "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    (out / "tokenizer.json").write_text(json.dumps(tok))
    shutil.copy(ROOT / "models/target/tokenizer_config.json", out / "tokenizer_config.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    cfg = dict(CONFIG, num_hidden_layers=args.layers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    shards, current, size, limit = [], {}, 0, 5 * 1024**3
    for name, t in tensors(cfg, gen):
        if size + t.numel() * 2 > limit and current:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += t.numel() * 2
    shards.append(current)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * 2
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0, "do_sample": False}))
    padded_tokenizer(out, cfg["vocab_size"])
    print(f"wrote {out}: {total / 1e9:.2f} GB in {len(shards)} shards", flush=True)


if __name__ == "__main__":
    main()

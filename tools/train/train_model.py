#!/usr/bin/env python3
"""Trains one bundled model (the target or the draft) as a Hugging Face LlamaForCausalLM on the
corpus, saves it in bf16 with the tokenizer and writes its MODEL_CARD.md.

The step count is fixed by --steps; with --time-budget instead, the script times a few steps
first and derives the count, then records the resolved --steps in the card so that the run can
be repeated exactly.
"""
import argparse
import json
import math
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from common import is_heldout, read_corpus

SHAPES = {
    # ~22 M parameters; kept this size so the bf16 checkpoint is ~44 MB in the repository.
    "target": dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
                   num_attention_heads=8, num_key_value_heads=2),
    # at most 1/8 of the target's parameters
    "draft": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=3,
                  num_attention_heads=3, num_key_value_heads=1),
}


def tokenize(corpus, tokenizer_path, python_repeat):
    tok = Tokenizer.from_file(str(tokenizer_path))
    eot = tok.token_to_id("<|endoftext|>")
    train_docs, held_docs = [], []
    for doc in read_corpus(corpus):
        (held_docs if is_heldout(doc) else train_docs).append(doc)

    def encode(docs):
        ids = []
        for enc in tok.encode_batch([d["text"] for d in docs]):
            ids.append(eot)
            ids.extend(enc.ids)
        return np.asarray(ids, dtype=np.int32)

    # Python is repeated so the models lean towards Python-like code.
    weighted = [d for d in train_docs for _ in range(python_repeat if d["category"] == "python" else 1)]
    rng = np.random.default_rng(1234)
    order = rng.permutation(len(weighted))
    train = encode([weighted[i] for i in order])
    held = encode(held_docs)
    return train, held, tok


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_loss(model, held, seq, device, max_windows=256):
    model.eval()
    n = min(max_windows, (len(held) - 1) // seq)
    losses = []
    for i in range(0, n, 16):
        idx = [held[j * seq:(j * seq) + seq + 1] for j in range(i, min(n, i + 16))]
        x = torch.tensor(np.stack(idx), device=device, dtype=torch.long)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits.float()
        losses.append(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none"))
    model.train()
    return torch.cat(losses).mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=sorted(SHAPES), required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--time-budget", type=float, help="seconds; derives --steps")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--python-repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started = time.time()
    torch.manual_seed(args.seed)
    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True

    train, held, tok = tokenize(args.corpus, Path(args.tokenizer) / "tokenizer.json", args.python_repeat)
    print(f"[{args.role}] tokens: train {len(train)}, held-out {len(held)}", flush=True)
    vocab = tok.get_vocab_size()
    eot = tok.token_to_id("<|endoftext|>")
    config = LlamaConfig(
        vocab_size=vocab, max_position_embeddings=2048, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=eot, eos_token_id=eot, pad_token_id=tok.token_to_id("<|pad|>"),
        head_dim=64, **SHAPES[args.role])
    model = LlamaForCausalLM(config).to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"[{args.role}] parameters: {params}", flush=True)

    data = torch.from_numpy(train).to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    def step_fn(step, steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, args.lr, warmup=min(200, steps // 10))
        starts = torch.randint(0, len(data) - args.seq - 1, (args.batch,), device=device, generator=gen)
        offsets = torch.arange(args.seq + 1, device=device)
        x = data[starts[:, None] + offsets].long()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    steps = args.steps
    step = 0
    if steps is None:
        probe = 30
        for step in range(5):
            step_fn(step, 10_000)
        torch.cuda.synchronize()
        t0 = time.time()
        for step in range(5, 5 + probe):
            step_fn(step, 10_000)
        torch.cuda.synchronize()
        per_step = (time.time() - t0) / probe
        steps = max(200, int(args.time_budget / per_step))
        print(f"[{args.role}] {per_step * 1000:.1f} ms/step -> {steps} steps", flush=True)
        # restart cleanly so the recorded command reproduces the run
        torch.manual_seed(args.seed)
        model = LlamaForCausalLM(config).to(device)
        gen.manual_seed(args.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    t_train = time.time()
    log = []
    for step in range(steps):
        loss = step_fn(step, steps)
        if step % 100 == 0 or step == steps - 1:
            log.append((step, loss.item()))
            print(f"[{args.role}] step {step} loss {log[-1][1]:.4f} {time.time() - t_train:.0f}s", flush=True)
    train_seconds = time.time() - t_train
    final_train = sum(l for _, l in log[-3:]) / len(log[-3:])
    held_loss = heldout_loss(model, held, args.seq, device)
    print(f"[{args.role}] held-out loss {held_loss:.4f}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=eot, eos_token_id=eot, pad_token_id=config.pad_token_id,
                     do_sample=True, temperature=0.8, top_p=0.95, top_k=40).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(args.tokenizer) / name, out / name)

    argv = [a for a in sys.argv[1:]]
    if args.steps is None:
        i = argv.index("--time-budget")
        argv[i:i + 2] = ["--steps", str(steps)]
    command = "python3 tools/train/train_model.py " + shlex.join(argv)
    stats = dict(role=args.role, parameters=params, steps=steps, batch=args.batch, seq=args.seq,
                 tokens_seen=steps * args.batch * args.seq, train_tokens=int(len(train)),
                 heldout_tokens=int(len(held)), final_train_loss=final_train, heldout_loss=held_loss,
                 train_seconds=train_seconds, total_seconds=time.time() - started,
                 gpu=torch.cuda.get_device_name(), torch=torch.__version__, command=command,
                 loss_log=log)
    (out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    write_card(out, config, stats)


def write_card(out, config, s):
    c = config
    rope_theta = getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    card = f"""# specdec bundled {s['role']} model

A small Llama-architecture code model trained from scratch for specdec's tests, demos and
benchmarks. Not a general-purpose model.

| | |
|---|---|
| architecture | `LlamaForCausalLM`, {c.num_hidden_layers} layers, hidden {c.hidden_size}, MLP {c.intermediate_size} (SwiGLU), {c.num_attention_heads} query heads / {c.num_key_value_heads} KV heads (GQA), head dim {c.head_dim}, RoPE θ {rope_theta}, RMSNorm ε {c.rms_norm_eps}, tied embeddings |
| parameters | {s['parameters']:,} |
| vocabulary | {c.vocab_size} (byte-level BPE, `tokenizer.json`) |
| context | {c.max_position_embeddings} tokens (trained at {s['seq']}) |
| weights | bf16, `model.safetensors` |
| data | the specdec corpus (`tools/corpus/build_corpus.py`, manifest in `models/corpus-manifest.tsv.xz`): Python from CPython's standard library and Debian's Python packages (weighted ×2), C headers, Perl modules and package documentation of a stock Debian 12 machine; {s['train_tokens']:,} training tokens after weighting, {s['heldout_tokens']:,} held-out tokens (1 % of files by path hash) |
| training | {s['steps']} steps × {s['batch']} sequences × {s['seq']} tokens = {s['tokens_seen']:,} tokens seen; AdamW (β 0.9/0.95, wd 0.1), peak lr from the command, warm-up then cosine to 10 %; bf16 autocast |
| wall time | {s['train_seconds']:.0f} s of training ({s['total_seconds']:.0f} s with tokenizing and saving) on one {s['gpu']}, PyTorch {s['torch']} |
| final train loss | {s['final_train_loss']:.4f} (mean of the last logged steps) |
| held-out loss | {s['heldout_loss']:.4f} nats/token |

## Command

```
{s['command']}
```

run by `tools/run_all.sh` on the GPU host. `training_stats.json` holds the loss log.
"""
    (out / "MODEL_CARD.md").write_text(card)


if __name__ == "__main__":
    main()

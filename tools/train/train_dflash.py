#!/usr/bin/env python3
"""Trains a DFlash block drafter for the bundled target, calibrates its DSpark confidence head and
exports both in the DFlash format (docs/formats.md) to --out, with MODEL_CARD.md and
training_stats.json.

Data: windows of the corpus (tools/corpus/build_corpus.py output, tokenized with the target's
tokenizer) and the target's own continuations of corpus prompts (self-distillation: half greedy,
half sampled at T = 0.8), so the drafter learns the text the target actually emits. Every label
is the target's distribution at that position (soft cross-entropy), the drafter reads the
target's hidden states after the declared layers, and the LM head and embedding are the target's
(frozen, never exported).

Each training sequence carries several blocks at random anchors; one dense attention mask lets
every block see the context before its anchor and, both ways, its own rows, exactly what the
inference forward computes for one block.

--smoke runs a few steps at toy scale on the CPU with random tokens (no tokenizer needed).
"""
import argparse
import contextlib
import json
import lzma
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_torch import Drafter, Target, export, make_config, st_load, tap_layers, target_features  # noqa: E402
import calibrate_dflash  # noqa: E402

# Sizes: the whole exported folder must stay under 4.5 MiB (no embedding, no LM head: both are
# the target's). fc (3 taps x 512 -> 512) is 0.79 M parameters; two layers with 4 query heads,
# 2 KV heads and a 224-wide MLP are 0.74 M each: 2.26 M parameters, 4.5 MB in bf16.
SHAPE = dict(layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=224)
TAPS = [1, 4, 6]  # spread over the 8 target layers, the last one left out (see the format doc)
BLOCK = 8
MASK_ID = 3  # <|pad|>: reserved by the tokenizer, never in the corpus, so never a real input


def load_tokens(corpus, tokenizer_path, cap_docs):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_path))
    eot = tok.token_to_id("<|endoftext|>")
    docs = []
    with lzma.open(corpus, "rt", encoding="utf-8") as f:
        for line in f:
            docs.append(json.loads(line)["text"])
            if len(docs) >= cap_docs:
                break
    ids = []
    for enc in tok.encode_batch(docs):
        ids.append(eot)
        ids.extend(enc.ids)
    return np.asarray(ids, dtype=np.int64)


@torch.no_grad()
def self_distil(target, stream, device, *, batches, batch, prompt_len, new_tokens, seed):
    """The target's continuations of random corpus windows, half greedy and half sampled."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for b in range(batches):
        starts = torch.randint(0, len(stream) - prompt_len - 1, (batch,), generator=g)
        seq = torch.stack([torch.from_numpy(stream[s:s + prompt_len]) for s in starts.tolist()]).to(device)
        temp = 0.0 if b % 2 == 0 else 0.8
        for _ in range(new_tokens):
            logits, _ = target.forward(seq, (), last_only=True)
            last = logits[:, -1]
            nxt = last.argmax(-1) if temp == 0 else torch.multinomial(torch.softmax(last / temp, -1), 1)[:, 0]
            seq = torch.cat([seq, nxt[:, None]], 1)
        out.append(seq.cpu())
    return torch.cat(out)


def block_batch(seqs, gamma, blocks, mask_id, gen):
    """Anchors and the dense mask for `blocks` blocks per sequence. Returns anchors [B, nb],
    block ids [B, nb*γ], block positions [B, nb*γ], mask [B, nb*γ, S + nb*γ]."""
    B, S = seqs.shape
    dev = seqs.device
    anchors = torch.randint(1, S - gamma + 1, (B, blocks), generator=gen, device="cpu").to(dev)
    k = torch.arange(gamma, device=dev)
    pos = (anchors[..., None] + k).reshape(B, blocks * gamma)
    ids = torch.full((B, blocks, gamma), mask_id, dtype=torch.long, device=dev)
    ids[..., 0] = torch.gather(seqs, 1, anchors)
    ids = ids.reshape(B, blocks * gamma)
    ctx_visible = torch.arange(S, device=dev)[None, None, :] < anchors.repeat_interleave(gamma, 1)[..., None]
    blk = torch.arange(blocks, device=dev).repeat_interleave(gamma)
    own = (blk[:, None] == blk[None, :])[None].expand(B, -1, -1)
    mask = torch.cat([ctx_visible, own], -1)
    return anchors, ids, pos, mask


def drafter_forward(drafter, feats, seqs, embed, gamma, blocks, mask_id, gen):
    """Final hidden of every block row [B, nb, γ, H] and the anchors [B, nb]."""
    B, S = seqs.shape
    anchors, ids, pos, mask = block_batch(seqs, gamma, blocks, mask_id, gen)
    ctx = drafter.project(feats)
    x = F.embedding(ids, embed).float()
    hidden = drafter.layers(x, ctx, pos, torch.arange(S, device=seqs.device)[None].expand(B, S), mask)
    return hidden.view(B, blocks, gamma, -1), anchors


def label_rows(logits, anchors, gamma):
    """The target's logits that block row k (1..γ-1) must match: those at position anchor + k - 1."""
    B, nb = anchors.shape
    idx = (anchors[..., None] + torch.arange(gamma - 1, device=anchors.device)).reshape(B, -1)
    return torch.gather(logits, 1, idx[..., None].expand(-1, -1, logits.shape[-1])).view(B, nb, gamma - 1, -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="models/target")
    ap.add_argument("--corpus", help="corpus.jsonl.xz (tools/corpus/build_corpus.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=150, help="training time budget (after data)")
    ap.add_argument("--distil-seconds", type=float, default=35)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--seq", type=int, default=320)
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="toy scale on the CPU, random tokens")
    ap.add_argument("--save-heldout", help="also save the held-out sequences (for calibrate_dflash.py --data)")
    ap.add_argument("--init", help="an exported drafter (folder) of the same shape to start from; its "
                    "confidence head is trained on and the calibration refitted")
    args = ap.parse_args()
    started = time.time()
    torch.manual_seed(args.seed)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    target = Target(args.target, device, dtype=torch.float32 if args.smoke else torch.bfloat16)
    tc = target.cfg
    L, V = tc["num_hidden_layers"], tc["vocab_size"]
    theta = tc.get("rope_parameters", {}).get("rope_theta", 10000.0)
    cfg = make_config(hidden=tc["hidden_size"], target_hidden=tc["hidden_size"], **{
        "layers": SHAPE["layers"], "heads": SHAPE["heads"], "kv_heads": SHAPE["kv_heads"],
        "head_dim": SHAPE["head_dim"], "intermediate": SHAPE["intermediate"]},
        taps=TAPS, num_target_layers=L, block=BLOCK, mask_id=MASK_ID, vocab=V, theta=theta,
        eps=tc["rms_norm_eps"], max_pos=tc["max_position_embeddings"])
    taps = tap_layers(TAPS, L)

    # ---- data ----
    if args.smoke:
        stream = np.random.default_rng(0).integers(4, V, 20000)
        args.batch, args.seq, args.blocks = 4, 48, 4
        distil = self_distil(target, stream, device, batches=2, batch=4, prompt_len=40, new_tokens=8, seed=1)
    else:
        stream = load_tokens(args.corpus, Path(args.target) / "tokenizer.json", cap_docs=1_000_000)
        print(f"corpus tokens: {len(stream)}", flush=True)
        t0, chunks, b = time.time(), [], 0
        while time.time() - t0 < args.distil_seconds:
            chunks.append(self_distil(target, stream, device, batches=2, batch=256, prompt_len=64,
                                      new_tokens=args.seq - 64, seed=100 + b))
            b += 1
        distil = torch.cat(chunks)
        print(f"self-distilled sequences: {len(distil)} in {time.time() - t0:.0f}s", flush=True)
    held = max(2, len(distil) // 10)
    distil_train, distil_held = distil[held:], distil[:held]
    data = torch.from_numpy(stream)
    if args.save_heldout:
        torch.save(distil_held.clone(), args.save_heldout)

    drafter = Drafter(cfg).to(device)
    if args.init:
        # Read before --out is written (the two may be one folder). Every tensor must be there
        # with this shape: a drafter of another shape is no starting point.
        start = st_load(f"{args.init}/model.safetensors")
        with torch.no_grad():
            for name, p in drafter.state().items():
                if name not in start or tuple(start[name].shape) != tuple(p.shape):
                    sys.exit(f"--init {args.init}: tensor {name} missing or not shaped {tuple(p.shape)}")
                p.copy_(start[name].to(p.dtype))
        print(f"started from {args.init}", flush=True)
    nparams = sum(p.numel() for p in drafter.state().values())
    print(f"drafter parameters: {nparams}", flush=True)
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    embed, head = target.embed, target.lm_head
    weights = torch.tensor([math.exp(-k / 4.0) for k in range(BLOCK - 1)], device=device)
    weights = weights / weights.sum()
    steps_budget = 3 if args.smoke else None
    log, step, t_train = [], 0, time.time()
    est_steps = 10_000

    def batch_seqs():
        half = args.batch // 2
        i = torch.randint(0, len(distil_train), (half,), generator=gen)
        d = distil_train[i][:, :args.seq]
        s = torch.randint(0, len(data) - args.seq, (args.batch - half,), generator=gen)
        c = torch.stack([data[j:j + args.seq] for j in s.tolist()])
        return torch.cat([d, c]).to(device)

    while True:
        elapsed = time.time() - t_train
        if steps_budget is not None and step >= steps_budget:
            break
        if steps_budget is None and elapsed > args.seconds:
            break
        progress = step / steps_budget if steps_budget else min(1.0, elapsed / args.seconds)
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for gparam in opt.param_groups:
            gparam["lr"] = lr
        seqs = batch_seqs()
        logits, hidden = target.forward(seqs, taps)
        feats = target_features(hidden, TAPS, L)
        with (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()):
            h, anchors = drafter_forward(drafter, feats, seqs, embed, BLOCK, args.blocks, MASK_ID, gen)
            rows = h[:, :, 1:]  # the mask rows
            dl = (rows.to(head.dtype) @ head.T).float()
        tl = label_rows(logits, anchors, BLOCK)
        tp = torch.softmax(tl, -1)
        ce = -(tp * torch.log_softmax(dl, -1)).sum(-1)  # [B, nb, γ-1]
        loss_draft = (ce * weights).sum(-1).mean()
        match = (dl.argmax(-1) == tl.argmax(-1)).float()
        conf = drafter.confidence(rows.float())
        loss_conf = F.binary_cross_entropy_with_logits(conf, match)
        loss = loss_draft + 0.1 * loss_conf
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or (steps_budget and step == steps_budget - 1):
            acc = match.mean(dim=(0, 1)).tolist()
            entry = {"step": step, "seconds": round(time.time() - t_train, 1), "lr": lr, "loss": loss_draft.item(),
                     "conf_loss": loss_conf.item(), "top1_match_per_position": [round(a, 4) for a in acc]}
            log.append(entry)
            print(json.dumps(entry), flush=True)
        step += 1
    train_seconds = time.time() - t_train

    # ---- calibration on held-out self-distilled sequences (weights rounded as exported) ----
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    dspark, calib = calibrate_dflash.calibrate(drafter, target, distil_held.to(device), TAPS, BLOCK, MASK_ID,
                                                blocks=8 if args.smoke else 32, seed=args.seed + 7)
    print(json.dumps({"calibration": calib}), flush=True)
    export(drafter, cfg, out, dspark=dspark)
    stats = {"parameters": nparams, "steps": step, "train_seconds": round(train_seconds, 1),
             "wall_seconds": round(time.time() - started, 1), "self_distilled_sequences": int(len(distil)),
             "corpus_tokens": int(len(stream)), "batch": args.batch, "seq": args.seq, "blocks_per_seq": args.blocks,
             "lr": args.lr, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "torch": torch.__version__, "log": log, "calibration": calib, "command": " ".join(sys.argv)}
    (out / "training_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"exported {out}: {size} bytes", flush=True)


if __name__ == "__main__":
    main()

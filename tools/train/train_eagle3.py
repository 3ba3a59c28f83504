#!/usr/bin/env python3
"""Trains an EAGLE-3 head for the bundled target and exports it in the published layout.

Data: a slice of the specdec corpus (Python files, JSONL.xz as tools/corpus/build_corpus.py
writes it) plus continuations the target itself generates from corpus prompts (greedy and
T = 0.8: self-distillation, the text the head sees at inference). The loss is EAGLE-3's
training-time test: `--ttt-steps` steps unrolled on the head's own output hiddens, each scored
by cross-entropy against the target's next-token distribution restricted to the draft
vocabulary (positions whose target argmax lies outside it are left out).

Usage (GPU host): python3 tools/train/train_eagle3.py --target models/target \
    --corpus python-slice.jsonl.xz --out models/eagle3 --time-budget 140
A CPU smoke test: --device cpu --smoke (tiny sizes, a few steps).
--init DIR starts from an exported head instead of from scratch (its layer, fc and norms; its LM
head rows for the tokens that stay in the draft vocabulary, the target's rows for the new ones),
e.g. to widen the draft vocabulary without losing the training it already had.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import is_heldout, read_corpus  # noqa: E402
from eagle3_torch import (Eagle3Head, default_tap_hidden_states, export_config, load_safetensors,  # noqa: E402
                          rope_cos_sin, rotate, save_safetensors)

MIB = 1024 * 1024


def init_from(head, folder, draft_ids):
    """Copies an exported head's tensors into `head` (shapes must match), and its LM head rows for
    the target ids both draft vocabularies hold. Returns how many LM head rows it carried over."""
    init = load_safetensors(os.path.join(folder, "model.safetensors"))
    old_ids = (torch.arange(init["d2t"].numel()) + init["d2t"]).tolist()  # target id of each old row
    row_of = {t: i for i, t in enumerate(old_ids)}
    kept = 0
    with torch.no_grad():
        for name, p in head.export_params().items():
            assert name in init, f"--init {folder}: no tensor {name}"
            src = init[name].float()
            if name == "lm_head.weight":
                for j, t in enumerate(draft_ids.tolist()):
                    if t in row_of:
                        p[j].copy_(src[row_of[t]])
                        kept += 1
                continue
            assert tuple(src.shape) == tuple(p.shape), f"--init {folder}: {name} is {tuple(src.shape)}, " \
                                                         f"this head's is {tuple(p.shape)}"
            p.copy_(src)
    return kept


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]  # older PyTorch (the CPU smoke test)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


# ---- the target: a minimal Llama forward over the bundled checkpoint -------------------------
class Target:
    """The bundled target (Llama, tied embeddings) read from its safetensors: logits and the
    hidden states transformers would report (index 0 = embeddings, i = output of layer i-1)."""

    def __init__(self, folder, device, dtype):
        self.cfg = json.load(open(os.path.join(folder, "config.json")))
        w = load_safetensors(os.path.join(folder, "model.safetensors"))
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in w.items()}
        c = self.cfg
        self.L, self.H = c["num_hidden_layers"], c["hidden_size"]
        self.nh, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim", self.H // self.nh)
        self.eps = c["rms_norm_eps"]
        rp = c.get("rope_parameters") or {}
        self.theta = rp.get("rope_theta", c.get("rope_theta", 10000.0))
        self.embed = self.w["model.embed_tokens.weight"]
        self.lm_head = self.w.get("lm_head.weight", self.embed)
        self.device, self.dtype = device, dtype

    def norm(self, x, weight):
        x32 = x.float()
        return (weight.float() * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)

    @torch.no_grad()
    def forward(self, ids, want_hidden=(), last_only=False):
        """ids [B, T] -> (logits [B, T, V] f32 (last_only: [B, 1, V]), {index: hidden [B, T, H]})."""
        B, T = ids.shape
        x = self.embed[ids]
        hidden = {0: x} if 0 in want_hidden else {}
        cos, sin = rope_cos_sin(torch.arange(T, device=ids.device), self.hd, self.theta, x.dtype)
        rep = self.nh // self.nkv
        for i in range(self.L):
            p = f"model.layers.{i}."
            h = self.norm(x, self.w[p + "input_layernorm.weight"])
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).view(B, T, self.nh, self.hd).transpose(1, 2)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).view(B, T, self.nkv, self.hd).transpose(1, 2)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).view(B, T, self.nkv, self.hd).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = causal_attention(q, k, v)
            x = x + a.transpose(1, 2).reshape(B, T, -1) @ self.w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"])
            g = F.silu(h @ self.w[p + "mlp.gate_proj.weight"].T) * (h @ self.w[p + "mlp.up_proj.weight"].T)
            x = x + g @ self.w[p + "mlp.down_proj.weight"].T
            if i + 1 in want_hidden:
                hidden[i + 1] = x
        if last_only:
            x = x[:, -1:]
        logits = (self.norm(x, self.w["model.norm.weight"]) @ self.lm_head.T).float()
        return logits, hidden

    @torch.no_grad()
    def generate(self, prompts, new_tokens, temperature, generator):
        """Continues each prompt row (all the same length) by new_tokens tokens, recomputing the
        whole prefix each step (the model is small; no cache to get wrong)."""
        ids = prompts
        for _ in range(new_tokens):
            logits, _ = self.forward(ids, last_only=True)
            last = logits[:, -1]
            if temperature == 0:
                nxt = last.argmax(-1, keepdim=True)
            else:
                probs = (last / temperature).softmax(-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            ids = torch.cat([ids, nxt], dim=1)
        return ids


# ---- data ------------------------------------------------------------------------------------
def tokenizer_for(folder):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("tokenizers missing: byte ids stand in for tokens (smoke test only)")
        return lambda text: [b % 8000 + 4 for b in text.encode()]
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def load_corpus(path, encode, eos, limit_docs):
    train, held = [], []
    for n, doc in enumerate(read_corpus(path)):
        if limit_docs and n >= limit_docs:
            break
        ids = encode(doc["text"]) + [eos]
        (held if is_heldout(doc) else train).append(ids)
    return train, held


def windows(docs, length, rng, count):
    """`count` random windows of `length` tokens from the concatenated documents."""
    flat = [t for d in docs for t in d]
    out = []
    for _ in range(count):
        s = rng.randrange(0, max(1, len(flat) - length - 1))
        out.append(flat[s : s + length])
    return torch.tensor(out, dtype=torch.long)


# ---- training --------------------------------------------------------------------------------
def ttt_losses(head, target, ids, draft_ids, in_draft, taps, steps):
    """Loss and per-step top-1 agreement of the training-time test over a batch of ids [B, T]."""
    B, T = ids.shape
    logits, hidden = target.forward(ids, want_hidden=set(taps))
    fused = torch.cat([hidden[i] for i in taps], dim=-1).float()
    tgt_draft = logits[..., draft_ids]  # [B, T, Vd]
    p = tgt_draft.softmax(-1)
    top = logits.argmax(-1)
    keep = in_draft[top]  # target argmax inside the draft vocabulary
    tgt_top = tgt_draft.argmax(-1)
    embed = target.embed

    def embeds(k):
        shifted = torch.zeros_like(ids)
        shifted[:, : T - 1 - k] = ids[:, 1 + k :]
        return embed[shifted].float()

    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=ids.device.type == "cuda"):
        outs = head.forward_ttt(embeds, fused, steps)
    losses, accs = [], []
    for k, prenorm in enumerate(outs):
        n = T - 1 - k  # anchors i with a target at position i + 1 + k
        with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=ids.device.type == "cuda"):
            lg = head.logits(prenorm[:, :n])
        lg = lg.float()
        pk, mk = p[:, 1 + k :], keep[:, 1 + k :].float()
        ce = -(pk * lg.log_softmax(-1)).sum(-1)
        denom = mk.sum().clamp(min=1)
        losses.append((ce * mk).sum() / denom)
        accs.append(((lg.argmax(-1) == tgt_top[:, 1 + k :]).float() * mk).sum() / denom)
    return losses, accs


@torch.no_grad()
def accepted_length(head, target, seqs, draft_ids, taps, depth):
    """Greedy chain acceptance on target-greedy text: at every anchor, the drafts the head would
    chain (teacher forcing equals the real chain while it matches) accepted up to the first
    miss, plus the target's own token. The mean over anchors estimates tokens per round."""
    total, count = 0.0, 0
    for b in range(0, seqs.shape[0], 16):
        ids = seqs[b : b + 16]
        B, T = ids.shape
        logits, hidden = target.forward(ids, want_hidden=set(taps))
        fused = torch.cat([hidden[i] for i in taps], dim=-1).float()
        greedy = logits.argmax(-1)  # target token after each position

        def embeds(k):
            shifted = torch.zeros_like(ids)
            shifted[:, : T - 1 - k] = ids[:, 1 + k :]
            return target.embed[shifted].float()

        outs = head.forward_ttt(embeds, fused, depth)
        n = T - 1 - depth
        alive = torch.ones(B, n, dtype=torch.bool, device=ids.device)
        acc = torch.zeros(B, n, device=ids.device)
        for k, prenorm in enumerate(outs):
            d = draft_ids[head.logits(prenorm[:, :n]).float().argmax(-1)]
            alive &= d == greedy[:, 1 + k : 1 + k + n]
            acc += alive.float()
        total += float(acc.sum()) + B * n
        count += B * n
    return total / max(count, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="models/target")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--time-budget", type=float, default=140.0, help="seconds of training steps")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--total-budget", type=float, default=0,
                    help="seconds for the whole run: training stops early to leave 25 s for evaluation and export")
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--ttt-steps", type=int, default=6)
    ap.add_argument("--draft-vocab", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=192)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--gen-rows", type=int, default=512, help="self-distilled sequences (half greedy)")
    ap.add_argument("--gen-prompt", type=int, default=48)
    ap.add_argument("--gen-chunk", type=int, default=512, help="self-distilled sequences generated at once")
    ap.add_argument("--taps", default="",
                    help="target layer ids whose outputs fc reads (comma-separated, e.g. 1,4,6), written to "
                         "config.json as eagle_aux_hidden_state_layer_ids; default: none written, the loaders' default")
    ap.add_argument("--init", default="", help="an exported head (folder) to start from (see the docstring)")
    ap.add_argument("--size-cap-mib", type=float, default=5.5,
                    help="the exported folder's size limit with its model card, MiB")
    ap.add_argument("--smoke", action="store_true", help="tiny run for a CPU check")
    args = ap.parse_args()
    if args.smoke:
        args.batch, args.seq, args.gen_rows, args.max_steps, args.time_budget = 2, 48, 4, 3, 60
        args.gen_prompt = 8
    t_start = time.time()
    torch.manual_seed(0)
    rng = random.Random(0)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    target = Target(args.target, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    tc = target.cfg
    V, L = tc["vocab_size"], target.L
    # Hidden-state indices (0 = embeddings, i = output of layer i - 1); explicit ids name the output
    # of layer id (the EAGLE trainers' meaning, docs/formats.md), so index id + 1.
    tap_ids = [int(t) for t in args.taps.split(",")] if args.taps else []
    if args.init:
        with open(os.path.join(args.init, "config.json")) as f:
            init_taps = json.load(f).get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids", [])
        # fc was trained on these layers' outputs: a head started from it keeps them.
        assert not tap_ids or tap_ids == init_taps, f"--taps {tap_ids} differ from --init's {init_taps}"
        tap_ids = list(init_taps)
    if tap_ids:
        assert len(tap_ids) == 3 and all(0 <= t < L - 1 for t in tap_ids), f"--taps needs three ids in [0, {L - 2}]"
    taps = [t + 1 for t in tap_ids] if tap_ids else default_tap_hidden_states(L)
    eos = tc.get("eos_token_id", 0)
    encode = tokenizer_for(args.target)
    train_docs, held_docs = load_corpus(args.corpus, encode, eos, 60 if args.smoke else 0)
    if not held_docs:
        held_docs = train_docs[-2:]
    n_train_tokens = sum(len(d) for d in train_docs)
    print(f"corpus: {len(train_docs)} train docs ({n_train_tokens} tokens), {len(held_docs)} held-out docs", flush=True)

    # Self-distillation: the target continues corpus prompts, half greedy, half at T = 0.8.
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    new = args.seq - args.gen_prompt
    generated = []
    t0 = time.time()
    for temp in (0.0, 0.8):
        rows = args.gen_rows // 2
        for b in range(0, rows, args.gen_chunk):
            prompts = windows(train_docs, args.gen_prompt, rng, min(args.gen_chunk, rows - b)).to(dev)
            generated.append(target.generate(prompts, new, temp, gen).cpu())
    generated = torch.cat(generated)
    held_prompts = windows(held_docs, args.gen_prompt, rng, 8 if args.smoke else 64).to(dev)
    held_greedy = target.generate(held_prompts, new, 0.0, gen)
    gen_seconds = time.time() - t0
    print(f"self-distillation: {generated.shape[0]} + {held_greedy.shape[0]} held-out sequences in {gen_seconds:.1f}s",
          flush=True)

    # The draft vocabulary: the most frequent tokens of the training text (corpus and generated).
    counts = torch.zeros(V, dtype=torch.long)
    for d in train_docs:
        counts += torch.bincount(torch.tensor(d), minlength=V)[:V]
    counts += 2 * torch.bincount(generated.reshape(-1), minlength=V)[:V]
    draft_ids = torch.sort(torch.topk(counts, args.draft_vocab).indices).values
    coverage_corpus = float(counts[draft_ids].sum()) / float(counts.sum())
    in_draft = torch.zeros(V, dtype=torch.bool)
    in_draft[draft_ids] = True
    draft_ids_dev, in_draft_dev = draft_ids.to(dev), in_draft.to(dev)

    cfg = dict(hidden_size=target.H, intermediate_size=args.intermediate, num_attention_heads=args.heads,
               num_key_value_heads=args.kv_heads, head_dim=target.hd, vocab_size=V, draft_vocab_size=args.draft_vocab,
               target_hidden_size=target.H, rms_norm_eps=tc["rms_norm_eps"], rope_theta=target.theta,
               max_position_embeddings=tc["max_position_embeddings"], torch_dtype="bfloat16")
    head = Eagle3Head(cfg).to(dev)
    with torch.no_grad():
        head.d2t.copy_((draft_ids - torch.arange(args.draft_vocab)).to(dev))
        head.t2d.copy_(in_draft_dev)
        # Start the LM head from the target's rows of the draft vocabulary (tied embeddings).
        head.lm_head.weight.copy_(target.lm_head[draft_ids_dev].float())
    if args.init:
        kept = init_from(head, args.init, draft_ids)
        print(f"started from {args.init}: {kept} of {args.draft_vocab} LM head rows carried over", flush=True)
    params = [p for p in head.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    print(f"head: {n_params} parameters; draft vocabulary {args.draft_vocab} covers {coverage_corpus:.3f} of the "
          f"training tokens", flush=True)

    log, step, t_train = [], 0, time.time()
    warmup = 50
    half = args.batch // 2
    while step < args.max_steps:
        elapsed = time.time() - t_train
        if elapsed > args.time_budget or (args.total_budget and time.time() - t_start > args.total_budget - 25):
            break
        frac = min(1.0, elapsed / args.time_budget)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        corpus_rows = windows(train_docs, args.seq, rng, args.batch - half)
        gen_rows = generated[torch.randint(0, generated.shape[0], (half,))]
        ids = torch.cat([corpus_rows, gen_rows]).to(dev)
        losses, accs = ttt_losses(head, target, ids, draft_ids_dev, in_draft_dev, taps, args.ttt_steps)
        loss = sum(losses) / len(losses)
        losses = [x.detach() for x in losses]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0:
            entry = {"step": step, "seconds": round(time.time() - t_train, 1), "lr": lr, "loss": float(loss),
                     "step_losses": [round(float(x), 4) for x in losses],
                     "step_top1": [round(float(x), 4) for x in accs]}
            log.append(entry)
            print(json.dumps(entry), flush=True)
        step += 1
    train_seconds = time.time() - t_train

    head.eval()
    with torch.no_grad():
        held_ids = windows(held_docs, args.seq, rng, 4 if args.smoke else 32).to(dev)
        h_losses, h_accs = ttt_losses(head, target, held_ids, draft_ids_dev, in_draft_dev, taps, args.ttt_steps)
    tau = accepted_length(head, target, held_greedy, draft_ids_dev, taps, args.ttt_steps)
    held = {"heldout_step_losses": [round(float(x), 4) for x in h_losses],
            "heldout_step_top1": [round(float(x), 4) for x in h_accs],
            "heldout_greedy_accepted_length": round(tau, 3)}
    print(json.dumps(held), flush=True)

    os.makedirs(args.out, exist_ok=True)
    state = head.state_for_export(torch.bfloat16)
    save_safetensors(state, os.path.join(args.out, "model.safetensors"))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        extra = {"eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": tap_ids}}
        json.dump(export_config(cfg, L, extra if tap_ids else None), f, indent=2)
        f.write("\n")
    stats = {
        "target": args.target, "corpus": os.path.basename(args.corpus), "train_docs": len(train_docs),
        "train_corpus_tokens": n_train_tokens, "heldout_docs": len(held_docs),
        "self_distilled_sequences": int(generated.shape[0]), "sequence_length": args.seq,
        "generation_seconds": round(gen_seconds, 1), "steps": step, "batch": args.batch,
        "tokens_seen": step * args.batch * args.seq, "ttt_steps": args.ttt_steps,
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "parameters": n_params, "draft_vocab": args.draft_vocab, "draft_vocab_coverage": round(coverage_corpus, 4),
        "tap_hidden_states": taps, "init": args.init or None, "final_loss": log[-1]["loss"] if log else None, **held,
        "torch": torch.__version__, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "log": log,
    }
    with open(os.path.join(args.out, "training_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    print(f"exported {args.out}: {size} bytes", flush=True)
    cap = int(args.size_cap_mib * MIB)
    if not args.smoke:
        assert size + 8192 <= cap, f"{args.out} is {size} bytes, over the {cap} cap with the card"


if __name__ == "__main__":
    main()

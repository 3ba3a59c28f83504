"""The DFlash block drafter and the bundled Llama target in plain PyTorch, for training, calibration
and the reference fixture. Self-contained (no transformers, no safetensors package) so the same
code runs on the GPU host and, at toy scale, on a CPU-only machine.

Drafter layout (docs/formats.md): fc [H, n_taps * H_target], hidden_norm, layers.{i}.* (a
Qwen3 decoder layer whose keys and values also cover the projected target context), norm. Target
features for a position are the concatenated hidden states after the declared layers; the block
is [anchor, mask, ..., mask] at positions a .. a+γ-1, attending to the context before a and,
both ways, to itself.
"""
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

# ---- safetensors without the package (the format: u64 header length, JSON header, raw data) ----
_DT = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2), "I32": (torch.int32, 4)}
_NAME = {v[0]: k for k, v in _DT.items()}


def st_load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = _DT[info["dtype"]]
        b, e = info["data_offsets"]
        raw = bytearray(data[base + b:base + e])
        t = torch.frombuffer(raw, dtype=dtype) if e > b else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def st_save(tensors, path, metadata=None):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": _NAME[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---- shared pieces ----
def rms_norm(x, w, eps):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def rope(x, pos, theta, head_dim):
    """x [..., T, heads, hd] rotated in Hugging Face's rotate_half layout at positions pos [..., T]."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim))
    ang = pos.float()[..., None] * inv  # [..., T, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[..., None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[..., None, :]
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def attend(q, k, v, mask):
    """q [B, Tq, nh, hd], k/v [B, Tk, nkv, hd], mask [B or 1, Tq, Tk] bool (True = visible)."""
    nh, nkv, hd = q.shape[2], k.shape[2], q.shape[3]
    k = k.repeat_interleave(nh // nkv, dim=2)
    v = v.repeat_interleave(nh // nkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    s = s.masked_fill(~mask[:, None], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v)


class Target:
    """The bundled Llama target (frozen), read from its safetensors; forward gives logits and taps."""

    def __init__(self, folder, device, dtype=torch.bfloat16):
        self.cfg = json.load(open(f"{folder}/config.json"))
        w = st_load(f"{folder}/model.safetensors")
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in w.items()}
        c = self.cfg
        self.L, self.H = c["num_hidden_layers"], c["hidden_size"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c.get("head_dim", self.H // c["num_attention_heads"])
        self.eps = c["rms_norm_eps"]
        self.theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 10000.0))
        self.embed = self.w["model.embed_tokens.weight"]
        self.lm_head = self.w.get("lm_head.weight", self.embed)

    @torch.no_grad()
    def forward(self, ids, taps, last_only=False):
        """ids [B, T] → (logits [B, T, V] f32 (of the last position only: [B, 1, V]),
        {layer: hidden after that layer [B, T, H] f32})."""
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)[None].expand(B, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()[None]
        x = F.embedding(ids, self.embed).float()
        got = {}
        dt = self.embed.dtype
        for i in range(self.L):
            p = f"model.layers.{i}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps).to(dt)
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).view(B, T, self.nh, self.hd).float()
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).view(B, T, self.nkv, self.hd).float()
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).view(B, T, self.nkv, self.hd).float()
            q, k = rope(q, pos, self.theta, self.hd), rope(k, pos, self.theta, self.hd)
            if q.is_cuda:
                a = F.scaled_dot_product_attention(q.transpose(1, 2).to(dt), k.transpose(1, 2).to(dt),
                                                   v.transpose(1, 2).to(dt), is_causal=True,
                                                   enable_gqa=True).transpose(1, 2)
            else:
                a = attend(q, k, v, mask)
            x = x + (a.reshape(B, T, -1).to(dt) @ self.w[p + "self_attn.o_proj.weight"].T).float()
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps).to(dt)
            g = F.silu(h @ self.w[p + "mlp.gate_proj.weight"].T) * (h @ self.w[p + "mlp.up_proj.weight"].T)
            x = x + (g @ self.w[p + "mlp.down_proj.weight"].T).float()
            if i in taps:
                got[i] = x
        x = rms_norm(x, self.w["model.norm.weight"], self.eps).to(dt)
        if self.L in taps:
            got[self.L] = x.float()
        if last_only:
            x = x[:, -1:]
        return (x @ self.lm_head.T).float(), got


def drafter_names(cfg):
    names = {"fc.weight": [cfg["hidden_size"], len(cfg["dflash_config"]["target_layer_ids"]) * cfg["target_hidden_size"]],
             "hidden_norm.weight": [cfg["hidden_size"]], "norm.weight": [cfg["hidden_size"]]}
    H, nh, nkv, hd, I = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                         cfg["intermediate_size"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        names.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                      p + "self_attn.q_proj.weight": [nh * hd, H], p + "self_attn.k_proj.weight": [nkv * hd, H],
                      p + "self_attn.v_proj.weight": [nkv * hd, H], p + "self_attn.o_proj.weight": [H, nh * hd],
                      p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                      p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                      p + "mlp.down_proj.weight": [H, I]})
    return names


class Drafter(torch.nn.Module):
    """DFlash drafter parameters (named as the format names them) plus the DSpark confidence head."""

    def __init__(self, cfg, init_std=0.02):
        super().__init__()
        self.cfg = cfg
        self.params = torch.nn.ParameterDict()
        for name, shape in drafter_names(cfg).items():
            t = torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape) * init_std
            self.params[name.replace(".", "__")] = torch.nn.Parameter(t)
        H = cfg["hidden_size"]
        self.conf_w = torch.nn.Parameter(torch.zeros(H))
        self.conf_b = torch.nn.Parameter(torch.zeros(()))
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg["rope_theta"]

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def state(self):
        return {k.replace("__", "."): v for k, v in self.params.items()}

    def project(self, feats):
        """Target features [.., n_taps * Ht] → the drafter's context rows [.., H]."""
        return rms_norm(feats @ self.p("fc.weight").T, self.p("hidden_norm.weight"), self.eps)

    def layers(self, x, ctx, q_pos, k_pos_ctx, mask):
        """x [B, Tq, H] block rows at q_pos [B, Tq]; ctx [B, Tc, H] at k_pos_ctx [B, Tc]; mask
        [B, Tq, Tc + Tq] (context keys first, then the block's own). Returns the final normed rows."""
        c = self.cfg
        B, Tq, _ = x.shape
        Tc = ctx.shape[1]
        nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        for i in range(c["num_hidden_layers"]):
            p = f"layers.{i}."
            h = rms_norm(x, self.p(p + "input_layernorm.weight"), self.eps)
            q = (h @ self.p(p + "self_attn.q_proj.weight").T).view(B, Tq, nh, hd)
            q = rope(rms_norm(q, self.p(p + "self_attn.q_norm.weight"), self.eps), q_pos, self.theta, hd)
            kin = torch.cat([ctx, h], 1)
            k = (kin @ self.p(p + "self_attn.k_proj.weight").T).view(B, Tc + Tq, nkv, hd)
            k = rope(rms_norm(k, self.p(p + "self_attn.k_norm.weight"), self.eps), torch.cat([k_pos_ctx, q_pos], 1),
                     self.theta, hd)
            v = (kin @ self.p(p + "self_attn.v_proj.weight").T).view(B, Tc + Tq, nkv, hd)
            a = attend(q, k, v, mask)
            x = x + a.reshape(B, Tq, nh * hd) @ self.p(p + "self_attn.o_proj.weight").T
            h = rms_norm(x, self.p(p + "post_attention_layernorm.weight"), self.eps)
            x = x + (F.silu(h @ self.p(p + "mlp.gate_proj.weight").T) * (h @ self.p(p + "mlp.up_proj.weight").T)) \
                @ self.p(p + "mlp.down_proj.weight").T
        return rms_norm(x, self.p("norm.weight"), self.eps)

    def confidence(self, hidden):
        """The DSpark head's raw score (a logit) per block row."""
        return hidden.detach() @ self.conf_w + self.conf_b

    def block(self, feats, anchor_ids, embed, gamma, mask_id):
        """Inference form, one block per row: feats [B, Tc, n*Ht] (context = positions 0..Tc-1),
        anchor at position Tc. Returns the final hidden of the γ block rows [B, γ, H]."""
        B, Tc, _ = feats.shape
        dev = feats.device
        ids = torch.full((B, gamma), mask_id, dtype=torch.long, device=dev)
        ids[:, 0] = anchor_ids
        x = F.embedding(ids, embed).float()
        ctx = self.project(feats.float())
        q_pos = (Tc + torch.arange(gamma, device=dev))[None].expand(B, gamma)
        k_pos = torch.arange(Tc, device=dev)[None].expand(B, Tc)
        mask = torch.ones(B, gamma, Tc + gamma, dtype=torch.bool, device=dev)
        return self.layers(x, ctx, q_pos, k_pos, mask)


def export(drafter, cfg, folder, dtype=torch.bfloat16, dspark=None):
    """Writes config.json (with the dspark namespace when given) and model.safetensors."""
    out = dict(cfg)
    if dspark is not None:
        out["dspark"] = dspark
    with open(f"{folder}/config.json", "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    st_save({k: v.detach().to(dtype) for k, v in drafter.state().items()}, f"{folder}/model.safetensors",
            metadata={"format": "pt"})


def make_config(*, hidden, target_hidden, layers, heads, kv_heads, head_dim, intermediate, taps, num_target_layers,
                block, mask_id, vocab, theta, eps=1e-5, max_pos=2048):
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": block,
        "dflash_config": {"block_size": block, "mask_token_id": mask_id, "target_layer_ids": list(taps)},
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "target_hidden_size": target_hidden,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_pos,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "num_target_layers": num_target_layers,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        "dtype": "bfloat16",
    }


def target_features(hidden, taps, num_target_layers):
    """Concatenates the tapped hidden states in the declared order. An id of the target's last
    layer means its final normed hidden, as Hugging Face's hidden_states list has it."""
    return torch.cat([hidden[num_target_layers if t == num_target_layers - 1 else t] for t in taps], -1)


def tap_layers(taps, num_target_layers):
    return sorted({num_target_layers if t == num_target_layers - 1 else t for t in taps})


def fit_platt(features, labels, iters=50, l2=1e-3):
    """Logistic regression by Newton steps: P(label) = sigmoid(features · w + b)."""
    X = np.concatenate([features, np.ones((len(features), 1))], 1).astype(np.float64)
    y = labels.astype(np.float64)
    w = np.zeros(X.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-X @ w))
        g = X.T @ (p - y) + l2 * w
        Hm = (X * (p * (1 - p))[:, None]).T @ X + l2 * np.eye(X.shape[1])
        w -= np.linalg.solve(Hm, g)
    return w

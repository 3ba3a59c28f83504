"""An EAGLE-3 head in plain PyTorch, in the published checkpoint layout (docs/formats.md), shared
by the trainer (tools/train/train_eagle3.py) and the parity fixture (tools/fixtures/
make_eagle3_fixture.py); and a small safetensors reader/writer that also runs where the
`safetensors` package is missing (it has to write int64 d2t and bool t2d).

The forward follows the format: fc fuses three target taps into one hidden; the decoder layer
norms the token embedding (input_layernorm) and the hidden (hidden_norm), attends with q/k/v over
their concatenation [embedding; hidden], adds the attention output to the un-normed hidden,
then the usual post-attention norm and SwiGLU MLP; the result before the final norm is the next
chained step's hidden, after it (norm, lm_head) the logits over the draft vocabulary.
"""
import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.bool: "BOOL",
}
_FROM = {v: k for k, v in _DTYPES.items()}


def _raw_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy().tobytes()
    return t.numpy().tobytes()


def save_safetensors(tensors, path, metadata=None):
    """Writes {name: tensor} in the safetensors layout (names sorted, 8-byte aligned header)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        data = _raw_bytes(t)
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dtype = _FROM[e["dtype"]]
        raw = bytearray(data[b:end])
        if dtype in (torch.bfloat16, torch.float16):
            t = torch.frombuffer(raw, dtype=torch.int16).view(dtype)
        elif dtype == torch.bool:
            t = torch.frombuffer(raw, dtype=torch.uint8).to(torch.bool)
        else:
            t = torch.frombuffer(raw, dtype=dtype)
        out[name] = t.reshape(e["shape"]).clone()
    return out


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * y).to(x.dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    ang = positions.float()[..., None] * inv_freq
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x, cos, sin):
    """x [..., T, D] with cos/sin broadcastable [..., T, D] (rotate_half layout)."""
    d = x.shape[-1] // 2
    rot = torch.cat([-x[..., d:], x[..., :d]], dim=-1)
    return x * cos + rot * sin


class Eagle3Head(nn.Module):
    """cfg: dict with hidden_size, intermediate_size, num_attention_heads, num_key_value_heads,
    head_dim, vocab_size, draft_vocab_size, target_hidden_size, rms_norm_eps, rope_theta."""

    def __init__(self, cfg, own_embedding=False):
        super().__init__()
        self.cfg = cfg
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        eps = cfg["rms_norm_eps"]
        self.fc = nn.Linear(3 * cfg["target_hidden_size"], H, bias=False)
        self.hidden_norm = RMSNorm(H, eps)
        self.input_layernorm = RMSNorm(H, eps)
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, cfg["draft_vocab_size"], bias=False)
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], H) if own_embedding else None
        self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(cfg["vocab_size"], dtype=torch.bool))

    # --- the layer's pieces ---------------------------------------------------------------
    def qkv(self, embeds, hidden):
        """Normed [embedding; hidden] through q/k/v: [B, T, heads, hd] each."""
        c = self.cfg
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        B, T = x.shape[:2]
        q = self.q_proj(x).view(B, T, c["num_attention_heads"], c["head_dim"])
        k = self.k_proj(x).view(B, T, c["num_key_value_heads"], c["head_dim"])
        v = self.v_proj(x).view(B, T, c["num_key_value_heads"], c["head_dim"])
        return q, k, v

    def finish(self, attn_out, hidden):
        """Residual, post-attention norm, MLP: the layer output before the final norm."""
        x = hidden + self.o_proj(attn_out)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def logits(self, prenorm):
        return self.lm_head(self.norm(prenorm))

    # --- plain causal forward (inference semantics, one sequence batch) ----------------------
    def forward_causal(self, embeds, hidden, positions, past=None):
        """embeds, hidden [B, T, H]; positions [T]; past: (k, v) [B, P, kv, hd] of earlier positions
        (already rotated). Returns (prenorm [B, T, H], (k, v) including these positions)."""
        c = self.cfg
        q, k, v = self.qkv(embeds, hidden)
        cos, sin = rope_cos_sin(positions, c["head_dim"], c["rope_theta"], q.dtype)
        q = rotate(q.transpose(1, 2), cos, sin)
        k = rotate(k.transpose(1, 2), cos, sin).transpose(1, 2)
        if past is not None:
            k = torch.cat([past[0], k], dim=1)
            v = torch.cat([past[1], v], dim=1)
        rep = c["num_attention_heads"] // c["num_key_value_heads"]
        kk = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        vv = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        T, P = q.shape[2], kk.shape[2]
        scores = q @ kk.transpose(-1, -2) / math.sqrt(c["head_dim"])
        qpos = torch.arange(P - T, P, device=q.device)[:, None]
        kpos = torch.arange(P, device=q.device)[None, :]
        scores = scores.masked_fill(kpos > qpos, float("-inf"))
        out = (scores.softmax(-1) @ vv).transpose(1, 2).reshape(q.shape[0], T, -1)
        return self.finish(out, hidden), (k, v)

    # --- training-time test: K chained steps for every anchor at once -----------------------
    def forward_ttt(self, embeds_per_step, fused, steps):
        """embeds_per_step(k) -> [B, T, H] the token embeddings step k reads (anchor i: the token at
        i+1+k); fused [B, T, 3*target_hidden] the taps of each anchor. Step k of anchor i sits at
        position i+k and attends to step 0's keys of anchors <= i and to its own chain's keys of
        steps 1..k, as chained drafting does at inference. Returns the K prenorm outputs."""
        c = self.cfg
        B, T = fused.shape[:2]
        nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        rep = nh // nkv
        hidden = self.fc(fused)
        base = torch.arange(T, device=fused.device)
        causal = base[None, :] > base[:, None]  # [T, T] True = masked
        keys, values, outs = [], [], []
        scale = 1.0 / math.sqrt(hd)
        for k in range(steps):
            q, kk, vv = self.qkv(embeds_per_step(k), hidden)
            cos, sin = rope_cos_sin(base + k, hd, c["rope_theta"], q.dtype)
            q = rotate(q.transpose(1, 2), cos, sin)  # [B, nh, T, hd]
            kk = rotate(kk.transpose(1, 2), cos, sin).repeat_interleave(rep, dim=1)
            vv = vv.transpose(1, 2).repeat_interleave(rep, dim=1)
            keys.append(kk)
            values.append(vv)
            s0 = (q @ keys[0].transpose(-1, -2)) * scale
            s0 = s0.masked_fill(causal, float("-inf"))
            diag = [(q * keys[j]).sum(-1, keepdim=True) * scale for j in range(1, k + 1)]
            scores = torch.cat([s0] + diag, dim=-1).float().softmax(-1).to(q.dtype)
            out = scores[..., :T] @ values[0]
            for j in range(1, k + 1):
                out = out + scores[..., T + j - 1 : T + j] * values[j]
            out = out.transpose(1, 2).reshape(B, T, nh * hd)
            prenorm = self.finish(out, hidden)
            outs.append(prenorm)
            hidden = prenorm
        return outs

    # --- export -----------------------------------------------------------------------------
    def export_params(self):
        """The trained tensors by their names in the published layout."""
        return {
            "fc.weight": self.fc.weight,
            "midlayer.hidden_norm.weight": self.hidden_norm.weight,
            "midlayer.input_layernorm.weight": self.input_layernorm.weight,
            "midlayer.self_attn.q_proj.weight": self.q_proj.weight,
            "midlayer.self_attn.k_proj.weight": self.k_proj.weight,
            "midlayer.self_attn.v_proj.weight": self.v_proj.weight,
            "midlayer.self_attn.o_proj.weight": self.o_proj.weight,
            "midlayer.post_attention_layernorm.weight": self.post_attention_layernorm.weight,
            "midlayer.mlp.gate_proj.weight": self.gate_proj.weight,
            "midlayer.mlp.up_proj.weight": self.up_proj.weight,
            "midlayer.mlp.down_proj.weight": self.down_proj.weight,
            "norm.weight": self.norm.weight,
            "lm_head.weight": self.lm_head.weight,
        }

    def state_for_export(self, dtype):
        out = {k: v.detach().to(dtype).cpu() for k, v in self.export_params().items()}
        if self.embed_tokens is not None:
            out["embed_tokens.weight"] = self.embed_tokens.weight.detach().to(dtype).cpu()
        out["d2t"] = self.d2t.detach().cpu().to(torch.int64)
        out["t2d"] = self.t2d.detach().cpu().to(torch.bool)
        return out


def export_config(cfg, target_layers, extra=None):
    """config.json of the head, as the EAGLE-3 loaders read it."""
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "num_hidden_layers": 1,
        "vocab_size": cfg["vocab_size"],
        "draft_vocab_size": cfg["draft_vocab_size"],
        "target_hidden_size": cfg["target_hidden_size"],
        "max_position_embeddings": cfg.get("max_position_embeddings", 2048),
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": cfg.get("torch_dtype", "bfloat16"),
        "eagle_config": {"use_aux_hidden_state": True},
    }
    if extra:
        out.update(extra)
    return out


def default_tap_hidden_states(target_layers):
    """Indices into transformers' output_hidden_states (0 = embeddings, i = output of layer i-1)
    of the loaders' default taps: the inputs of layers 2, L/2 and L-3."""
    return [2, target_layers // 2, target_layers - 3]

#!/usr/bin/env python3
"""DSpark calibration of a DFlash drafter's confidence head on held-out sequences.

For blocks at random anchors of sequences the target itself produced (so the target's greedy
prediction at each position is known from one forward), records per block row k = 1..γ-1: the
head's raw score, the log of the drafter's top probability, and whether the draft was accepted
given that every earlier row was. Per row, a logistic fit (Platt scaling with the two features)
maps them to P(row k accepted | rows before it accepted); the product over rows is the chance
that a prefix survives verification, which the engine weighs against the verify window's price.

Usable alone on an exported drafter: calibrate_dflash.py --drafter models/dflash --data seqs.pt
rewrites the "dspark" object of its config.json.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_torch import Drafter, Target, fit_platt, st_load, tap_layers, target_features  # noqa: E402


@torch.no_grad()
def collect(drafter, target, seqs, taps, gamma, mask_id, blocks, seed):
    from train_dflash import drafter_forward, label_rows
    L = target.L
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for i in range(0, len(seqs), 32):
        s = seqs[i:i + 32]
        logits, hidden = target.forward(s, tap_layers(taps, L))
        feats = target_features(hidden, taps, L)
        h, anchors = drafter_forward(drafter, feats, s, target.embed, gamma, blocks, mask_id, gen)
        rows_h = h[:, :, 1:].float()
        dl = (rows_h.to(target.lm_head.dtype) @ target.lm_head.T).float()
        tl = label_rows(logits, anchors, gamma)
        ok = (dl.argmax(-1) == tl.argmax(-1))
        logq = torch.log_softmax(dl, -1).max(-1).values
        score = drafter.confidence(rows_h)
        rows.append((score.reshape(-1, gamma - 1).cpu(), logq.reshape(-1, gamma - 1).cpu(),
                     ok.reshape(-1, gamma - 1).cpu()))
    score = torch.cat([r[0] for r in rows]).numpy()
    logq = torch.cat([r[1] for r in rows]).numpy()
    ok = torch.cat([r[2] for r in rows]).numpy()
    return score, logq, ok


def fit(score, logq, ok):
    """Per row k: Platt weights [w_score, w_logq, bias] fitted where rows 1..k-1 were accepted."""
    n, K = ok.shape
    alive = np.ones(n, dtype=bool)
    table, report = [], []
    for k in range(K):
        idx = np.nonzero(alive)[0]
        if len(idx) >= 20 and 0 < ok[idx, k].mean() < 1:
            w = fit_platt(np.stack([score[idx, k], logq[idx, k]], 1), ok[idx, k])
        else:
            rate = (ok[idx, k].mean() if len(idx) else 0.5)
            rate = min(max(rate, 1e-3), 1 - 1e-3)
            w = np.array([0.0, 0.0, np.log(rate / (1 - rate))])
        p = 1 / (1 + np.exp(-(w[0] * score[idx, k] + w[1] * logq[idx, k] + w[2]))) if len(idx) else np.zeros(0)
        brier = float(np.mean((p - ok[idx, k]) ** 2)) if len(idx) else 0.0
        report.append({"row": k + 1, "samples": int(len(idx)), "accept_rate": float(ok[idx, k].mean()) if len(idx) else 0.0,
                       "mean_predicted": float(p.mean()) if len(idx) else 0.0, "brier": brier})
        table.append([float(x) for x in w])
        alive &= ok[:, k].astype(bool)
    accepted = np.cumprod(ok, 1).sum(1)
    return table, report, float(accepted.mean())


def calibrate(drafter, target, seqs, taps, gamma, mask_id, blocks, seed):
    score, logq, ok = collect(drafter, target, seqs, taps, gamma, mask_id, blocks, seed)
    table, report, mean_accepted = fit(score, logq, ok)
    dspark = {
        "version": 1,
        "features": ["confidence_score", "log_max_draft_probability"],
        "confidence_weight": [float(x) for x in drafter.conf_w.detach().cpu().tolist()],
        "confidence_bias": float(drafter.conf_b.detach().cpu()),
        "calibration": table,
        "calibrated_on": "greedy (temperature 0) acceptance of held-out self-distilled sequences",
    }
    return dspark, {"rows": report, "mean_accepted_drafts_per_block_greedy": mean_accepted, "blocks": int(ok.shape[0])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default="models/target")
    ap.add_argument("--data", required=True, help="a torch file of token sequences [N, S] the target produced")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    cfg = json.load(open(Path(args.drafter) / "config.json"))
    drafter = Drafter(cfg).to(args.device)
    for name, t in st_load(Path(args.drafter) / "model.safetensors").items():
        drafter.p(name).data.copy_(t.float())
    ds = cfg.get("dspark", {})
    if "confidence_weight" in ds:
        drafter.conf_w.data.copy_(torch.tensor(ds["confidence_weight"]))
        drafter.conf_b.data.fill_(ds["confidence_bias"])
    target = Target(args.target, args.device)
    dc = cfg["dflash_config"]
    dspark, report = calibrate(drafter, target, torch.load(args.data).to(args.device), dc["target_layer_ids"],
                               dc["block_size"], dc["mask_token_id"], blocks=32, seed=7)
    cfg["dspark"] = dspark
    (Path(args.drafter) / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

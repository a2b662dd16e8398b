#!/usr/bin/env python3
"""train_tiny.py: trains examples/generate's decoder (decoder.hpp) in PyTorch, saves its weights as
safetensors for `generate --weights`, and writes torch's greedy generations as a reference.

The model is the one decoder.hpp computes, written again in torch: character-level (vocabulary
128 = ASCII), learned token and position embeddings, pre-LayerNorm blocks of causal multi-head
attention (no biases on Q, K, V, O) and a GELU MLP (tanh approximation, biases), a final
LayerNorm and an unembedding without bias. Every matrix is stored [in][out] and applied as
y = x @ W, the layout decoder.hpp reads.

    python train_tiny.py --out DIR [--steps N] [--seed N] [--check GENERATE_EXE]

writes DIR/tiny.safetensors (float32; metadata "heads" = the head count, which the shapes do not
give), DIR/prompts.txt (one prompt a line) and DIR/reference.json (per prompt: torch's greedy
tokens, and per generated token the gap between torch's largest and second largest logit).
With --check, it then runs `GENERATE_EXE --weights DIR/tiny.safetensors --prompts-file
DIR/prompts.txt --print-tokens --modes recompute,kv,kv+prefix` and compares hone's tokens with
torch's (see compare()), then feeds it damaged copies of the weights (a missing tensor, a wrong
shape, a wrong dtype, an unknown tensor, no head count), which it must refuse with exit status 2
and a sentence naming the problem. Exit status: 0 passed, 1 failed, 77 torch or safetensors missing (CTest
counts 77 as skipped).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

try:
    import torch
    from safetensors.torch import save_file
except ImportError as e:  # pragma: no cover - depends on the interpreter
    print(f"HONE_SKIPPED: train_tiny.py needs torch and safetensors ({e})")
    sys.exit(77)

VOCAB, D_MODEL, HEADS, LAYERS, D_FF, MAX_LEN = 128, 64, 4, 2, 256, 256

# The corpus: plain English, repeated phrasing so that a 2-layer character model learns it in
# under a minute on two CPU cores.
CORPUS = """\
The cache keeps the keys and the values of every token in blocks. A block holds sixteen tokens.
When a prompt begins with a prefix that was seen before, the blocks of that prefix are found in
the cache and are not computed again. The model then computes only the rest of the prompt.
The batcher takes one request per step from many clients and runs them together as one batch.
Sequences join the batch and leave it between steps, so no client waits for the longest one.
The decoder reads the earlier positions through a table of row pointers. The same code runs
when the rows come from contiguous buffers and when they come from the blocks of the cache.
The same inputs give the same bits, and the same bits give the same tokens in every mode.
A careful assistant answers briefly and says when it is not sure. It cites the document it
used. It keeps numbers exact and units explicit, and it prefers short lists to long prose.
The weights are trained in Python and saved as safetensors. The C++ program reads the file,
checks every name, shape and type, and then writes text one character at a time.
The quick brown fox jumps over the lazy dog. The lazy dog sleeps in the warm sun all day.
The river runs to the sea, and the sea is wide and deep. The boat sails on the sea at night.
The stars shine over the sea, and the sailors sing songs of home and of the long road back.
"""

PROMPTS = [
    "The cache keeps the ",
    "When a prompt begins",
    "The batcher takes one",
    "A careful assistant ",
    "The quick brown fox ",
    "The river runs to the",
    "The weights are trained",
    "Sequences join the ",
]


def gelu(x):
    """decoder.hpp's gelu: 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def layer_norm(x, g, b):
    """decoder.hpp's layer_norm: biased variance, eps 1e-5 inside the square root."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) * (x - mean)).mean(dim=-1, keepdim=True)
    return (x - mean) * (1.0 / torch.sqrt(var + 1e-5)) * g + b


def init_weights(gen):
    """The tensors decoder.hpp's loader reads, by name, every matrix [in][out]."""
    d, f = D_MODEL, D_FF

    def normal(*shape, std):
        return (torch.randn(*shape, generator=gen) * std).requires_grad_()

    w = {
        "tok_emb": normal(VOCAB, d, std=0.1),
        "pos_emb": normal(MAX_LEN, d, std=0.02),
        "ln_f.weight": torch.ones(d, requires_grad=True),
        "ln_f.bias": torch.zeros(d, requires_grad=True),
        "unembed": normal(d, VOCAB, std=1.0 / math.sqrt(d)),
    }
    for i in range(LAYERS):
        p = f"layers.{i}."
        w[p + "ln1.weight"] = torch.ones(d, requires_grad=True)
        w[p + "ln1.bias"] = torch.zeros(d, requires_grad=True)
        for name in ("wq", "wk", "wv"):
            w[p + name] = normal(d, d, std=1.0 / math.sqrt(d))
        w[p + "wo"] = normal(d, d, std=0.5 / math.sqrt(d * LAYERS))
        w[p + "ln2.weight"] = torch.ones(d, requires_grad=True)
        w[p + "ln2.bias"] = torch.zeros(d, requires_grad=True)
        w[p + "w1"] = normal(d, f, std=1.0 / math.sqrt(d))
        w[p + "b1"] = torch.zeros(f, requires_grad=True)
        w[p + "w2"] = normal(f, d, std=0.5 / math.sqrt(f * LAYERS))
        w[p + "b2"] = torch.zeros(d, requires_grad=True)
    return w


def forward(w, idx):
    """Logits [B, T, VOCAB] of token ids idx [B, T] (training: all positions at once)."""
    B, T = idx.shape
    hd = D_MODEL // HEADS
    x = w["tok_emb"][idx] + w["pos_emb"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for i in range(LAYERS):
        p = f"layers.{i}."
        h = layer_norm(x, w[p + "ln1.weight"], w[p + "ln1.bias"])
        q = (h @ w[p + "wq"]).view(B, T, HEADS, hd).transpose(1, 2)
        k = (h @ w[p + "wk"]).view(B, T, HEADS, hd).transpose(1, 2)
        v = (h @ w[p + "wv"]).view(B, T, HEADS, hd).transpose(1, 2)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        s = s.masked_fill(mask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v
        x = x + a.transpose(1, 2).reshape(B, T, D_MODEL) @ w[p + "wo"]
        h = layer_norm(x, w[p + "ln2.weight"], w[p + "ln2.bias"])
        x = x + gelu(h @ w[p + "w1"] + w[p + "b1"]) @ w[p + "w2"] + w[p + "b2"]
    return layer_norm(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["unembed"]


def position(w, token, pos, past_k, past_v):
    """One position, in decoder::position()'s order: float32 vectors, the K and V of this
    position appended to past_k/past_v ([layer][head] lists of rows); returns the logits."""
    hd = D_MODEL // HEADS
    inv_sqrt_hd = torch.tensor(1.0, dtype=torch.float32) / torch.sqrt(
        torch.tensor(float(hd), dtype=torch.float32))
    x = w["tok_emb"][token] + w["pos_emb"][pos]
    for i in range(LAYERS):
        p = f"layers.{i}."
        h = layer_norm(x, w[p + "ln1.weight"], w[p + "ln1.bias"])
        q, k, v = h @ w[p + "wq"], h @ w[p + "wk"], h @ w[p + "wv"]
        att = torch.empty(D_MODEL, dtype=torch.float32)
        for hh in range(HEADS):
            sl = slice(hh * hd, (hh + 1) * hd)
            past_k[i][hh].append(k[sl])
            past_v[i][hh].append(v[sl])
            K = torch.stack(past_k[i][hh])  # [pos + 1, hd]
            V = torch.stack(past_v[i][hh])
            s = (K @ q[sl]) * inv_sqrt_hd
            e = torch.exp(s - s.max())
            att[sl] = (e / e.sum()) @ V
        x = x + att @ w[p + "wo"]
        h = layer_norm(x, w[p + "ln2.weight"], w[p + "ln2.bias"])
        ff = gelu(h @ w[p + "w1"] + w[p + "b1"])
        x = x + w[p + "b2"]
        x = x + ff @ w[p + "w2"]
    return layer_norm(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["unembed"]


def greedy(w, prompt, new_tokens):
    """Greedy generation position by position: (tokens, their logits, top-2 logit gaps), one of
    each per new token."""
    past_k = [[[] for _ in range(HEADS)] for _ in range(LAYERS)]
    past_v = [[[] for _ in range(HEADS)] for _ in range(LAYERS)]
    seq = [ord(c) for c in prompt]
    out, logit, gaps = [], [], []
    with torch.no_grad():
        logits = None
        for pos, t in enumerate(seq):
            logits = position(w, t, pos, past_k, past_v)
        for _ in range(new_tokens):
            top = torch.topk(logits, 2)
            nxt = int(top.indices[0])
            out.append(nxt)
            logit.append(float(top.values[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            if len(out) == new_tokens:
                break
            logits = position(w, nxt, len(seq) + len(out) - 1, past_k, past_v)
    return out, logit, gaps


def train(w, steps, seed, batch, seq_len, log):
    data = torch.tensor([ord(c) for c in CORPUS], dtype=torch.long)
    assert int(data.max()) < VOCAB, "the corpus must be ASCII"
    gen = torch.Generator().manual_seed(seed + 1)
    opt = torch.optim.AdamW(list(w.values()), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    first = last = None
    for step in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
        xb = torch.stack([data[s:s + seq_len] for s in starts])
        yb = torch.stack([data[s + 1:s + seq_len + 1] for s in starts])
        loss = torch.nn.functional.cross_entropy(forward(w, xb).reshape(-1, VOCAB), yb.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        sched.step()
        last = loss.item()
        if first is None:
            first = last
        if log and (step % 100 == 0 or step == steps - 1):
            print(f"step {step:5d}  loss {last:.4f}", flush=True)
    return first, last


def compare(reference, output, tol, logit_tol):
    """Compares hone's tokens and logits (lines 'tokens <i>: <ids>' and 'logits <i>: <values>' of
    generate --print-tokens) with torch's. Along each prompt, a position is compared while every
    earlier one matched: where torch's top-2 gap is above `tol`, hone must write torch's token;
    where it is not, a different token is allowed (float summation order decides a near tie) and
    the rest of that prompt is not compared (its inputs differ from then on). Where the tokens are
    equal, hone's logit of the token must be within `logit_tol` of torch's. Returns (compared,
    matched, near ties, largest logit difference, failures)."""
    hone, hone_logits = {}, {}
    for line in output.splitlines():
        if line.startswith("tokens ") or line.startswith("logits "):
            head, _, vals = line.partition(":")
            kind, index = head.split()
            if kind == "tokens":
                hone[int(index)] = [int(t) for t in vals.split()]
            else:
                hone_logits[int(index)] = [float(t) for t in vals.split()]
    compared = matched = near = 0
    worst = 0.0
    failures = []
    for i, ref in enumerate(reference["prompts"]):
        got = hone.get(i)
        if got is None or len(got) != len(ref["tokens"]):
            failures.append(f"prompt {i}: generate printed {got!r}, expected {len(ref['tokens'])} tokens")
            continue
        got_logits = hone_logits.get(i, [])
        if len(got_logits) != len(got):
            failures.append(f"prompt {i}: generate printed {len(got_logits)} logits for {len(got)} tokens")
            continue
        for j, (a, b, gap) in enumerate(zip(ref["tokens"], got, ref["gaps"])):
            if a == b:
                compared += 1
                matched += 1
                diff = abs(got_logits[j] - ref["logits"][j])
                worst = max(worst, diff)
                if diff > logit_tol:
                    failures.append(f"prompt {i} ({ref['prompt']!r}), new token {j}: torch's logit "
                                    f"{ref['logits'][j]:.9g}, hone's {got_logits[j]:.9g}: differ by "
                                    f"{diff:.3g} > tolerance {logit_tol:g}")
                continue
            if gap <= tol:
                near += 1
                break
            compared += 1
            failures.append(f"prompt {i} ({ref['prompt']!r}), new token {j}: torch wrote {a}, hone "
                            f"{b}, torch's top-2 gap {gap:.3g} > tolerance {tol:g}")
            break
    return compared, matched, near, worst, failures


def bad_weights_checks(exe, weights, out):
    """Damaged copies of the trained weights: generate must exit 2 with a sentence naming the
    problem. Returns the failures."""
    prompts = os.path.join(out, "prompts.txt")
    base = {k: v for k, v in weights.items()}
    cases = []

    def case(name, tensors, metadata, pattern, extra=()):
        cases.append((name, tensors, metadata, pattern, list(extra)))

    meta = {"heads": str(HEADS)}
    case("missing", {k: v for k, v in base.items() if k != "layers.1.wv"}, meta,
         "tensor 'layers.1.wv' is missing")
    case("shape", {**base, "layers.0.b1": base["layers.0.b1"][:100].contiguous()}, meta,
         f"tensor 'layers.0.b1' has shape [100], expected [{D_FF}]")
    case("transposed", {**base, "unembed": base["unembed"].t().contiguous()}, meta,
         f"tensor 'unembed' has shape [{VOCAB}, {D_MODEL}], expected [{D_MODEL}, {VOCAB}]")
    case("dtype", {**base, "ln_f.bias": base["ln_f.bias"].to(torch.int64)}, meta,
         "tensor 'ln_f.bias' is I64, expected a floating-point dtype")
    case("extra", {**base, "layers.2.wk": base["layers.0.wk"].clone()}, meta,
         "tensor 'layers.2.wk' is not one of the decoder's")
    case("no_heads", base, {}, "the head count is not in the file")
    case("heads_disagree", base, meta, "metadata says 4 heads, the caller 8", ["--heads", "8"])
    failures = []
    for name, tensors, metadata, pattern, extra in cases:
        path = os.path.join(out, f"bad_{name}.safetensors")
        save_file(tensors, path, metadata=metadata)
        proc = subprocess.run([exe, "--weights", path, "--prompts-file", prompts, "--new-tokens",
                               "2", "--modes", "kv"] + extra, capture_output=True, text=True)
        text = proc.stdout + proc.stderr
        if proc.returncode != 2 or pattern not in text:
            failures.append(f"bad weights '{name}': expected exit status 2 and '{pattern}', got "
                            f"status {proc.returncode}: {text.strip()[:300]!r}")
        else:
            print(f"bad weights '{name}': refused: {text.strip().splitlines()[0]}")
    # A hone checkpoint directory without its MANIFEST is refused (the MANIFEST is verified first).
    ckdir = os.path.join(out, "bad_checkpoint_dir")
    os.makedirs(ckdir, exist_ok=True)
    save_file(base, os.path.join(ckdir, "model.safetensors"), metadata=meta)
    proc = subprocess.run([exe, "--weights", ckdir, "--prompts-file", prompts, "--new-tokens", "2",
                           "--modes", "kv"], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 2 or "is damaged or incomplete" not in text:
        failures.append(f"checkpoint directory without MANIFEST: expected exit status 2 and 'is "
                        f"damaged or incomplete', got {proc.returncode}: {text.strip()[:300]!r}")
    else:
        print(f"bad weights 'checkpoint_dir': refused: {text.strip().splitlines()[0]}")
    # The file without "heads" loads with --heads.
    proc = subprocess.run([exe, "--weights", os.path.join(out, "bad_no_heads.safetensors"),
                           "--heads", str(HEADS), "--prompts-file", prompts, "--new-tokens", "2",
                           "--modes", "kv"], capture_output=True, text=True)
    if proc.returncode != 0:
        failures.append(f"--heads {HEADS} on a file without metadata: status {proc.returncode}: "
                        f"{(proc.stdout + proc.stderr).strip()[:300]!r}")
    return failures, len(cases) + 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the weights and the reference")
    ap.add_argument("--steps", type=int, default=400, help="training steps (default 400)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128, help="training sequence length (<= 256)")
    ap.add_argument("--new-tokens", type=int, default=48, help="greedy tokens per reference prompt")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--check", metavar="GENERATE_EXE", help="run hone's generate and compare")
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="top-2 logit gap below which a differing token is a near tie (default 1e-3)")
    ap.add_argument("--logit-tolerance", type=float, default=1e-4,
                    help="largest |hone - torch| of a generated token's logit (default 1e-4)")
    args = ap.parse_args()
    if not 1 <= args.seq_len <= MAX_LEN - 1:
        ap.error(f"--seq-len must be in [1, {MAX_LEN - 1}]")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    w = init_weights(torch.Generator().manual_seed(args.seed))
    t0 = time.time()
    first, last = train(w, args.steps, args.seed, args.batch, args.seq_len, log=True)
    train_s = time.time() - t0
    print(f"trained {args.steps} steps in {train_s:.1f} s: loss {first:.4f} -> {last:.4f} "
          f"(uniform over {VOCAB} tokens: {math.log(VOCAB):.4f})", flush=True)

    weights = {k: v.detach().contiguous() for k, v in w.items()}
    path = os.path.join(args.out, "tiny.safetensors")
    save_file(weights, path, metadata={"heads": str(HEADS), "format": "pt"})

    # The reference, and the float64 distance of torch's float32 logits (the size of rounding).
    ref = {"weights": "tiny.safetensors", "steps": args.steps, "loss_first": first,
           "loss_last": last, "new_tokens": args.new_tokens, "prompts": []}
    for p in PROMPTS:
        toks, logits, gaps = greedy(weights, p, args.new_tokens)
        ref["prompts"].append({"prompt": p, "tokens": toks, "logits": logits, "gaps": gaps})
    w64 = {k: v.double() for k, v in weights.items()}
    with torch.no_grad():
        ids = torch.tensor([[ord(c) for c in CORPUS[:MAX_LEN]]])
        drift = float((forward(weights, ids).double() - forward(w64, ids)).abs().max())
    ref["float32_logit_error"] = drift
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    with open(os.path.join(args.out, "prompts.txt"), "w") as f:
        f.write("".join(p + "\n" for p in PROMPTS))
    min_gap = min(g for r in ref["prompts"] for g in r["gaps"])
    print(f"reference: {len(PROMPTS)} prompts x {args.new_tokens} greedy tokens; smallest top-2 gap "
          f"{min_gap:.3g}; float32 vs float64 logits differ by at most {drift:.3g}")
    for r in ref["prompts"][:3]:
        print(f"  torch: {r['prompt']!r} -> {''.join(chr(t) for t in r['tokens'])!r}")

    if not args.check:
        return 0
    cmd = [args.check, "--weights", path, "--prompts-file", os.path.join(args.out, "prompts.txt"),
           "--new-tokens", str(args.new_tokens), "--print-tokens", "--modes", "recompute,kv,kv+prefix",
           "--clients", "4", "--block-tokens", "4"]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        print(f"check failed: generate exited with status {proc.returncode}")
        return 1
    compared, matched, near, worst, failures = compare(ref, proc.stdout, args.tolerance,
                                                       args.logit_tolerance)
    total = len(PROMPTS) * args.new_tokens
    print(f"compared {compared} of {total} greedy tokens with torch's: {matched} equal, "
          f"{near} near ties (top-2 gap <= {args.tolerance:g}) ended a prompt's comparison; "
          f"their logits differ by at most {worst:.3g} (tolerance {args.logit_tolerance:g})")
    bad_failures, bad_cases = bad_weights_checks(args.check, weights, args.out)
    failures += bad_failures
    for msg in failures:
        print("check failed:", msg)
    if failures or compared == 0:
        return 1
    print(f"check: hone's greedy tokens equal torch's; the {bad_cases} weight-file checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

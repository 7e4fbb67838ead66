#!/usr/bin/env python3
"""The GPT of examples/train_gpt in PyTorch, trained from the same initial weights on the
same batches (`train_gpt --dump-init DIR` writes them).

    python3 scripts/torch_gpt.py --init DIR [--precision fp32|bf16] [--compile] [--steps N]
        [--attention sdpa|manual] [--profile N --profile-csv PATH]

fp32 runs with TF32 off (products and attention in plain f32); bf16 runs under
torch.autocast(bfloat16) with f32 master weights and optimizer state. Prints
`step S loss L` for every step, as train_gpt does, then
`RESULT impl=torch mode=eager|compile model=M batch=B tokens_per_s=X mfu=F peak_mem_gib=G`
(timed over the steps after the first five; MFU against 67 TFLOP/s for fp32, 989 for
bf16; peak memory: torch.cuda.max_memory_reserved).

`--profile N` records the GPU activity of the run's last N steps with torch.profiler
(CUDA activity only; the steps before are the warm-up) and writes one row per kernel,
memcpy or memset name — `name,calls,total_us` (summed durations, microseconds), longest
first — to `--profile-csv` (what scripts/profile-gpt.sh summarises). The profiled steps
count in RESULT's timing like the others.
"""
import argparse
import csv
import json
import math
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_TFLOPS = {"fp32": 67.0, "bf16": 989.0}


def read_safetensors(path):
    """The tensors of a safetensors file (F32 only), without the safetensors package."""
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        arr = np.frombuffer(raw[base + a : base + b], dtype="<f4").reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


class Attention(nn.Module):
    def __init__(self, c, nh, sdpa):
        super().__init__()
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.nh, self.sdpa = nh, sdpa

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, nh, sdpa):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.attn = Attention(c, nh, sdpa)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, m, sdpa):
        super().__init__()
        c = m["width"]
        self.wte = nn.Embedding(m["vocab"], c)
        self.wpe = nn.Embedding(m["context"], c)
        self.h = nn.ModuleList(Block(c, m["heads"], sdpa) for _ in range(m["layers"]))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the head is tied to wte
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def lr_at(m, step):
    if step < m["warmup"]:
        return m["lr"] * (step + 1) / m["warmup"]
    span = max(m["steps"] - m["warmup"], 1)
    ratio = min((step - m["warmup"]) / span, 1.0)
    lo = m["lr"] * m["min_frac"]
    return lo + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (m["lr"] - lo)


def flops_per_token(m):
    l, c, t, v = m["layers"], m["width"], m["context"], m["vocab"]
    return 6.0 * (l * 12 * c * c + v * c) + 6.0 * l * t * c


def start_profile():
    """A started torch.profiler recording CUDA activity, after the work queued so far."""
    torch.cuda.synchronize()
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    prof.start()
    return prof


def gpu_activity(prof):
    """{name: [calls, total µs]} of the kernels, memcpys and memsets `prof` recorded."""
    table = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        row = table.setdefault(e.name, [0, 0.0])
        row[0] += 1
        row[1] += e.time_range.elapsed_us()
    if not table:  # the events without their kernels: read the trace instead
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"torch_gpt-trace-{os.getpid()}.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
        os.unlink(path)
        for e in trace.get("traceEvents", []):
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                row = table.setdefault(e["name"], [0, 0.0])
                row[0] += 1
                row[1] += float(e.get("dur", 0.0))
    return table


def write_profile(prof, steps, path):
    torch.cuda.synchronize()
    prof.stop()
    table = gpu_activity(prof)
    if not table:
        raise SystemExit("torch_gpt: the profiler recorded no GPU activity")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "calls", "total_us"])
        for name, (calls, us) in sorted(table.items(), key=lambda kv: -kv[1][1]):
            w.writerow([name, calls, f"{us:.3f}"])
    total = sum(us for _, us in table.values())
    print(
        f"PROFILE steps={steps} names={len(table)} calls={sum(c for c, _ in table.values())} "
        f"gpu_ms_per_step={total / steps / 1e3:.3f} csv={path}",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True, help="train_gpt --dump-init's directory")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa")
    ap.add_argument("--steps", type=int, default=0, help="at most the dumped steps")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="profile the last N steps")
    ap.add_argument("--profile-csv", default="torch-gpu-activity.csv", metavar="PATH")
    a = ap.parse_args()
    m = json.load(open(os.path.join(a.init, "meta.json")))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device("cuda")
    model = Gpt(m, a.attention == "sdpa")
    missing = model.load_state_dict(read_safetensors(os.path.join(a.init, "init.safetensors")))
    model.to(dev)
    data = torch.from_numpy(np.fromfile(os.path.join(a.init, "train.u8"), dtype=np.uint8).astype(np.int64))
    order = np.fromfile(os.path.join(a.init, "batches.u64"), dtype="<u8").reshape(m["steps"], m["batch"])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": m["weight_decay"]}, {"params": other, "weight_decay": 0.0}],
        lr=m["lr"],
        betas=(m["beta1"], m["beta2"]),
        eps=m["eps"],
    )
    step_fn = torch.compile(model) if a.compile else model
    t, b = m["context"], m["batch"]
    steps = min(a.steps or m["steps"], m["steps"])
    if a.profile < 0 or (a.profile and a.profile >= steps):
        ap.error(f"--profile {a.profile}: needs 1 to {steps - 1} (the steps before it warm up)")
    offs = torch.arange(t + 1)
    timed, elapsed = 0, 0.0
    prof = None
    for step in range(steps):
        if a.profile and step == steps - a.profile:
            prof = start_profile()
        t0 = time.perf_counter()
        seqs = data[torch.from_numpy(order[step].astype(np.int64))[:, None] + offs]
        x, y = seqs[:, :-1].to(dev, non_blocking=True), seqs[:, 1:].to(dev, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(m, step)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), m["max_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        dt = time.perf_counter() - t0
        if step >= min(5, steps // 2):
            timed += 1
            elapsed += dt
        print(f"step {step + 1} loss {value:.6f}", flush=True)
    if prof is not None:
        write_profile(prof, a.profile, a.profile_csv)
    tps = timed * b * t / elapsed if elapsed > 0 else 0.0
    mfu = tps * flops_per_token(m) / (PEAK_TFLOPS[a.precision] * 1e12)
    peak = torch.cuda.max_memory_reserved() / 2**30
    mode = "compile" if a.compile else "eager"
    print(
        f"RESULT impl=torch mode={mode} precision={a.precision} attention={a.attention} "
        f"model={m['model']} batch={b} tokens_per_s={tps:.0f} mfu={mfu:.4f} peak_mem_gib={peak:.2f}"
    )
    del missing


if __name__ == "__main__":
    main()

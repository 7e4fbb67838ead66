#!/usr/bin/env python3
"""PyTorch baseline for examples/train_mlp: the same MLP, data, optimizer and batch.

Model 32-H-H-8 (ReLU), softmax cross-entropy (mean over the batch), SGD with momentum 0.9
(PyTorch's rule, v = mu*v + g, w -= lr*v: the same as train_mlp's kernel), lr 0.1, FP32
everywhere (TF32 off). Each step uploads its batch from page-locked host memory
(`copy_(..., non_blocking=True)` into static device tensors) and copies its loss into a
page-locked slot (`non_blocking=True`); the host waits once per epoch of `--steps` steps,
as train_mlp does.

Modes:
  eager  the step as ordinary PyTorch calls.
  graph  the step (forward, backward, optimizer) captured once in a CUDA graph
         (torch.cuda.graph, warm-up on a side stream, as PyTorch's CUDA-graph docs show)
         and replayed; uploads and the loss copy stay outside the graph. After warm-up the
         parameters and momentum are reset, so training starts from the same state.

Data: with `--data DIR` (written by `train_mlp --dump-data DIR`) exactly train_mlp's
training rows and initial weights; without it, equivalent data made here with torch's
generator (same recipe: inputs are 0.75 x the sum of four U(-1, 1), labels the argmax of a
fixed random He-uniform teacher MLP, He-uniform weights, zero biases), not the same bits.

Prints one line per epoch and, per mode, a machine-readable line:
  RESULT impl=torch mode=eager batch=4096 ranks=1 samples_per_s=... tflops=... frac_fp32=...
counted like train_mlp: 2*M*N*K per matrix product of the step (3 forward, 3 weight
gradients, 2 input gradients), over epochs 1.. (epoch 0 is warm-up), as a fraction of the
H200 SXM's 67 TFLOP/s dense FP32 (NVIDIA's datasheet figure).

Usage: python3 scripts/torch_mlp.py [--mode eager|graph|both] [--batch 4096] [--steps 16]
           [--epochs 20] [--data DIR] [--hidden 256] [--lr 0.1] [--seed 1] [--device 0]
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

H200_FP32_TFLOPS = 67.0
INPUT, CLASSES = 32, 8


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["eager", "graph", "both"], default="both")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=16, help="steps per epoch (one host wait each)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--data", help="directory written by `train_mlp --dump-data`")
    a = p.parse_args()
    if a.batch <= 0 or a.steps <= 0 or a.epochs <= 0 or a.hidden <= 0:
        p.error("--batch, --steps, --epochs and --hidden must be positive")
    return a


def shapes(hidden):
    """(fan_in, fan_out) of the three layers."""
    return [(INPUT, hidden), (hidden, hidden), (hidden, CLASSES)]


def flops_per_sample(hidden):
    macs = [i * o for i, o in shapes(hidden)]
    return 2.0 * (3 * sum(macs) - macs[0])


def he_uniform(hidden, gen):
    params = []
    for fan_in, fan_out in shapes(hidden):
        bound = (6.0 / fan_in) ** 0.5
        params.append((torch.rand(fan_in, fan_out, generator=gen) * 2 - 1) * bound)
        params.append(torch.zeros(fan_out))
    return params


def forward(p, x):
    h = F.relu(torch.addmm(p[1], x, p[0]))
    h = F.relu(torch.addmm(p[3], h, p[2]))
    return torch.addmm(p[5], h, p[4])


def make_data(args, rows):
    gen = torch.Generator().manual_seed(args.seed)
    x = (torch.rand(rows, INPUT, 4, generator=gen) * 2 - 1).sum(-1) * 0.75
    teacher = he_uniform(args.hidden, torch.Generator().manual_seed(0x7EAC4E55))
    with torch.no_grad():
        y = forward([t.double() for t in teacher], x.double()).argmax(1)
    params = he_uniform(args.hidden, torch.Generator().manual_seed(args.seed + 17))
    return x, y, params


def load_data(args, rows):
    meta = {}
    with open(os.path.join(args.data, "meta.txt")) as f:
        for line in f:
            k, v = line.split()
            meta[k] = int(v)
    if (meta["input"], meta["hidden"], meta["classes"]) != (INPUT, args.hidden, CLASSES):
        sys.exit(f"torch_mlp: {args.data} holds a {meta['input']}-{meta['hidden']}-"
                 f"{meta['classes']} model, not {INPUT}-{args.hidden}-{CLASSES}")
    if meta["rows"] < rows:
        sys.exit(f"torch_mlp: {args.data} holds {meta['rows']} rows; "
                 f"--batch {args.batch} x --steps {args.steps} needs {rows}")

    def raw(name, dtype, count):
        with open(os.path.join(args.data, name), "rb") as f:
            buf = bytearray(f.read())
        t = torch.frombuffer(buf, dtype=dtype)
        if t.numel() < count:
            sys.exit(f"torch_mlp: {name} holds {t.numel()} values, expected {count}")
        return t[:count].clone()

    x = raw("x.f32", torch.float32, rows * INPUT).view(rows, INPUT)
    # Labels are < 8: their u32 bits read as i32 are the same numbers.
    y = raw("y.u32", torch.int32, rows).long()
    lens = []
    for fan_in, fan_out in shapes(args.hidden):
        lens += [fan_in * fan_out, fan_out]
    flat = raw("params.f32", torch.float32, sum(lens))
    params, off = [], 0
    for t, n in enumerate(lens):
        chunk = flat[off:off + n]
        off += n
        if t % 2 == 0:
            fan_in, fan_out = shapes(args.hidden)[t // 2]
            chunk = chunk.view(fan_in, fan_out)
        params.append(chunk.clone())
    return x, y, params


def train(mode, args, x_pin, y_pin, init, dev):
    batch, steps = args.batch, args.steps
    params = [t.to(dev).requires_grad_() for t in init]
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    static_x = torch.empty(batch, INPUT, device=dev)
    static_y = torch.empty(batch, dtype=torch.long, device=dev)
    losses = torch.zeros(steps, pin_memory=True)

    def upload(s):
        static_x.copy_(x_pin[s * batch:(s + 1) * batch], non_blocking=True)
        static_y.copy_(y_pin[s * batch:(s + 1) * batch], non_blocking=True)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(params, static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    graph = static_loss = None
    if mode == "graph":
        upload(0)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = F.cross_entropy(forward(params, static_x), static_y)
            static_loss.backward()
            opt.step()
        # Start from the initial state, as eager does (zero momentum: the first step then
        # sets v = g, as a fresh buffer would).
        with torch.no_grad():
            for p, p0 in zip(params, init):
                p.copy_(p0.to(dev))
            for st in opt.state.values():
                st["momentum_buffer"].zero_()
        torch.cuda.synchronize(dev)

    samples = time_total = 0.0
    for epoch in range(args.epochs):
        start = time.perf_counter()
        for s in range(steps):
            upload(s)
            if graph is not None:
                graph.replay()
                loss = static_loss
            else:
                loss = step()
            losses[s].copy_(loss.detach(), non_blocking=True)
        torch.cuda.synchronize(dev)
        secs = time.perf_counter() - start
        if epoch > 0:  # epoch 0 includes warm-up (cuBLAS heuristics, allocator)
            samples += batch * steps
            time_total += secs
        print(f"torch {mode} epoch {epoch:>3}: loss {losses.sum().item() / steps:.4f}  "
              f"{batch * steps / secs:.0f} samples/s", flush=True)
    throughput = samples / time_total if time_total > 0 else 0.0
    tflops = throughput * flops_per_sample(args.hidden) / 1e12
    print(f"RESULT impl=torch mode={mode} batch={batch} ranks=1 samples_per_s={throughput:.0f} "
          f"tflops={tflops:.3f} frac_fp32={tflops / H200_FP32_TFLOPS:.4f}", flush=True)


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_mlp: no CUDA device visible to PyTorch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    rows = args.batch * args.steps
    x, y, init = load_data(args, rows) if args.data else make_data(args, rows)
    x_pin, y_pin = x.pin_memory(), y.pin_memory()
    print(f"torch_mlp: torch {torch.__version__}, {torch.cuda.get_device_name(dev)}, "
          f"MLP {INPUT}-{args.hidden}-{args.hidden}-{CLASSES}, batch {args.batch}, "
          f"{args.steps} steps/epoch, data {'from ' + args.data if args.data else 'generated'}",
          flush=True)
    for mode in (["eager", "graph"] if args.mode == "both" else [args.mode]):
        train(mode, args, x_pin, y_pin, init, dev)


if __name__ == "__main__":
    main()

"""Issue 29's real inference loop: a small MLP (four bf16 4096x4096
layers) captured once as a CUDA graph, serving fixed-size requests (a
batch of 64) one at a time, each synchronised.

    latency_torch.py SECS WARM

Prints steps, steps_per_s, p50_ms, p99_ms, max_ms of the step latency,
and gpu_ms: one step's GPU work, timed with events over 50 steps queued
back to back (no host gaps), so that a share can be judged in GPU time.
"""
import sys
import time

import torch


def main():
    secs, warm = float(sys.argv[1]), float(sys.argv[2])
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4096, 4096, bias=False, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    model = torch.nn.Sequential(*[m for l in layers for m in (l, torch.nn.ReLU())]).eval()
    x = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    request = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = model(x)
    torch.cuda.synchronize()

    def step():
        x.copy_(request)
        g.replay()
        y.sum().item()  # the answer back on the host: synchronised

    end = time.perf_counter() + warm
    while time.perf_counter() < end:
        step()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(50):
        x.copy_(request)
        g.replay()
        y.sum()
    b.record()
    b.synchronize()
    gpu_ms = a.elapsed_time(b) / 50
    lat = []
    t0 = time.perf_counter()
    end = t0 + secs
    while True:
        a = time.perf_counter()
        if a >= end:
            break
        step()
        lat.append((time.perf_counter() - a) * 1e3)
    took = time.perf_counter() - t0
    lat.sort()
    n = len(lat)
    print(f"steps={n} steps_per_s={n / took:.2f} p50_ms={lat[n // 2]:.4f} "
          f"p99_ms={lat[int(0.99 * (n - 1))]:.4f} max_ms={lat[-1]:.4f} gpu_ms={gpu_ms:.4f}")


if __name__ == "__main__":
    main()

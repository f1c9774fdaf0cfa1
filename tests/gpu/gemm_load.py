#!/usr/bin/env python3
"""GEMM load for cuda_engine_bench's interference table: an 8192^3 bf16 matmul loop on one GPU, in
its own process (beside kvraild under MPS, as an inference server would be). Prints "ready" once
warmed up, then runs for --seconds and prints "tflops <achieved>" (2*8192^3 per product) and,
where NVML answers, "gpu sm_mhz <mean> power_w <mean> capped <fraction of samples with a power or
thermal clock cap>" read during the run (only read: clocks and limits are left alone)."""
import argparse
import sys
import threading
import time

import torch


class GpuSampler:
    """Samples the SM clock, board power and clock-cap reasons of one GPU every 20 ms."""

    def __init__(self, index):
        self.samples = []
        self.stop = threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no NVML here: the table goes without these columns
            self.nvml = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        n = self.nvml
        caps = 0
        for name in ("SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwPowerBrakeSlowdown"):
            caps |= getattr(n, "nvmlClocksEventReason" + name,
                            getattr(n, "nvmlClocksThrottleReason" + name, 0))
        reasons_of = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        while not self.stop.wait(0.02):
            try:
                mhz = n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)
                watts = n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
                reasons = reasons_of(self.handle)
                self.samples.append((mhz, watts, 1 if reasons & caps else 0))
            except Exception:
                return

    def start(self):
        if self.nvml is not None:
            self.thread.start()

    def report(self):
        if self.nvml is None:
            return
        self.stop.set()
        self.thread.join()
        if not self.samples:
            return
        k = len(self.samples)
        mhz = sum(s[0] for s in self.samples) / k
        watts = sum(s[1] for s in self.samples) / k
        capped = sum(s[2] for s in self.samples) / k
        print(f"gpu sm_mhz {mhz:.0f} power_w {watts:.0f} capped {capped:.2f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--n", type=int, default=8192)
    args = p.parse_args()
    torch.cuda.set_device(args.device)
    n = args.n
    a = torch.randn((n, n), dtype=torch.bfloat16, device="cuda")
    b = torch.randn((n, n), dtype=torch.bfloat16, device="cuda")
    c = torch.empty((n, n), dtype=torch.bfloat16, device="cuda")
    for _ in range(5):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    print("ready", flush=True)
    sys.stdin.readline()  # the bench says "go" when its transfers start
    # NVML numbers devices in PCI order, as CUDA does for identical GPUs (both H200s here).
    sampler = GpuSampler(args.device)
    sampler.start()
    count = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(4):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        count += 4
        sec = time.perf_counter() - t0
        if sec >= args.seconds:
            break
    print(f"tflops {2 * n ** 3 * count / sec / 1e12:.1f}", flush=True)
    sampler.report()


if __name__ == "__main__":
    main()

"""CUDA-event timing shared by the PyTorch reference benchmarks (bench_sdpa.py,
bench_mamba_ssd.py): the median time in ms of `reps` runs of fn() after `warm`
warm-up runs; before(), if given, runs ahead of every call, outside the timed
region (e.g. clearing .grad)."""
import statistics

import torch


def timed(fn, warm, reps, before=None):
    for _ in range(warm):
        if before:
            before()
        fn()
    torch.cuda.synchronize()
    times = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        if before:
            before()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def kernel_ms(fn, reps, before=None):
    """The GPU time of one fn() without its launch overhead: the sum of the
    durations of every kernel (and device memcpy / memset) fn() launches, from
    the PyTorch profiler's CUDA activity over `reps` calls, divided by reps.
    Call after warm-up (timed() first): autotuning runs are not wanted here."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if before:
                before()
            fn()
        torch.cuda.synchronize()
    us = sum(e.self_device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA)
    return us / 1000.0 / reps

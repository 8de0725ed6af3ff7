"""The conditions a timing runs under: torch's CPU threads, chosen deliberately, and whether other work shares the
cores. On a machine running more than its cores, torch's threads wait on each other and timings of the same
decode can differ several-fold (docs/log.md); a ratio measured interleaved still holds better than either
time, but neither is a measurement of the method alone."""

from __future__ import annotations

import os

import torch


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def use_threads(threads: int | None) -> int:
    """Set torch's CPU threads where `threads` is given (else keep torch's default, one per core); the count."""
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def log_conditions(log) -> None:
    """Log what a timing runs with (threads as set by `use_threads`), and warn when the machine is busier than
    its cores."""
    n, load, c = torch.get_num_threads(), os.getloadavg()[0], cores()
    log.info(f"timed with {n} torch thread{'s' * (n != 1)} on {c} cores (load {load:.1f})")
    if load > c:
        log.warning(f"the machine is busier than its cores (load {load:.1f} on {c}): timings may not hold; "
                    "threads=1 suffers least from the contention, and only a ratio measured side by side means much")

"""bench/load_cpu.py's reading of perf samples: what entered the kernel, from a call chain
as ``perf script`` prints it (a real sample's shape, innermost first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import load_cpu

WRITE = ["copy_folio_from_iter_atomic", "generic_perform_write", "shmem_file_write_iter",
         "vfs_write", "ksys_write", "do_syscall_64", "entry_SYSCALL_64_after_hwframe"]
FAULT = ["clear_page_erms", "alloc_anon_folio", "handle_mm_fault", "do_user_addr_fault",
         "exc_page_fault", "asm_exc_page_fault"]


def test_what_entered_the_kernel() -> None:
    assert load_cpu.kernel_entry(WRITE) == "sys ksys_write"
    munmap = ["unmap_page_range", "__vm_munmap", "__x64_sys_munmap", "do_syscall_64"]
    assert load_cpu.kernel_entry(munmap) == "sys munmap"
    # A copy into fresh memory faults inside the syscall.
    read = ["clear_page_erms", "handle_mm_fault", "_copy_to_iter", "__x64_sys_pread64",
            "do_syscall_64"]
    assert load_cpu.kernel_entry(read) == "sys pread64+fault"
    assert load_cpu.kernel_entry(FAULT) == "page fault"
    assert load_cpu.kernel_entry(["handle_softirqs", "asm_sysvec_apic_timer_interrupt"]) \
        == "interrupt"
    assert load_cpu.kernel_entry(["something"]) == "other"


def test_perf_script_samples_are_parsed(monkeypatch: Any) -> None:
    lines = ["10736 19497.431150: ", *[f"\tffffffff817df062 {f}+0x12" for f in WRITE],
             "\t           f838f __GI___libc_write", "",
             "10863 19497.432651: ", "\t          115e3d [unknown]", ""]

    def run(*a: Any, **k: Any) -> Any:
        return subprocess.CompletedProcess(a, 0, "\n".join(lines), "")

    monkeypatch.setattr(load_cpu.subprocess, "run", run)
    samples = load_cpu.read_samples("x")
    assert samples == [(10736, 19497.43115, True, WRITE), (10863, 19497.432651, False, [])]

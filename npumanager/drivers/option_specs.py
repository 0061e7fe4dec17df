"""The ``[[driver]] options`` each built-in plugin reads, with their types and ranges, so
that ``npu serve --check-config`` names a misspelt or mistyped option before a driver host
meets it (a plugin reads its options with ``int(...)``/``float(...)`` at start, or only
at its first prepare; an unknown key it never reads at all).

Pure data, no backend imported: the checks run without OpenVINO or torch installed.
``tests/cli/test_check_config.py`` holds each plugin's source against its table (every
``options.get("KEY")`` it reads is listed here). Plugins outside this table (a
``module:Class``, a third party's) keep their options unchecked.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Opt:
    """``kind``: "int", "float", "str", "names" (a name or a list of names), "choice"."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    what: str = ""


_DEVICES = Opt("names", what="the devices this entry serves")
_MEMORY = Opt("int", 1, what="the memory budget's size in bytes")
_CACHE_FILES = Opt("int", 0, 32, what="cache files per model (at most 32)")

PLUGIN_OPTIONS: dict[str, dict[str, Opt]] = {
    "reference": {
        "devices": _DEVICES,
        "memory_bytes": _MEMORY,
        "model_cache_files": _CACHE_FILES,
        "data_cache_files": _CACHE_FILES,
        "intra_op_threads": Opt("int", 0, 1024),
        "intra_op_threads_foreground": Opt("int", 0, 1024),
        "intra_op_threads_background": Opt("int", 0, 1024),
        "intra_op_spinning": Opt("int", 0, 1),
        "intra_op_spinning_foreground": Opt("int", 0, 1),
        "intra_op_spinning_background": Opt("int", 0, 1),
        # Background sessions' ONNX Runtime options (drivers/ort_tuning.py).
        "graph_optimization_background": Opt("choice", choices=("disabled", "basic",
                                                                "extended", "all")),
        "mem_arena_background": Opt("int", 0, 1),
        "mem_pattern_background": Opt("int", 0, 1),
        "ambient_c": Opt("float", -50.0, 150.0),
        "max_c": Opt("float", -50.0, 200.0),
        "thermal_tau_s": Opt("float", 0.001, 86400.0),
        "compile_mode": Opt("choice", choices=("eager", "jit", "multistage")),
        "recompile_after": Opt("int", 0),
        "device_queue_lock": Opt("str", what="a one-queue device emulated for benchmarks: "
                                 "the file whose flock every native run holds"),
    },
    "openvino": {
        "devices": _DEVICES,
        "memory_bytes": _MEMORY,
        "model_cache_files": _CACHE_FILES,
        "num_streams": Opt("int", 1, 1024),
        "inference_num_threads": Opt("int", 0, 4096),
        "execution_mode": Opt("choice", choices=("accuracy", "performance")),
    },
    "torch": {
        "devices": _DEVICES,
        "memory_bytes": _MEMORY,
        "model_cache_files": _CACHE_FILES,
        "runners": Opt("int", 1, 64),
        "compile_memo_entries": Opt("int", 0, 4096),
        "state_dir": Opt("str"),
        "inductor_cache_dir": Opt("str"),
    },
}


def _type_problem(key: str, value: Any, opt: Opt) -> str | None:
    kind = opt.kind
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key} = {value!r} must be an integer"
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{key} = {value!r} must be a number"
    elif kind == "str":
        if not isinstance(value, str) or not value:
            return f"{key} = {value!r} must be a non-empty string"
    elif kind == "names":
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            return f"{key} = {value!r} must be a name or a list of names"
    elif kind == "choice" and value not in opt.choices:
        return f"{key} = {value!r} must be one of {', '.join(map(repr, opt.choices))}"
    if opt.lo is not None and isinstance(value, int | float) and value < opt.lo:
        return f"{key} = {value!r} must be at least {opt.lo:g}"
    if opt.hi is not None and isinstance(value, int | float) and value > opt.hi:
        return f"{key} = {value!r} must be at most {opt.hi:g}"
    return None


def option_problems(plugin: str, options: Mapping[str, Any]) -> Iterator[str]:
    """Each problem of ``options`` for the built-in ``plugin`` (none for other plugins)."""
    specs = PLUGIN_OPTIONS.get(plugin)
    if specs is None:
        return
    for key, value in options.items():
        opt = specs.get(str(key))
        if opt is None:
            near = difflib.get_close_matches(str(key), list(specs), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            yield (f"unknown option {key!r} for plugin {plugin!r} ({hint}known: "
                   f"{', '.join(sorted(specs))})")
            continue
        problem = _type_problem(str(key), value, opt)
        if problem is not None:
            yield problem
    lo, hi = options.get("ambient_c"), options.get("max_c")
    if plugin == "reference" and isinstance(lo, int | float) and isinstance(hi, int | float) \
            and not isinstance(lo, bool) and not isinstance(hi, bool) and lo >= hi:
        yield f"ambient_c = {lo!r} must be below max_c = {hi!r}"

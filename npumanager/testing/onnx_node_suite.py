"""ONNX's backend node test cases, in-process and through a driver host, side by side.

``onnx.backend.test.case.node.collect_testcases()`` yields the ~1,900 cases the
ONNX project wrote for its operators (a model, inputs, expected outputs,
tolerances). For each case this runs the backend in-process, as an app would
(ONNX Runtime; OpenVINO), checks it against ONNX's expected outputs the way
ONNX's own backend runner does, then runs it through a real driver host and
requires exactly what the backend gave in-process: the same Python types
(list, dict, None), dtypes, shapes and values. A case the backend itself fails
in-process is listed with the reason it gives; the driver must fail it too.

Inputs are normalized once, for both runs: ONNX's ``TensorProto`` data (types
numpy lacks) becomes ml_dtypes arrays (``onnx.numpy_helper``), and numpy
scalars become 0-d arrays (ONNX Runtime's ``run`` takes no numpy scalar).

``python -m npumanager.testing.onnx_node_suite [--backend openvino] [--subset] [--write FILE]``
prints the counts per category and writes the list of in-process failures.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

#: Categories a case is counted in (one case may be in several; "tensors" when none other).
CATEGORIES = ("tensors", "0-d", "strings", "sequences", "optionals", "maps")
PASS, BACKEND_FAILS, DRIVER_FAILS = "pass", "backend fails in-process", "fails through the driver"


@dataclass
class Case:
    name: str
    model: bytes
    inputs: dict[str, Any]
    expected: list[Any]
    rtol: float
    atol: float
    op: str
    categories: frozenset[str]
    dtypes: frozenset[str]


@dataclass
class Result:
    case: Case
    verdict: str
    reason: str = ""
    #: The driver's outputs were bit-identical to in-process (else equal within the case's
    #: tolerance).
    identical: bool = True
    #: For a backend failure: the driver failed too.
    driver_failed_too: bool = True


@dataclass
class Report:
    backend: str
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0

    def by_verdict(self, verdict: str) -> list[Result]:
        return [r for r in self.results if r.verdict == verdict]

    def table(self) -> str:
        rows: list[tuple[str, ...]] = [("category", "cases", "passed",
                                        f"{self.backend} fails in-process",
                                        "fail through the driver")]
        for cat in CATEGORIES:
            rs = [r for r in self.results if cat in r.case.categories]
            rows.append((cat, str(len(rs)), *(str(sum(r.verdict == v for r in rs))
                                               for v in (PASS, BACKEND_FAILS, DRIVER_FAILS))))
        rows.append(("all", str(len(self.results)), *(str(len(self.by_verdict(v)))
                                                      for v in (PASS, BACKEND_FAILS,
                                                                DRIVER_FAILS))))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        dt: Counter[str] = Counter()
        for r in self.by_verdict(PASS):
            dt.update(r.case.dtypes)
        lines.append("passed, by element type: " + ", ".join(f"{k} {v}" for k, v in
                                                            sorted(dt.items())))
        close = [r.case.name for r in self.by_verdict(PASS) if not r.identical]
        n_identical = len(self.by_verdict(PASS)) - len(close)
        lines.append(f"passed bit-identical to in-process: {n_identical}"
                     + (f" (equal within the case's tolerance: {', '.join(close)})"
                        if close else ""))
        both = sum(r.driver_failed_too for r in self.by_verdict(BACKEND_FAILS))
        lines.append(f"{self.backend} in-process failures the driver fails too: {both} of "
                     f"{len(self.by_verdict(BACKEND_FAILS))}; {self.seconds:.0f} s")
        return "\n".join(lines)


def per_op(report: Report) -> str:
    """One line per operator (an expanded function or small graph: its case's name):
    cases, passed, failing in-process, failing through the driver."""
    per: dict[str, list[Result]] = defaultdict(list)
    for r in report.results:
        per[r.case.op].append(r)
    lines = [f"op\tcases\tpassed\t{report.backend} fails in-process\tfail through the driver"]
    for op in sorted(per):
        rs = per[op]
        lines.append("\t".join([op, str(len(rs)), *(str(sum(r.verdict == v for r in rs))
                                                   for v in (PASS, BACKEND_FAILS,
                                                             DRIVER_FAILS))]))
    return "\n".join(lines) + "\n"


# --- collecting -----------------------------------------------------------------------------


def _normalize(value: Any) -> Any:
    import onnx
    from onnx import numpy_helper

    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, list | tuple):
        return [_normalize(v) for v in value]
    return value


def _walk_types(tp: Any) -> Iterator[tuple[str, int]]:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        yield "tensor", tp.tensor_type.elem_type
    elif which == "sequence_type":
        yield "sequence", 0
        yield from _walk_types(tp.sequence_type.elem_type)
    elif which == "map_type":
        yield "map", 0
        yield from _walk_types(tp.map_type.value_type)
    elif which == "optional_type":
        yield "optional", 0
        yield from _walk_types(tp.optional_type.elem_type)


def _arrays(value: Any) -> Iterator[np.ndarray]:
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _arrays(v)


def _classify(model: Any, values: list[Any]) -> tuple[frozenset[str], frozenset[str]]:
    import onnx

    cats: set[str] = set()
    for vi in [*model.graph.input, *model.graph.output]:
        for kind, elem in _walk_types(vi.type):
            if kind == "sequence":
                cats.add("sequences")
            elif kind == "map":
                cats.add("maps")
            elif kind == "optional":
                cats.add("optionals")
            elif elem == onnx.TensorProto.STRING:
                cats.add("strings")
    arrays = [a for v in values for a in _arrays(v)]
    if any(a.ndim == 0 for a in arrays):
        cats.add("0-d")
    if not cats:
        cats.add("tensors")
    dtypes = {"string" if a.dtype.kind in "OUS" else a.dtype.name for a in arrays}
    return frozenset(cats), frozenset(dtypes)


def _op(model: Any, name: str) -> str:
    ops = [n.op_type for n in model.graph.node]
    if len(ops) == 1:
        return str(ops[0])
    # An expanded function body, or a small graph: named for the case's operator.
    stem = name.removeprefix("test_").split("_expanded")[0]
    return f"{stem} ({len(ops)} nodes)"


#: Per backend, the modules of ONNX's node cases (under ``onnx.backend.test.case.node``)
#: that every CI run takes through the driver. The reference driver's (~250 cases, ~10 s):
#: 0-d tensors (Size, BitCast, Shape), every element type ORT has and the ones it refuses
#: in-process (Cast, Quantize/DequantizeLinear: bfloat16, float8, int4), strings
#: (StringNormalizer, LabelEncoder, RegexFullMatch, StringSplit, StringConcat), sequences
#: (SequenceInsert, SplitToSequence, SequenceMap, Loop, If), optionals (OptionalGetElement,
#: OptionalHasElement, Loop, If), empty and plain tensors (Add, MatMul, Conv, Softmax,
#: ReduceSum, TopK, Unique, NonZero, Identity, ConstantOfShape). OpenVINO compiles every
#: model (~0.25 s a case), so its subset is the ~70 cases of one module per category. The
#: whole suite (~1,900 cases; ~2 min for the reference driver on 2 cores, ~8 for OpenVINO):
#: ``python -m npumanager.testing.onnx_node_suite``, or the test with NPU_ONNX_NODE_SUITE=all.
SUBSETS = {
    "reference": (
        "size", "bitcast", "shape", "cast", "dequantizelinear", "quantizelinear",
        "stringnormalizer", "ai_onnx_ml.label_encoder", "regex_full_match", "string_split",
        "string_concat", "sequenceinsert", "splittosequence", "sequence_map",
        "optionalgetelement", "optionalhaselement", "loop", "if_", "add", "matmul", "conv",
        "softmax", "reducesum", "topk", "unique", "nonzero", "identity", "constantofshape",
    ),
    "openvino": (
        "size", "bitcast", "shape", "dequantizelinear", "stringnormalizer", "sequenceinsert",
        "optionalhaselement", "if_", "add", "identity",
    ),
}

_MODULE_CASES: dict[str, list[Any]] = {}


def _module_cases(module: str) -> list[Any]:
    """The raw cases one module of ONNX's node cases defines (its import runs them)."""
    import importlib

    if module not in _MODULE_CASES:
        from onnx.backend.test.case import node

        qualified = f"{node.__name__}.{module}"
        if qualified in sys.modules:
            raise RuntimeError(f"{qualified} was imported before: collect a subset before the "
                               "whole suite in one process")
        registry: list[Any] = node._NodeTestCases
        start = len(registry)
        importlib.import_module(qualified)
        _MODULE_CASES[module] = registry[start:]
    return _MODULE_CASES[module]


def collect(names: Callable[[str], bool] | None = None,
            modules: Iterable[str] | None = None) -> list[Case]:
    """ONNX's node test cases (each with one data set) for ``names``: all of them (~25 s),
    or those of ``modules`` (e.g. one of :data:`SUBSETS`; a few seconds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators overflow casts on purpose
        if modules is None:
            from onnx.backend.test.case.node import collect_testcases

            raw = collect_testcases()
        else:
            raw = [tc for m in modules for tc in _module_cases(m)]
    cases = []
    for tc in raw:
        if names is not None and not names(tc.name):
            continue
        model = tc.model
        if model is None:
            continue
        inits = {t.name for t in model.graph.initializer}
        input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        for i, (ins, outs) in enumerate(tc.data_sets or []):
            inputs = dict(zip(input_names, (_normalize(v) for v in ins), strict=False))
            expected = [_normalize(v) for v in outs]
            cats, dtypes = _classify(model, [*inputs.values(), *expected])
            cases.append(Case(tc.name if i == 0 else f"{tc.name}#{i}",
                              model.SerializeToString(), inputs, expected, tc.rtol, tc.atol,
                              _op(model, tc.name), cats, dtypes))
    return cases


# --- comparing ------------------------------------------------------------------------------


def expected_mismatch(case: Case, outputs: list[Any]) -> str | None:
    """Why ``outputs`` are not ONNX's expected ones (ONNX's own backend runner's check)."""
    from onnx.backend.test.runner import Runner

    try:
        Runner.assert_similar_outputs(case.expected, outputs, case.rtol, case.atol)
    except (AssertionError, TypeError, ValueError) as exc:
        return "outputs differ from ONNX's expected: " + _first_line(exc)
    return None


def difference(a: Any, b: Any, rtol: float, atol: float, where: str = "output"
               ) -> tuple[str | None, bool]:
    """(why ``b`` (through the driver) differs from ``a`` (in-process), or None; whether
    every tensor is bit-identical)."""
    if type(a) is not type(b):
        return f"{where}: {type(b).__name__}, in-process {type(a).__name__}", False
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return (f"{where}: {b.dtype} {b.shape}, in-process {a.dtype} {a.shape}", False)
        if a.dtype.kind in "OUS":
            same = a.tolist() == b.tolist()
            return (None if same else f"{where}: other strings"), same
        if a.tobytes() == b.tobytes():
            return None, True
        x, y = a.astype(np.float64), b.astype(np.float64)
        if np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
            return None, False
        return f"{where}: other values (max abs diff {np.nanmax(np.abs(x - y))})", False
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(b)} elements, in-process {len(a)}", False
        identical = True
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            why, same = difference(x, y, rtol, atol, f"{where}[{i}]")
            if why:
                return why, False
            identical = identical and same
        return None, identical
    if isinstance(a, dict):
        same = list(a.items()) == list(b.items()) and all(
            type(x) is type(y) for x, y in zip(a.values(), b.values(), strict=True))
        return (None if same else f"{where}: other map"), same
    return (None if a == b else f"{where}: {b!r}, in-process {a!r}"), a == b


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return " ".join(text.split("\n", 1)[0].split())[:300]


# --- running --------------------------------------------------------------------------------

#: Runs a case's model in-process: outputs in the graph's order, or raises.
InProcess = Callable[[Case], list[Any]]


def ort_in_process(case: Case) -> list[Any]:
    """ONNX Runtime's Python API as an app calls it: numpy arrays in, and for a model with
    bfloat16 or float8 inputs or outputs OrtValues of their ONNX type in and their bytes
    read back as ml_dtypes (``session.run`` maps no ml_dtypes array to its own type)."""
    import onnxruntime as ort

    from npumanager.drivers.ort_values import run_values, session_typed

    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(case.model, so, providers=["CPUExecutionProvider"])
    if session_typed(sess):
        return run_values(sess, [o.name for o in sess.get_outputs()], case.inputs, None)
    return list(sess.run(None, case.inputs))


def openvino_in_process(case: Case) -> list[Any]:
    """OpenVINO's Python API as an app calls it: numpy arrays in (shared), and the element
    types numpy lacks as typed ``ov.Tensor``s in and reread as ml_dtypes out (OpenVINO
    maps no ml_dtypes array to its own type: it refuses a float8 array for an f8 input, or
    converts its bits as integers)."""
    from npumanager.drivers.openvino_values import OV_TO_ML, from_ov, to_ov

    core = _ov_core()
    compiled = core.compile_model(core.read_model(case.model), "CPU")
    req = compiled.create_infer_request()
    feed = {}
    for port in compiled.inputs:
        names = port.get_names() & set(case.inputs)
        if names:
            feed[port] = to_ov(case.inputs[next(iter(names))])
    req.infer(feed, share_inputs=True)
    return [from_ov(req.get_output_tensor(i),
                    OV_TO_ML.get(port.get_element_type().get_type_name(), ""))
            for i, port in enumerate(compiled.outputs)]


_CORE: list[Any] = []


def _ov_core() -> Any:
    if not _CORE:
        import openvino as ov

        _CORE.append(ov.Core())
    return _CORE[0]


IN_PROCESS: dict[str, InProcess] = {"reference": ort_in_process,
                                    "openvino": openvino_in_process}


Outcome = tuple[list[Any] | None, str | None]  # (outputs, or why it failed)


def _outcome(fn: Callable[[], list[Any]]) -> Outcome:
    try:
        return fn(), None
    except Exception as exc:
        return None, _first_line(exc)


def judge(case: Case, local_outcome: Outcome, remote_outcome: Outcome) -> Result:
    """The verdict on one case from its in-process and its through-the-driver run."""
    local, local_error = local_outcome
    remote, remote_error = remote_outcome
    if local is None:  # the driver fails too when it raises or gives other than ONNX expects
        failed_too = remote is None or expected_mismatch(case, remote) is not None
        return Result(case, BACKEND_FAILS, local_error or "", driver_failed_too=failed_too)
    mismatch = expected_mismatch(case, local)
    if mismatch is not None:
        failed_too = remote is None or expected_mismatch(case, remote) is not None
        return Result(case, BACKEND_FAILS, mismatch, driver_failed_too=failed_too)
    if remote is None:
        return Result(case, DRIVER_FAILS, remote_error or "")
    why, identical = difference(local, remote, case.rtol, case.atol)
    if why is not None:
        return Result(case, DRIVER_FAILS, why, identical=False)
    return Result(case, PASS, identical=identical)


def _via_driver(case: Case, device: Any) -> list[Any]:
    model = device.prepare_model(case.model)
    try:
        out = model.execute(case.inputs)
        return [out[spec.name] for spec in model.outputs]
    finally:
        model.release()


def run_suite(cases: Iterable[Case], backend: str, device: Any,
              progress: Callable[[Result], None] | None = None) -> Report:
    """Each case in-process and through ``device``. The in-process runs go ahead on a
    thread while the driver works (both mostly wait in native code or on the socket)."""
    report = Report(backend)
    in_process = IN_PROCESS[backend]
    t0 = time.monotonic()
    window: deque[tuple[Case, Future[Outcome]]] = deque()
    todo = iter(cases)
    with ThreadPoolExecutor(1, thread_name_prefix="in-process") as pool:
        def refill() -> None:
            while len(window) < 4:
                case = next(todo, None)
                if case is None:
                    return
                window.append((case, pool.submit(_outcome, partial(in_process, case))))

        refill()
        while window:
            case, local = window.popleft()
            remote = _outcome(partial(_via_driver, case, device))
            refill()
            result = judge(case, local.result(), remote)
            report.results.append(result)
            if progress is not None:
                progress(result)
    report.seconds = time.monotonic() - t0
    return report


# --- the lists of in-process failures -------------------------------------------------------


def versions(backend: str) -> str:
    import onnx

    if backend == "openvino":
        import openvino as ov

        return f"onnx {onnx.__version__}, openvino {ov.__version__}"
    import onnxruntime as ort

    return f"onnx {onnx.__version__}, onnxruntime {ort.__version__}"


def failures_text(report: Report) -> str:
    """The backend's in-process failures, grouped per operator, with the reason each gives."""
    per_op: dict[str, list[Result]] = defaultdict(list)
    for r in report.by_verdict(BACKEND_FAILS):
        per_op[r.case.op].append(r)
    lines = [f"# ONNX node test cases {report.backend} fails in-process "
             f"({versions(report.backend)}): {len(report.by_verdict(BACKEND_FAILS))} of "
             f"{len(report.results)}, {len(per_op)} operators.",
             "# Written by python -m npumanager.testing.onnx_node_suite --backend "
             f"{report.backend} --write FILE; checked by tests/drivers/test_onnx_node_suite.py.",
             "# op: case<TAB>reason"]
    for op in sorted(per_op):
        lines.append(f"## {op}")
        for r in sorted(per_op[op], key=lambda r: r.case.name):
            lines.append(f"{r.case.name}\t{r.reason}")
    return "\n".join(lines) + "\n"


def read_failures(text: str) -> tuple[str, dict[str, str]]:
    """(the versions line, case -> reason) of a file :func:`failures_text` wrote."""
    header = text.split("\n", 1)[0]
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, reason = line.partition("\t")
            found[name] = reason
    return header, found


def main(argv: list[str] | None = None) -> int:
    import shutil
    import tempfile
    from pathlib import Path

    from npumanager import nn
    from npumanager.testing.driver_host import running_driver

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="reference", choices=sorted(IN_PROCESS))
    ap.add_argument("--write", metavar="FILE", help="write the in-process failures there")
    ap.add_argument("--per-op", metavar="FILE", help="write the counts per operator there")
    ap.add_argument("-k", metavar="TEXT", help="only cases whose name contains TEXT")
    ap.add_argument("--subset", action="store_true",
                    help="only the cases of the modules CI runs every time (SUBSETS)")
    args = ap.parse_args(argv)
    text = args.k
    cases = collect((lambda n: text in n) if text else None,
                    SUBSETS[args.backend] if args.subset else None)
    rt = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        with (running_driver(args.backend, rt, st, args=["--no-enforce-admission"]),
              nn.device(args.backend, rt) as dev):
            report = run_suite(cases, args.backend, dev)
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)
    print(report.table())
    for r in report.by_verdict(DRIVER_FAILS):
        print(f"FAILS THROUGH THE DRIVER: {r.case.name}: {r.reason}")
    for r in report.by_verdict(BACKEND_FAILS):
        if not r.driver_failed_too:
            print(f"FAILS IN-PROCESS ONLY: {r.case.name}: {r.reason}")
    if args.write:
        Path(args.write).write_text(failures_text(report))
    if args.per_op:
        Path(args.per_op).write_text(per_op(report))
    return 1 if report.by_verdict(DRIVER_FAILS) or any(
        not r.driver_failed_too for r in report.by_verdict(BACKEND_FAILS)) else 0


if __name__ == "__main__":
    sys.exit(main())

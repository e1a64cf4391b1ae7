"""The isolated worker process: `python -m kforge.tools.worker`.

Candidate and reference code run only here. The parent (`kforge.tools.runner`) sends one JSON
object per line on our stdin and reads one JSON object per line back. Before any user code runs
the worker moves the protocol to private file descriptors and points fds 0/1/2 at /dev/null and a
log file, so nothing a candidate prints (from Python or C) can reach the protocol or the server's
stdio. A worker plays one role per job: the *judge* loads the reference, makes the inputs and keeps
the expected outputs in its own memory; the *candidate* worker gets inputs only.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

__all__ = ["main"]


class _NonTensor:
    """Stands in for an output that is not a plain torch.Tensor (saved as its type name)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


def _set_limits(memory_bytes: int | None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing candidate must not fill the disk
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


class Worker:
    def __init__(self, init: dict[str, Any]) -> None:
        from kforge.backends import load_backend

        self.scratch = Path(init["scratch"])
        self.cache_dir = Path(init["cache_dir"])
        # A probe worker has no backend: it must work even where torch cannot be imported.
        self.backend = load_backend(init["backend"]) if init.get("backend") else None
        memory = init.get("memory_bytes") if getattr(self.backend, "limits_address_space", False) else None
        _set_limits(memory)  # before any user code runs
        if self.backend is not None:
            self.backend.setup()
        self.module: Any = None
        self.user_file: Path | None = None
        self.extensions: list[Any] = []
        self.kernel_names: list[str] = []
        self.model: Any = None
        self.sets: list[list[Any]] = []
        self.expected: list[list[Any]] = []
        self.expected_devices: list[str | None] = []
        self.compiled: Any = None

    # -- helpers ---------------------------------------------------------------------------------
    def _args(self, i: int) -> list[Any]:
        import torch

        raw = self.sets[i % len(self.sets)]
        return self.backend.to_device([a.clone() if isinstance(a, torch.Tensor) else a for a in raw])

    def _failure(self, exc: BaseException, stage: str) -> dict[str, Any]:
        from .loader import python_failure

        f = python_failure(exc, stage=stage, user_file=self.user_file or Path("<none>"))
        return {"failure": f.model_dump(mode="json")}

    # -- ops -------------------------------------------------------------------------------------
    def op_probe(self, msg: dict[str, Any]) -> dict[str, Any]:
        from kforge.backends import load_backend

        out = []
        for name in msg["backends"]:
            try:
                out.append(load_backend(name).probe().model_dump(mode="json"))
            except Exception as exc:  # noqa: BLE001 - a broken backend module is "unavailable"
                out.append({"backend": name, "ok": False, "reason": f"backend failed to load: {exc}"})
        return {"backends": out}

    def op_ceilings(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The device's facts with its measured ceilings, measured once per device and cached."""
        import re

        import torch

        facts = self.backend.facts()
        slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{self.backend.name}-{facts.device_name}-torch{torch.__version__}")
        path = self.cache_dir.parent / "ceilings" / f"{slug.strip('-')}.json"
        if path.exists() and not msg.get("remeasure"):
            ceilings = json.loads(path.read_text())
        else:
            ceilings = self.backend.measure_ceilings()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(ceilings))
        return {"facts": facts.model_copy(update=ceilings).model_dump(mode="json"), "cached": str(path)}

    def op_load(self, msg: dict[str, Any]) -> dict[str, Any]:
        from .loader import load_user_module

        role = msg["role"]
        self.user_file = self.scratch / f"{role}.py"
        outcome = load_user_module(msg["source"], path=self.user_file, module_name=f"kforge_{role}",
                                   cache_dir=self.cache_dir, backend=self.backend)
        self.module, self.extensions = outcome.module, outcome.extensions
        self.kernel_names = [k.kernel for b in outcome.builds for k in b.kernels]
        if self.module is not None:  # Triton kernels are the candidate's own too (jit, autotuned, heuristics)
            self.kernel_names += [name for name, obj in vars(self.module).items()
                                  if type(obj).__module__.startswith("triton") and callable(obj)]
        failure = outcome.failure
        wanted = "Model" if role == "reference" else "ModelNew"
        if failure is None:
            failure = self._interface_failure(wanted, reference=(role == "reference"))
        return {"seconds": outcome.seconds, "builds": [b.model_dump(mode="json") for b in outcome.builds],
                "kernel_names": self.kernel_names,
                "diagnostics": [d.model_dump(mode="json") for d in outcome.diagnostics],
                "failure": failure.model_dump(mode="json") if failure else None}

    def _interface_failure(self, wanted: str, *, reference: bool) -> Any:
        import torch

        from .models import Failure

        missing = []
        cls = getattr(self.module, wanted, None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            missing.append(f"class {wanted}(torch.nn.Module)")
        if reference:
            missing += [f"function {f}()" for f in ("get_inputs", "get_init_inputs") if not callable(getattr(self.module, f, None))]
        if not missing:
            return None
        who = "reference" if reference else "candidate"
        return Failure(stage="load", kind="interface_error",
                       message=f"the {who} does not define {', '.join(missing)} (KernelBench format)")

    def op_prepare(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Judge: build Model, make one input set per seed, compute and keep expected outputs."""
        import torch

        from .compare import flatten_outputs, tensor_info

        stage = "reference"
        try:
            torch.manual_seed(msg["init_seed"])
            init_inputs = list(self.module.get_init_inputs())
            torch.manual_seed(msg["init_seed"])
            self.model = self.backend.to_device(self.module.Model(*init_inputs))
            self.sets, self.expected = [], []
            for seed in msg["seeds"]:
                torch.manual_seed(seed)
                self.sets.append(list(self.module.get_inputs()))
            with torch.no_grad():
                for i in range(len(self.sets)):
                    out = flatten_outputs(self.model(*self._args(i)))
                    self.backend.synchronize()
                    self.expected.append([o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in out])
                    self.expected_devices = [str(o.device) if isinstance(o, torch.Tensor) else None for o in out]
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, stage)
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        torch.save({"init_inputs": init_inputs, "init_seed": msg["init_seed"], "state_dict": state, "sets": self.sets},
                   msg["exchange"])
        return {"expected": [tensor_info(o).model_dump(mode="json") for o in self.expected[0]]}

    def op_problem_size(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Bytes in and out of one call (a floor on its memory traffic) and its FLOPs, as torch counts them."""
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        tensors = [t for t in list(self.sets[0]) + list(self.expected[0]) if isinstance(t, torch.Tensor)]
        flops = None
        try:
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                self.model(*self._args(0))
            flops = int(counter.get_total_flops())
        except Exception:  # noqa: BLE001 - an op the counter cannot trace: leave FLOPs unknown
            pass
        out = self.expected[0][0] if self.expected[0] else None
        return {"problem_bytes": sum(t.numel() * t.element_size() for t in tensors), "problem_flops": flops,
                "dtype": str(out.dtype).removeprefix("torch.") if isinstance(out, torch.Tensor) else None}

    def op_run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Candidate: build ModelNew with the reference's weights, run every input set, save outputs."""
        import torch

        from .compare import flatten_outputs

        exchange = torch.load(msg["exchange"], weights_only=True)
        self.sets = exchange["sets"]
        try:
            torch.manual_seed(exchange["init_seed"])
            model = self.module.ModelNew(*exchange["init_inputs"])
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, "init")
        sync = _copy_weights(model, exchange["state_dict"])
        self.model = self.backend.to_device(model)
        results = []
        with torch.no_grad():
            for i in range(len(self.sets)):
                try:
                    out = flatten_outputs(self.model(*self._args(i)))
                    self.backend.synchronize()
                except BaseException as exc:  # noqa: BLE001
                    f = self._failure(exc, "forward")["failure"]
                    results.append({"error": f["message"] + (f" (line {f['line']})" if f["line"] else ""), "failure": f})
                    continue
                # The judge sees CPU copies, so record where each output lived for the device check.
                results.append({"outputs": [o.detach().cpu().clone() if type(o) is torch.Tensor
                                            else {"__non_tensor__": type(o).__name__} for o in out],
                                "devices": [str(o.device) if isinstance(o, torch.Tensor) else None for o in out]})
        torch.save(results, msg["outputs"])
        return {"weights": sync, "trial_failures": [r.get("failure") for r in results],
                "jit_kernels": self._jit_kernels()}

    def _jit_kernels(self) -> list[dict[str, Any]]:
        """Kernels the backend compiled while the candidate ran (Triton); resource data is best effort."""
        try:
            return self.backend.jit_kernels(self.module)
        except Exception as exc:  # noqa: BLE001 - an unknown Triton layout must not fail a verified run
            print(f"kforge: could not read compiled kernel metadata: {type(exc).__name__}: {exc}", file=sys.stderr)
            return []

    def op_compare(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        from .compare import compare_outputs

        results = torch.load(msg["outputs"], weights_only=True)
        trials = []
        for i, res in enumerate(results):
            if "error" in res:
                trials.append({"error": res["error"], "checks": []})
                continue
            got = [_NonTensor(o["__non_tensor__"]) if isinstance(o, dict) else o for o in res["outputs"]]
            checks = compare_outputs(self.expected[i], got, atol=msg.get("atol"), rtol=msg.get("rtol"),
                                     expected_devices=self.expected_devices, got_devices=res.get("devices"))
            trials.append({"error": None, "checks": [c.model_dump(mode="json") for c in checks]})
        return {"trials": trials}

    def op_read_ncu(self, msg: dict[str, Any]) -> dict[str, Any]:
        from kforge.profilers.ncu import read_report

        try:
            kernels = read_report(Path(msg["report"]), msg["custom_names"])
        except Exception as exc:  # noqa: BLE001 - a report we cannot read is a note, not a failed profile
            return {"kernels": [], "note": f"could not read the Nsight Compute report: {type(exc).__name__}: {exc}"}
        return {"kernels": [k.model_dump(mode="json") for k in kernels], "note": None}

    def op_time(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        from .timing import TimingPolicy, time_model

        label = msg["label"]
        policy = TimingPolicy(**msg.get("policy", {}))
        fn: Callable[..., Any] = self.model
        try:
            if msg.get("compile"):
                if self.compiled is None:
                    self.compiled = torch.compile(self.model)
                fn = self.compiled
            with torch.no_grad():
                stats = time_model(label, fn, self._args, self.backend, policy)
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, "timing")
        return {"timing": stats.model_dump(mode="json")}

    def op_profile(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        from kforge.profilers.perf_counters import PerfStat
        from kforge.profilers.torch_profiler import collect_op_table, label_extension_functions

        trace = Path(msg["artifacts"]) / "trace.json"
        try:
            with torch.no_grad(), label_extension_functions(self.extensions):
                rows, total_us, basis = collect_op_table(self.model, self._args, self.backend, calls=msg["calls"],
                                                         trace_path=trace, custom_kernels=self.kernel_names)
            perf, i = None, 0
            if msg.get("perf"):  # only where perf is the device's counter profiler (CPUs)
                with torch.no_grad(), PerfStat() as perf:
                    t_end = time.perf_counter() + msg.get("perf_seconds", 0.5)
                    while time.perf_counter() < t_end:
                        self.model(*self._args(i))
                        i += 1
                    self.backend.synchronize()
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, "profile")
        return {"rows": [r.model_dump(mode="json") for r in rows], "total_us": total_us, "basis": basis,
                "trace": trace.name if trace.exists() else None,
                "counters": [c.model_dump(mode="json") for c in perf.counters] if perf else [],
                "counters_note": perf.note if perf else None,
                "perf_calls": i, "facts": self.backend.facts().model_dump(mode="json")}


def _copy_weights(model: Any, reference_state: dict[str, Any]) -> dict[str, Any]:
    """Give ModelNew the reference's initial parameters and buffers, matched by name and shape."""
    import torch

    own = model.state_dict()
    copied, unmatched = 0, []
    with torch.no_grad():
        for name, value in reference_state.items():
            if name in own and own[name].shape == value.shape:
                own[name].copy_(value)
                copied += 1
            else:
                unmatched.append(name)
    return {"copied": copied, "reference_total": len(reference_state), "unmatched": unmatched[:20]}


def main() -> None:
    # Keep the protocol on private fds; user code gets /dev/null for stdin and a log file for 1/2.
    proto_in = os.fdopen(os.dup(0), "r")
    proto_out = os.fdopen(os.dup(1), "w", buffering=1)
    init = json.loads(proto_in.readline())
    log_fd = os.open(init["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    os.chdir(init["scratch"])

    def reply(payload: dict[str, Any]) -> None:
        proto_out.write(json.dumps(payload) + "\n")
        proto_out.flush()

    try:
        worker = Worker(init)
    except BaseException as exc:  # noqa: BLE001
        reply({"fatal": f"worker could not start: {type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return
    reply({"ready": True, "pid": os.getpid()})
    for line in proto_in:
        msg = json.loads(line)
        handler = getattr(worker, f"op_{msg['op']}", None)
        if handler is None:
            reply({"fatal": f"unknown op {msg['op']!r}"})
            continue
        try:
            reply({"ok": True, **handler(msg)})
        except Exception as exc:  # noqa: BLE001 - a harness bug; report it rather than hang the parent
            reply({"fatal": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    main()

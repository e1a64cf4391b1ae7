"""The judge's operations (a mixin of `kforge.tools.worker.Worker`): runs only in the judge worker.

The judge loads the reference, draws the inputs from seeds the server chose after the candidate
was loaded, computes the expected outputs (and, where the reference runs in float64, the exact ones)
and keeps them in its own memory. It compares what the candidate's worker saved, calibrates the
check against trivial "null" candidates, and re-validates outputs the candidate produced while
being timed. The candidate never receives an expected output.
"""

from __future__ import annotations

import copy
import time
from typing import Any

__all__ = ["JudgeOps"]


def _reference_numerics() -> None:
    """The reference is the truth: no TF32 and no reduced-precision reductions, whatever the defaults."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def _all_finite(outputs: list[Any]) -> bool:
    import torch

    return all(bool(torch.isfinite(o).all()) for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point())


class JudgeOps:
    # State (set by Worker.__init__): module, model, backend, sets, expected, exact, expected_devices.

    def _reference_outputs(self, model: Any, inputs: list[Any], cast: Any = None) -> list[Any]:
        import torch

        from .compare import flatten_outputs

        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]
        if cast is not None:
            args = [cast(a) for a in args]
        with torch.no_grad():
            out = flatten_outputs(model(*self.backend.to_device(args)))
        self.backend.synchronize()
        self.expected_devices = [str(o.device) if isinstance(o, torch.Tensor) else None for o in out]
        return [o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in out]

    def op_prepare(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Build Model, make one input set per seed (rotating distributions), keep expected outputs."""
        import torch

        from .compare import tensor_info
        from .inputs import VARIANTS, SeededSets, apply_variant, seeded_inputs

        _reference_numerics()
        notes: list[str] = []
        try:
            torch.manual_seed(msg["init_seed"])
            init_inputs = list(self.module.get_init_inputs())
            torch.manual_seed(msg["init_seed"])
            self.model = self.backend.to_device(self.module.Model(*init_inputs))
            self.expected, self.distributions = [], []
            call_s = []
            for i, seed in enumerate(msg["seeds"]):
                native = seeded_inputs(self.module, seed, self.backend)
                variant = VARIANTS[i % len(VARIANTS)][0] if msg.get("variants", True) else "native"
                inputs = apply_variant(native, variant)
                t0 = time.perf_counter()
                out = self._reference_outputs(self.model, inputs)
                call_s.append(time.perf_counter() - t0)
                if variant != "native" and not _all_finite(out):
                    native_out = self._reference_outputs(self.model, native)
                    if _all_finite(native_out):  # the variant left the reference's domain
                        notes.append(f"trial {i}: the reference is not finite on {variant} inputs, so it used "
                                     "the native distribution")
                        inputs, out, variant = native, native_out, "native"
                self.expected.append(out)
                self.distributions.append(variant)
                del native, inputs
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, "reference")
        # The inputs are made again from their seeds when needed, here and in the candidate's process.
        self.sets = SeededSets(self.module, msg["seeds"], self.distributions, self.backend)
        exact_note = self._exact_outputs() if msg.get("exact", True) else "not requested"
        return {"expected": [tensor_info(o).model_dump(mode="json") for o in self.expected[0]],
                "distributions": self.distributions, "notes": notes, "exact": exact_note is None,
                "exact_note": exact_note,
                # The reference's time per call once warm (with its copies to and from the device): what a
                # candidate's hang deadline is scaled from.
                "reference_call_s": min(call_s[1:] or call_s)}

    def _exact_outputs(self) -> str | None:
        """The reference's outputs in float64 for every trial; None, or why it could not run so."""
        from .inputs import to_float64

        self.exact = []
        try:
            model64 = copy.deepcopy(self.model).double()
            for inputs in self.sets:
                self.exact.append(self._reference_outputs(model64, inputs, cast=to_float64))
        except Exception as exc:  # noqa: BLE001 - an op without a float64 kernel: fall back to fixed bounds
            self.exact = []
            return f"the reference does not run in float64 ({type(exc).__name__}: {str(exc)[:120]})"
        return None

    def _compare(self, i: int, got: list[Any], msg: dict[str, Any], devices: list[str | None] | None = None,
                 expected: list[Any] | None = None, exact: list[Any] | None = None) -> list[Any]:
        from .compare import compare_outputs

        exp = expected if expected is not None else self.expected[i]
        ex = exact if exact is not None else (self.exact[i] if i < len(self.exact) else None)
        return compare_outputs(exp, got, atol=msg.get("atol"), rtol=msg.get("rtol"),
                               expected_devices=self.expected_devices, got_devices=devices,
                               precision=msg.get("precision", "strict"), exact=ex, device=self.backend.device)

    def op_compare(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        from .output_contract import same_values

        results = torch.load(msg["outputs"], weights_only=True)
        decoys = [r for r in results if "decoy_shift" in r]
        results = [r for r in results if "decoy_shift" not in r]
        decoy = None
        for d in decoys:  # trial 0's inputs changed where a cheap probe cannot see it
            if "error" in d:
                decoy = {"correct": False, "error": d["error"], "problems": []}
                continue
            ok, problems = self._judge_on(self.sets[0], d, msg)
            decoy = {"correct": ok, "problems": problems}
        trials = []
        for i, res in enumerate(results):
            if "error" in res:
                trials.append({"error": res["error"], "checks": [], "distribution": self.distributions[i]})
                continue
            got = [_decode(o) for o in res["outputs"]]
            checks = self._compare(i, got, msg, res.get("devices"))
            trial = {"error": None, "checks": [c.model_dump(mode="json") for c in checks],
                     "distribution": self.distributions[i], "aliases": res.get("aliases", []),
                     "inputs_modified": res.get("inputs_modified", [])}
            if "repeat" in res:  # the same inputs again after poisoning memory with NaN
                again = [_decode(o) for o in res["repeat"]]
                rechecks = self._compare(i, again, msg, res.get("devices"))
                trial["repeat_identical"] = len(again) == len(got) and all(same_values(a, b) for a, b in zip(again, got))
                trial["repeat_correct"] = all(c.correct for c in rechecks)
                trial["repeat_problems"] = [p for c in rechecks for p in c.problems][:3]
            trials.append(trial)
        return {"trials": trials, "decoy": decoy}

    def op_calibrate(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Would trivial candidates pass this problem's check? Each null is judged like a candidate."""
        import torch

        nulls: dict[str, Any] = {
            "zeros": lambda i, e: [torch.zeros_like(o) if isinstance(o, torch.Tensor) else o for o in e],
            "a constant (the output's mean)": lambda i, e: [
                torch.full_like(o, float(o.double().mean())) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                for o in e],
            "the first input, unchanged": self._passthrough,
        }
        if msg.get("precision", "strict") == "strict":
            nulls["the reference computed in bfloat16"] = self._in_bfloat16
        verdicts = []
        for name, make in nulls.items():
            outcome = {"null": name, "applicable": True, "passes": True, "elementwise_passes": True}
            try:
                for i in range(len(self.sets)):
                    got = make(i, self.expected[i])
                    if got is None:
                        outcome["applicable"] = False
                        break
                    checks = self._compare(i, got, msg)
                    outcome["passes"] &= all(c.correct for c in checks)
                    outcome["elementwise_passes"] &= all(c.mismatches == 0 and not c.nan_count and not c.inf_count
                                                         and not any("shape" in p or "dtype" in p for p in c.problems)
                                                         for c in checks)
                    if not (outcome["passes"] or outcome["elementwise_passes"]):
                        break  # rejected on both counts: the other trials cannot change that
            except Exception as exc:  # noqa: BLE001 - a null the reference cannot produce is not applicable
                outcome.update(applicable=False, note=f"{type(exc).__name__}: {str(exc)[:120]}")
            if not outcome["applicable"]:
                outcome.update(passes=False, elementwise_passes=False)
            verdicts.append(outcome)
        return {"nulls": verdicts}

    def _passthrough(self, i: int, expected: list[Any]) -> list[Any] | None:
        import torch

        first = next((a for a in self.sets[i] if isinstance(a, torch.Tensor)), None)
        if first is None or len(expected) != 1 or not isinstance(expected[0], torch.Tensor) \
                or first.shape != expected[0].shape:
            return None
        return [first.to(expected[0].dtype)]

    def _in_bfloat16(self, i: int, expected: list[Any]) -> list[Any] | None:
        import torch

        if not any(isinstance(o, torch.Tensor) and o.dtype in (torch.float32, torch.float64) for o in expected):
            return None
        if getattr(self, "_model_bf16", None) is None:
            self._model_bf16 = copy.deepcopy(self.model).to(torch.bfloat16)
        cast = lambda a: a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a  # noqa: E731
        out = self._reference_outputs(self._model_bf16, self.sets[i], cast=cast)
        return [o.to(e.dtype) if isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor) else o
                for o, e in zip(out, expected)]

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

    def _judge_on(self, inputs: list[Any], item: dict[str, Any], msg: dict[str, Any]) -> tuple[bool, list[str]]:
        """Judge a candidate's saved outputs (`item["outputs"]`) against the reference run now on `inputs`,
        or, for a decoy (`item["decoy_shift"]`), on a copy of them changed as the candidate's were."""
        import torch

        from .inputs import probe_preserving_

        if "decoy_shift" in item:
            inputs = probe_preserving_([a.clone() if isinstance(a, torch.Tensor) else a for a in inputs],
                                       item["decoy_shift"])
        checks = self._compare(0, [_decode(o) for o in item["outputs"]], msg,
                               expected=self._reference_outputs(self.model, inputs), exact=[])
        return all(c.correct for c in checks), [p for c in checks for p in c.problems][:2]

    def op_revalidate(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compare outputs saved during timing with the reference on the same timing inputs."""
        import torch

        saved = torch.load(msg["outputs"], weights_only=True)
        wrong, decoy = [], None
        for item in saved:
            ok, problems = self._judge_on(self.timing_sets[item["set"]], item, msg)
            if "decoy_shift" in item:
                decoy = {"correct": ok, "problems": problems}
            elif not ok:
                wrong.append({"call": item["call"], "problems": problems})
        return {"checked": len(saved) - (decoy is not None), "wrong": wrong, "decoy": decoy}


class _NonTensor:
    """Stands in for an output that is not a plain torch.Tensor (saved as its type name)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


def _decode(saved: Any) -> Any:
    return _NonTensor(saved["__non_tensor__"]) if isinstance(saved, dict) else saved


def encode_output(out: Any) -> Any:
    """An output as the judge will read it: a CPU copy of a plain tensor, or the type's name."""
    import torch

    return out.detach().cpu().clone() if type(out) is torch.Tensor else {"__non_tensor__": type(out).__name__}

"""What both roles of a worker share (`kforge.tools.harness.judge.Judge`, `kforge.tools.harness.candidate.Candidate`):
the backend, the job's directories, the protocol channel, the harness snapshot, the output shelf and the user's
loaded module. One object, passed to the role, instead of attributes two mixins assumed of each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kforge.backends import kernel_modules

from ..models import Failure
from ..process.channel import close_all
from ..process.protocol import LoadReply, LoadRequest, ResetReply
from .handoff import OutputShelf, reserved_device_bytes, return_free_memory

__all__ = ["Session"]


@dataclass
class Session:
    backend: Any  # `kforge.backends.*`; None in a probe worker (it works without torch)
    scratch: Path
    cache_dir: Path
    precompiled_headers: bool = False
    server_builds: bool = False  # the shared cache is read-only here: the server builds (asked over `channel`)
    channel: Any = None  # the protocol's `WorkerChannel`: a build request goes to the server mid-op
    read_message: Callable[[Any], dict[str, Any] | None] | None = None  # reads the next message from `channel`
    snapshot: Any = None  # `integrity.HarnessSnapshot`, taken before user code: what the candidate must leave alone
    shelf: OutputShelf = field(init=False)  # outputs the judge reads in place (candidate role; the backend's to share)
    nonce: str | None = None  # the current op's: a mid-op message to the server carries it
    received_fds: list[int] = field(default_factory=list)  # descriptors that came with the current op's request
    trace_parts: dict[str, float] = field(default_factory=dict)  # where the current op's time went (KFORGE_TRACE)
    # The user's module (`load`): the reference in the judge, the candidate in its worker.
    module: Any = None
    user_file: Path | None = None
    extensions: list[Any] = field(default_factory=list)
    kernel_names: list[str] = field(default_factory=list)
    _reference_inputs: Any = field(default=None, init=False, repr=False)  # the reference beside the candidate

    def __post_init__(self) -> None:
        self.shelf = OutputShelf(self.backend)

    def failure(self, exc: BaseException, stage: str) -> Failure:
        """The user's exception as a located failure."""
        from .loader import python_failure

        return python_failure(exc, stage=stage, user_file=self.user_file or Path("<none>"))

    def integrity(self) -> dict[str, list[str]]:
        return {"tampering": self.snapshot.tampering(), "flags": self.snapshot.flag_changes(),
                "background": self.snapshot.background_work()}

    def inputs_module(self, reference_source: str | None) -> Any:
        """The module whose `get_inputs()` makes the problem's inputs: the judge's own reference, or in the
        candidate's process the reference's source loaded beside the candidate (inputs only: the expected
        outputs stay in the judge)."""
        if reference_source is None:
            return self.module
        if self._reference_inputs is None:
            from .loader import load_user_module

            outcome = load_user_module(reference_source, path=self.scratch / "reference_inputs.py",
                                       module_name="kforge_reference_inputs", cache_dir=self.cache_dir,
                                       backend=self.backend, precompiled_headers=False)
            if outcome.failure is not None:
                raise RuntimeError(f"the reference's get_inputs could not be loaded: {outcome.failure.message}")
            self._reference_inputs = outcome.module
        return self._reference_inputs

    def forget_job(self, role: Any, fresh: Any) -> ResetReply:
        """A kept worker forgets its job (`ResetRequest`): `role` (the Judge or Candidate serving it) takes the state of
        `fresh`, a new one of its kind (its handlers stay bound to `role`), the job's held outputs and the reference's
        `get_inputs` module go (the next job's reference may be another problem's); the loaded user module stays.
        What survives a full collection is frozen, so the next reset scans only what its job made, and cached device
        memory goes back to the GPU."""
        import gc

        if hasattr(role.sets, "drop"):
            role.sets.drop()
        self.shelf.clear()
        self._reference_inputs = None
        role.__dict__.update(fresh.__dict__)
        gc.collect()
        gc.freeze()
        return_free_memory(self.backend, 0)
        return ResetReply(reserved_bytes=reserved_device_bytes(self.backend))

    def load(self, req: LoadRequest) -> LoadReply:
        """Build and import the user's module, then check it defines what its role needs (KernelBench format)."""
        from .loader import load_user_module

        role = req.role
        self.user_file = self.scratch / f"{role}.py"
        # The header builds it wants are started by the server, sandbox or not: they end with the server (issue 17),
        # where one started here would outlive it (without a PID namespace to die with, by up to 900 s).
        pch_requests: list[list[str]] = []
        build_request = None
        if self.server_builds and self.channel is not None:  # the cache is read-only here: the server builds
            def build_request(request: dict[str, Any]) -> dict[str, Any] | None:
                self.channel.write({"build_request": request, "nonce": self.nonce})
                answer = self.read_message(self.channel) if self.read_message else None
                if answer is None:
                    raise SystemExit(0)  # the server is gone
                close_all(answer.pop("fds"))
                return answer.get("build_result")
        outcome = load_user_module(req.source, path=self.user_file, module_name=f"kforge_{role}",
                                   cache_dir=self.cache_dir, backend=self.backend,
                                   precompiled_headers=self.precompiled_headers, pch_requests=pch_requests,
                                   build_request=build_request)
        self.module, self.extensions = outcome.module, outcome.extensions
        self.kernel_names = [k.kernel for b in outcome.builds for k in b.kernels]
        if self.module is not None:  # kernels compiled at first launch are the candidate's own too (Triton's jit)
            launched = kernel_modules()
            self.kernel_names += [name for name, obj in vars(self.module).items()
                                  if type(obj).__module__.split(".")[0] in launched and callable(obj)]
        failure = outcome.failure
        if failure is None:
            failure = self._interface_failure("Model" if role == "reference" else "ModelNew",
                                              reference=(role == "reference"))
        return LoadReply(seconds=outcome.seconds, builds=outcome.builds, pch_builds=[tuple(p) for p in pch_requests],
                         kernel_names=self.kernel_names, diagnostics=outcome.diagnostics, failure=failure)

    def _interface_failure(self, wanted: str, *, reference: bool) -> Failure | None:
        import torch

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

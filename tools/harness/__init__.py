"""What runs inside a worker process only (`python -m kforge.tools.harness.worker`): the judge, the candidate's
runner, loading, inputs, comparison, integrity evidence, timing, the fork server. The server never imports it at
module level (tests/test_layering.py). Its surface is its modules; nothing is imported here.
"""

__all__ = ["bench", "candidate", "compare", "forkserver", "handoff", "inputs", "integrity", "judge",
           "loader", "output_contract", "session", "timing", "worker"]

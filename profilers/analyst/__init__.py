"""The analyst: reads a `ProfileReport` (or pasted profiler text) and says what to change first.

`load_provider("rules")` gives the built-in offline analyst; `parse_profile_text` turns pasted
torch.profiler or Nsight Compute output into a `ProfileReport`.
"""

from .base import Analysis, AnalystProvider, Bottleneck, Evidence, Recommendation, load_provider
from .rules import RulesAnalyst
from .text import parse_profile_text

__all__ = ["Analysis", "AnalystProvider", "Bottleneck", "Evidence", "Recommendation", "RulesAnalyst",
           "load_provider", "parse_profile_text"]

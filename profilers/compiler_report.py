"""The compiler's report on a candidate, as the analyst reads it.

The models and their parsers live with the build machinery that fills them
(`kforge.backends.build.compiler_report`): a build's result carries them, and backends import nothing above
them. This module is the profilers' name for them.
"""

from kforge.backends.build.compiler_report import (CANDIDATE_ARTIFACT, MATH_FUNCTIONS, MAX_LOOP_REMARKS, CompilerFacts,
                                                   CompilerReport, KernelResources, LoopRemark, RawRemark, imported_math,
                                                   loop_remarks, parse_vectorizer_remarks, widest_vector_bytes)

__all__ = ["CANDIDATE_ARTIFACT", "MATH_FUNCTIONS", "MAX_LOOP_REMARKS", "CompilerFacts", "CompilerReport",
           "KernelResources", "LoopRemark", "RawRemark", "imported_math", "loop_remarks", "parse_vectorizer_remarks",
           "widest_vector_bytes"]

"""Learn a rule from before/after examples (``adopter learn``): a structural diff of the files
finds the replaced code and the kernel call, extraction lifts the code to a pattern, and the
result is checked (it parses, its kernel exists, it rewrites each BEFORE to its AFTER) before it
is handed out. Sits after ``rewrite`` in the pipeline: it uses dsl, extract, match and rewrite."""

from .diff import LearnError, Region, find_regions
from .learner import Example, Learned, learn, reproduces

__all__ = ["Example", "LearnError", "Learned", "Region", "find_regions", "learn", "reproduces"]

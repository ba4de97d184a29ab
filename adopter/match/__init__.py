"""Matching rule patterns against extracted structure."""

from .matcher import CompiledRule, Matcher, Site

__all__ = ["CompiledRule", "Matcher", "Site"]

"""Matching rule patterns against extracted structure."""

from .matcher import BoundModule, BoundOutput, CompiledRule, Matcher, Site

__all__ = ["BoundModule", "BoundOutput", "CompiledRule", "Matcher", "Site"]

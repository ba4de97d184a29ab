"""A tiny transformers-style model package for verify's site-coverage tests (our own code)."""

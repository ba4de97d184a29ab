"""Adopter: find and patch the places in deep-learning model source where optimized kernels fit.

The package reads left to right as the pipeline: ``dsl`` (rule language), ``extract`` (static
structure extraction), ``match`` (rule matching), ``rewrite`` (source synthesis), ``verify``
(differential testing), ``bench`` (speed and memory), ``kernels`` (the fused implementations the
rewritten code calls), ``rules`` (the built-in rule sets) and ``cli``.
"""

__version__ = "0.1.0"

"""Model-library adapters: which models use a file, and how to build a small one that runs.

``verify`` and ``bench`` know no model library; each library's knowledge lives here, one adapter
per library (:mod:`adopter.models.transformers`), plus plain ``nn.Module`` factories
(:mod:`adopter.models.factories`). Importing this package imports neither torch nor a library.
"""

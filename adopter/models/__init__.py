"""Model-library adapters: which models use a file, and how to build a small one that runs.

``verify`` and ``bench`` know no model library; each library's knowledge lives here. The
transformers adapter (:mod:`adopter.models.transformers`, the interface in
:mod:`adopter.models.interface`) builds a modeling file's own classes from shrunk
configurations; the timm and diffusers adapters (:mod:`adopter.models.base` says what they
answer, :mod:`adopter.models.registry` which there are) build the library's registered models
that use a file. Plain ``nn.Module`` factories: :mod:`adopter.models.factories`. What a patched
file asks of the models - its kernel calls, the classes that reach each and the options that
guard it - is read statically in :mod:`adopter.models.sites`. Importing this package imports
neither torch nor a library.
"""

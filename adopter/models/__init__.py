"""Model libraries seen from ``verify`` and ``bench``: one adapter per library (see
:mod:`adopter.models.base` for what an adapter answers, :mod:`adopter.models.registry` for
which adapters there are). Importing this package imports no model library and no torch."""

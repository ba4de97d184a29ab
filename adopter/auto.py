"""``import adopter.auto``: patch transformers, timm and diffusers as they are imported.

Installs the import hook of :mod:`adopter.runtime` with the settings of the environment
(``ADOPTER_PACKAGES``, ``ADOPTER_RULES``, ``ADOPTER_SELECT``, ``ADOPTER_VERIFY``,
``ADOPTER_LOG``; see :func:`adopter.runtime.install_from_environment`) and patches the modules
of those packages that are imported already. ``adopter run`` does the same for a whole command.
"""

from .runtime import install_from_environment

report = install_from_environment()

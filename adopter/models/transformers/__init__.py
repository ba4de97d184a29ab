"""The transformers adapter: model classes of a modeling file, shrunk configurations, inputs.

A modeling file names everything needed: its ``PreTrainedModel`` subclasses carry
``config_class`` and ``main_input_name``, and their ``forward`` signatures say which inputs
exist. Importing this package imports neither torch nor transformers; its modules that build
models do, and run only inside verify's worker or bench's measuring process.
"""

"""TorchServe compatibility: archives (.mar), handlers run unchanged, and TorchServe's inference API.

``archive``, ``frontend`` and the front ends import neither torch nor the ``ts`` package; ``handler_model`` and ``handler``
(loaded only for a TorchServe model) need the ``torchserve`` extra.
"""

PLATFORM = "torchserve"
"""The ``platform`` of an archive's model settings, and the key under which they keep what they know
of the archive in ``parameters.extra`` (``archive.kept``)."""

"""TorchServe compatibility: archives (.mar), handlers run unchanged, and TorchServe's inference API.

``archive``, ``frontend`` and the front ends import neither torch nor the ``ts`` package; ``handler_model`` and ``handler``
(loaded only for a TorchServe model) need the ``torchserve`` extra.
"""

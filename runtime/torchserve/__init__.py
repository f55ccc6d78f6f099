"""TorchServe compatibility: archives (.mar), handlers run unchanged, and TorchServe's inference API.

``archive`` and ``rest`` import neither torch nor the ``ts`` package; ``model`` and ``handler``
(loaded only for a TorchServe model) need the ``torchserve`` extra.
"""

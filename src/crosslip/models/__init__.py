"""The classifiers that crosslip trains: the one-hidden-layer softplus network of Section
2.3 / Section 5 (:class:`SoftplusNet`, :mod:`.softplus_net`), the same network for a whole
grid of hyperparameters at once (:class:`StackedSoftplusNet`, :mod:`.stacked`), and input
gradients of any classifier (:func:`class_gradients`)."""

from .softplus_net import SoftplusNet, class_gradients
from .stacked import StackedSoftplusNet

__all__ = ["SoftplusNet", "StackedSoftplusNet", "class_gradients"]

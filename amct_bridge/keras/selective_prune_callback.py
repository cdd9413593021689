"""Keras callback keeping 2:4 selective masks applied while fine-tuning.

Example:
    >>> import keras, numpy as np
    >>> from amct_bridge.keras.selective_prune_callback import SelectivePruneCallback
    >>> x = keras.Input((8,))
    >>> m = keras.Model(x, keras.layers.Dense(2, name="fc")(x))
    >>> m.compile("sgd", "mse")
    >>> cb = SelectivePruneCallback()
    >>> _ = m.fit(np.ones((4, 8)), np.ones((4, 2)), epochs=1, verbose=0, callbacks=[cb])
    >>> int((m.get_layer("fc").kernel.numpy() != 0).sum())
    8
"""

from __future__ import annotations

import keras
import numpy as np

from amct_bridge.keras.prune import apply_selective_masks, selective_masks


class SelectivePruneCallback(keras.callbacks.Callback):
    """Re-applies 2:4 masks after every training batch so pruned weights stay zero.

    Args:
        masks: dict record key -> bool mask (kernel shape). Default None: computed from the
            weight magnitudes when training begins (Conv2D, Dense, Conv2DTranspose; see
            ``amct_bridge.graph.selective``).
        update_freq: int, default 0. If > 0, masks are recomputed from the current weights
            every ``update_freq`` batches (AMCT's ``l1_selective_prune.update_freq``); 0 keeps
            the first masks.

    Example:
        >>> cb = SelectivePruneCallback(update_freq=0)
        >>> cb.masks is None
        True
    """

    def __init__(self, masks: dict[str, np.ndarray] | None = None, update_freq: int = 0) -> None:
        super().__init__()
        if update_freq < 0:
            raise ValueError(f"update_freq must be >= 0, got {update_freq}")
        self.masks = masks
        self.update_freq = update_freq
        self._batches = 0

    def on_train_begin(self, logs=None) -> None:
        if self.masks is None:
            self.masks = selective_masks(self.model)
        apply_selective_masks(self.model, self.masks)

    def on_train_batch_end(self, batch, logs=None) -> None:
        self._batches += 1
        if self.update_freq and self._batches % self.update_freq == 0:
            self.masks = selective_masks(self.model)
        apply_selective_masks(self.model, self.masks)

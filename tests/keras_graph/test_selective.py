"""Pattern 21: 2:4 selective pruning on Keras models (eligibility, masks, callback, record)."""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

from amct_bridge.graph.groups import Discovery
from amct_bridge.graph.selective import selective_candidates, unpack_mask
from amct_bridge.keras.graph import extract_graph
from amct_bridge.keras.prune import apply_selective_masks, prune_record, selective_masks
from amct_bridge.keras.selective_prune_callback import SelectivePruneCallback
from amct_bridge.records import dumps, loads


def brute_force_mask(kernel: np.ndarray, in_axis: int) -> np.ndarray:
    """Loop reference: in each run of 4 input channels keep the 2 largest |w| (first on ties)."""
    k = np.moveaxis(np.abs(kernel), in_axis, -1)
    keep = np.zeros(k.shape, dtype=bool)
    for idx in np.ndindex(k.shape[:-1]):
        for start in range(0, k.shape[-1], 4):
            run = list(k[idx][start : start + 4])
            ranked = sorted(range(len(run)), key=lambda i: (-run[i], i))
            for i in ranked[:2]:
                keep[idx + (start + i,)] = True
    return np.moveaxis(keep, -1, in_axis)


def mixed_model() -> keras.Model:
    x = keras.Input((6, 6, 3))
    y = layers.Conv2D(8, 3, name="first")(x)  # Cin = 3: one short run of 3
    y = layers.DepthwiseConv2D(3, name="dw")(y)
    y = layers.Conv2D(8, 1, groups=2, name="grouped")(y)
    shared = layers.Conv2D(8, 1, name="shared")
    y = shared(shared(y))
    y = layers.Conv2DTranspose(6, 3, name="tr")(y)
    y = layers.SeparableConv2D(4, 1, name="sep")(y)
    y = layers.Dense(10, name="fc")(layers.Flatten()(y))
    return keras.Model(x, y)


def test_eligible_layers_and_refusals():
    eligible, refused = selective_candidates(extract_graph(mixed_model()))
    assert [n.layer for n in eligible] == ["first", "tr", "fc"]
    assert {r.layer: r.reason.value for r in refused} == {
        "dw": "DEPTHWISE_CONV",
        "grouped": "GROUPED_CONV",
        "shared": "SHARED_LAYER",
        "sep": "NOT_ELIGIBLE",
    }


def test_a_depthwise_conv_is_refused_as_depthwise_not_grouped():
    """Issue 33 §7: a Conv2D with groups == its input channels is a depthwise convolution (each
    output reads one input channel); it was refused for 2:4 as GROUPED_CONV, which is kept for
    1 < groups < channels. The prune-groups table says the same."""
    from amct_bridge.graph.report import format_table

    x = keras.Input((6, 6, 4))
    y = layers.Conv2D(8, 1, name="c1")(x)
    y = layers.Conv2D(8, 3, groups=8, name="dwg")(y)  # groups == Cin: depthwise
    y = layers.Conv2D(8, 1, groups=2, name="g2")(y)  # grouped
    y = layers.DepthwiseConv2D(1, name="dw")(y)
    model = keras.Model(x, layers.Conv2D(4, 1, name="c3")(y))
    # independent: the kernel of "dwg" has one input channel per output channel
    assert model.get_layer("dwg").kernel.shape == (3, 3, 1, 8)
    graph = extract_graph(model)
    _, refused = selective_candidates(graph)
    reasons = {r.layer: r.reason.value for r in refused}
    assert reasons == {"dwg": "DEPTHWISE_CONV", "g2": "GROUPED_CONV", "dw": "DEPTHWISE_CONV"}
    table = format_table(Discovery(), selective_candidates(graph))
    assert "dwg  Conv2D           DEPTHWISE_CONV" in table, table


def test_masks_match_brute_force_for_every_layout():
    model = mixed_model()
    keras.utils.set_random_seed(0)
    masks = selective_masks(model)
    axes = {"first": 2, "tr": 3, "fc": 0}
    for key, axis in axes.items():
        kernel = model.get_layer(key).kernel.numpy()
        assert masks[key].shape == kernel.shape
        np.testing.assert_array_equal(masks[key], brute_force_mask(kernel, axis))
    # a full run of 4 keeps exactly 2; the Cin=3 conv keeps 2 of 3 per position
    assert masks["fc"].sum() == masks["fc"].size // 2
    assert masks["first"].sum() == 3 * 3 * 8 * 2


def test_apply_zeroes_exactly_the_pruned_weights():
    model = mixed_model()
    before = model.get_layer("tr").kernel.numpy().copy()
    masks = selective_masks(model)
    apply_selective_masks(model, masks)
    after = model.get_layer("tr").kernel.numpy()
    np.testing.assert_array_equal(after, np.where(masks["tr"], before, 0.0))


def test_callback_keeps_masks_applied_during_fine_tuning():
    x = keras.Input((8,))
    model = keras.Model(x, layers.Dense(4, name="fc")(layers.Dense(8, name="h")(x)))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    cb = SelectivePruneCallback()
    data = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    model.fit(data, data[:, :4], epochs=2, batch_size=8, verbose=0, callbacks=[cb])
    for key in ("h", "fc"):
        kernel = model.get_layer(key).kernel.numpy()
        assert not kernel[~cb.masks[key]].any()  # pruned weights stayed zero
        assert kernel[cb.masks[key]].all()  # kept weights still train (non-zero)


def test_selective_record_round_trips_with_packed_mask():
    model = mixed_model()
    masks = selective_masks(model)
    record = prune_record(model, channel=False, selective=True, masks=masks)
    text = dumps(record)
    assert 'name: "mask_shape"' in text and "selective_mask" in text
    back = loads(text)
    nodes = {r.selective_prune.name: r.selective_prune for r in back.prune_records}
    assert nodes["first"].get("mask_shape") == [3, 3, 3, 8]
    assert nodes["tr"].get("mask_shape") == [3, 3, 6, 8]
    for key, node in nodes.items():
        shape = tuple(node.get("mask_shape"))
        np.testing.assert_array_equal(unpack_mask(node.get("selective_mask"), shape), masks[key])


def test_callback_update_freq_recomputes_masks_from_current_weights():
    x = keras.Input((8,))
    model = keras.Model(x, layers.Dense(4, name="fc")(x))
    model.compile(keras.optimizers.SGD(0.5), "mse")
    fixed = {"fc": np.zeros((8, 4), dtype=bool)}
    fixed["fc"][:2] = fixed["fc"][4:6] = True
    cb = SelectivePruneCallback(masks=fixed, update_freq=1)
    data = np.random.default_rng(1).normal(size=(8, 8)).astype("float32")
    model.fit(data, data[:, :4], epochs=1, batch_size=4, verbose=0, callbacks=[cb])
    kernel = model.get_layer("fc").kernel.numpy()
    # the last masks came from the trained weights: they are the 2:4 mask of what survived
    np.testing.assert_array_equal(cb.masks["fc"], brute_force_mask(kernel, 0))
    assert cb.masks["fc"].sum() == 16 and not kernel[~cb.masks["fc"]].any()
    assert cb.masks["fc"] is not fixed["fc"]

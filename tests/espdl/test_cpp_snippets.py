"""export.json's C++ snippets are the generated model class's constructor calls (issue 23 §6).

A user pastes export.json's ``cpp`` lines into a hand-written model class: they must be what the
generated class writes (``dl::layer::`` and ``dl::PADDING_*`` qualified, no ``using namespace``
needed), which is checked by reading both files independently.
"""

from __future__ import annotations

import json
import re

import keras
import numpy as np
from espdl_stats import layer_activations, sidecar_from

from amct_bridge.keras import export_espdl

L = keras.layers


def test_export_json_snippets_qualify_padding_as_the_model_class(tmp_path):
    keras.utils.set_random_seed(0)
    x = keras.Input((9, 9, 3), name="img")
    a = L.Conv2D(4, 3, padding="same", activation="relu", name="c1")(x)
    a = L.MaxPooling2D(2, padding="same", name="mp")(a)
    a = L.AveragePooling2D(1, name="ap")(a)  # 1x1: no border
    a = L.DepthwiseConv2D(3, name="dw")(a)
    a = L.Flatten(name="f")(a)
    model = keras.Model(x, L.Dense(3, name="fc")(a))
    data = np.random.default_rng(0).uniform(-1, 1, (4, 9, 9, 3)).astype("float32")
    out = tmp_path / "espdl"
    export_espdl(
        model, None, out, stats=sidecar_from(layer_activations(model, data)), cpp="net_coefficient"
    )
    report = json.loads((out / "export.json").read_text())
    snippets = {x["name"]: x["cpp"] for x in report["layers"] + report["runtime_layers"]}
    hpp = (out / "net_model.hpp").read_text()
    paddings = 0
    for name, cpp in snippets.items():
        assert not re.search(r"(?<!dl::)PADDING_", cpp), cpp
        paddings += cpp.count("dl::PADDING_")
        # the model class's initializer of the member: the same arguments (its getters are
        # qualified by the coefficient namespace)
        m = re.search(rf"\b{name}\((.*)\)(?:,| \{{\}})$", hpp, re.M)
        assert m is not None, name
        args = cpp[cpp.index(">(") + 2 : -1]
        assert m[1] == re.sub(r"\bget_", "net_coefficient::get_", args), name
    assert paddings == 4  # c1, mp, ap, dw

"""Run by test_distributed.py in a fresh process: TF must see 2 logical CPUs before it starts.

Calibrates the same model, same data, once under MirroredStrategy (2 replicas) and once on one
device, for each algorithm given on the command line, and prints both records as JSON.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import numpy as np  # noqa: E402
from calib_models import branchy_model  # noqa: E402

from amct_bridge.keras import QuantCalibration  # noqa: E402
from amct_bridge.records import load  # noqa: E402


def calibrate(model, x, algorithm, out):
    path = os.path.join(out, f"{algorithm}-{id(model)}.txt")
    model.predict(
        x, batch_size=16, verbose=0, callbacks=[QuantCalibration(path, algorithm=algorithm)]
    )
    record = load(path)
    return {k: [f.scale_d, f.offset_d, f.scale_w] for k, f in record.layers.items()}


def main():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mirrored = branchy_model()
    single = branchy_model()
    single.set_weights(mirrored.get_weights())
    x = np.random.default_rng(5).normal(size=(64, 10, 10, 4)).astype("float32")
    x[12, 3, 3, 1] = 9.0  # second half of batch 0: only replica 1 sees it
    result = {"replicas": strategy.num_replicas_in_sync}
    with tempfile.TemporaryDirectory() as out:
        for algorithm in sys.argv[1:]:
            result[algorithm] = {
                "mirrored": calibrate(mirrored, x, algorithm, out),
                "single": calibrate(single, x, algorithm, out),
            }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()

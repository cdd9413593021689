"""Run by test_distributed.py as one of two worker processes of a MultiWorkerMirroredStrategy
cluster on localhost (``TF_CONFIG`` set by the test).

Each worker predicts on its own array (a dataset per worker) with a ``QuantCalibration`` that writes
``<out>/<algorithm>-worker<task>.txt``, then calibrates the same weights on the same array without
a strategy, and prints both records as JSON: a worker's record describes its own replicas' batches.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from calib_models import sequential_model  # noqa: E402

from amct_bridge.keras import QuantCalibration  # noqa: E402
from amct_bridge.records import load  # noqa: E402


def main():
    out, algorithms = sys.argv[1], sys.argv[2:]
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = sequential_model()  # same seed: same weights on both workers
        model.compile(loss="mse")
    x = np.random.default_rng(task).normal(size=(32, 12, 12, 3)).astype("float32")
    x[3, 0, 0, 0] = 5.0 + task  # each shard has its own extreme
    # each worker's one replica reads its own array, whole: per-worker records are comparable
    data = strategy.distribute_datasets_from_function(
        lambda context: tf.data.Dataset.from_tensor_slices(x).batch(8)
    )
    result = {"task": task, "workers": strategy.num_replicas_in_sync}
    for algorithm in algorithms:
        path = os.path.join(out, f"{algorithm}-worker{task}.txt")
        model.predict(data, verbose=0, callbacks=[QuantCalibration(path, algorithm=algorithm)])
        single = sequential_model()
        single.set_weights(model.get_weights())
        ref = os.path.join(out, f"{algorithm}-single{task}.txt")
        single.predict(
            x, batch_size=8, verbose=0, callbacks=[QuantCalibration(ref, algorithm=algorithm)]
        )
        result[algorithm] = {
            name: {k: [f.scale_d, f.offset_d, f.scale_w] for k, f in load(p).layers.items()}
            for name, p in (("worker", path), ("single", ref))
        }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()

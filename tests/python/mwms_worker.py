"""One worker of test_mwms.py: tf.distribute.MultiWorkerMirroredStrategy
over TF_CONFIG's cluster (set by the test), fed by ferry.tf.dataset, whose
Ferry rank also comes from TF_CONFIG (worker i is rank i). Each worker
feeds its own rank's batches (distribute_datasets_from_function, no
auto-sharding: Ferry already split the records) to a small Keras model
(Dense over the flattened 8x8x3 images rescaled to [0, 1]) trained for
two epochs of steps_per_epoch steps, the dataset's cardinality.

The training loop is strategy.run with a GradientTape, not model.fit:
Keras 3 (3.15, TensorFlow 2.20) model.fit under MultiWorkerMirroredStrategy
fails reducing its scalar logs ("Invalid reduction dimension 0 for input
with 0 dimensions", tensorflow/tensorflow#72388), and before that it
takes one batch from a first iterator and makes a second one
(_maybe_symbolic_build then epoch_iterator.reset()), which for a Ferry
dataset is a second client of the same rank.

Writes OUT (JSON):
  {"task": i, "rank": ferry rank (TF_CONFIG), "cardinality": c,
   "steps_per_epoch": S, "pipeline": [id, n],
   "epochs": [{"steps": n, "ferry_epochs": [...], "sizes": [...],
               "ids": [...], "loss": mean}], "losses": [per step],
   "exhausted": true, "seconds": t}
or {"error": traceback} (exit status 1); appends one line per batch
taken from Ferry to PROGRESS, which the test watches to place its fault.
"""
import argparse
import json
import os
import sys
import time
import traceback


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dispatcher", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--image", default="8x8x3")
    ap.add_argument("--out", required=True)
    ap.add_argument("--progress", required=True)
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--collective-timeout", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1,
                    help="the model's initial weights")
    a = ap.parse_args()

    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    res = {"task": task, "pid": os.getpid()}
    t0 = time.monotonic()
    try:
        train(a, res)
    except BaseException:
        res["error"] = traceback.format_exc()
    res["seconds"] = round(time.monotonic() - t0, 3)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, a.out)
    # os._exit: TensorFlow's collective and gRPC threads can hold a normal
    # interpreter exit after a failed peer.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if "error" in res else 0)


def train(a, res):
    import ferry
    import ferry.tf
    import tensorflow as tf

    found = ferry.launcher_rank()
    res["rank"], res["world_size"] = (found[0], found[1]) if found else (
        None, None)
    h, w, c = (int(x) for x in a.image.split("x"))
    features = h * w * c

    comm = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=a.collective_timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=comm)
    res["replicas"] = strategy.num_replicas_in_sync

    def dataset_fn(ctx):
        res["pipeline"] = [ctx.input_pipeline_id, ctx.num_input_pipelines]
        # No rank or world_size: ferry.Client takes them from TF_CONFIG.
        ds = ferry.tf.dataset(dispatcher=a.dispatcher, spec=a.spec,
                              job_name=a.job, batch_size=a.batch_size,
                              drop_remainder=True, epochs=a.epochs,
                              timeout=a.timeout)
        res["cardinality"] = int(ds.cardinality())
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)

        def parts(*elem):
            e = elem[0] if len(elem) == 1 else elem
            if isinstance(e, dict):
                x, y, ids, ep = e["images"], e["labels"], e["ids"], e["epoch"]
            else:
                x, y, ids, ep = e[0], e[1], e[2], e[3]
            # One PROGRESS line per batch tf.data takes from Ferry (ahead
            # of the training steps, by its prefetch).
            token = tf.py_function(pulled, [ids], tf.int64)
            with tf.control_dependencies([token]):
                x = tf.reshape(tf.cast(x, tf.float32) / 255.0,
                               [-1, features])
            return x, y, ids, ep

        return ds.with_options(opts).map(parts)

    prog = open(a.progress, "a")

    def pulled(ids):
        prog.write("%d\n" % int(tf.size(ids)))
        prog.flush()
        return tf.constant(0, tf.int64)

    dist = strategy.distribute_datasets_from_function(
        dataset_fn, tf.distribute.InputOptions(
            experimental_fetch_to_device=False))
    card = res["cardinality"]
    if card < 0:
        raise RuntimeError("ferry.tf.dataset's cardinality is %s (unknown "
                           "or infinite) for a ranked job" % card)
    # ferry.tf.dataset asserts steps_per_epoch x epochs: the whole run.
    if card % a.epochs:
        raise RuntimeError("ferry.tf.dataset's cardinality %d is not a "
                           "multiple of %d epochs" % (card, a.epochs))
    steps = card // a.epochs
    res["steps_per_epoch"] = steps

    tf.keras.utils.set_random_seed(a.seed)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((features,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(a.classes)])
        opt = tf.keras.optimizers.Adam(0.02)
        loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none")
    global_batch = a.batch_size * strategy.num_replicas_in_sync

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per = loss_obj(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per,
                                              global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(x, y):
        per_replica = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None)

    it = iter(dist)
    res["epochs"] = []
    res["losses"] = []
    with prog:
        for _ in range(a.epochs):
            ep = {"steps": 0, "ferry_epochs": [], "sizes": [], "ids": []}
            total = 0.0
            for _ in range(steps):
                x, y, ids, fe = next(it)
                loss = float(train_step(x, y))
                for t in strategy.experimental_local_results(ids):
                    idl = [int(i) for i in t.numpy()]
                    ep["ids"].extend(idl)
                    ep["sizes"].append(len(idl))
                for t in strategy.experimental_local_results(fe):
                    ep["ferry_epochs"].append(int(t.numpy()))
                ep["steps"] += 1
                total += loss
                res["losses"].append(loss)
                if a.sleep_ms:
                    time.sleep(a.sleep_ms / 1000.0)
            ep["loss"] = total / max(ep["steps"], 1)
            res["epochs"].append(ep)
        # Nothing left: the rank's dataset ends with the job's last epoch
        # (both workers ask, so the check's collective agrees).
        res["exhausted"] = not bool(it.get_next_as_optional().has_value())


if __name__ == "__main__":
    main()

"""One rank of test_resume.py, started by torchrun with --max_restarts 1:
DistributedDataParallel (gloo) over a ranked Ferry job in deterministic
order, checkpointing every --every steps: rank 0 writes OUT/ckpt.pt with
torch.save({"step", "model", "optimizer", "data": ds.state_dict()}) and
every rank waits for it (a barrier). A rank started again by torchrun
(TORCHELASTIC_RESTART_COUNT > 0) loads the checkpoint, the model and
ds.load_state_dict(), and goes on from there.

Every batch appends "STEP EPOCH NUM_REAL SHA256 IDS" (the sha of the
images' and ids' bytes; IDS the real records' ids, comma-separated) to
OUT/digests.RANK.ATTEMPT and the step to
OUT/progress.RANK (which the test watches to place its fault); the
process writes its pid to OUT/pid.RANK first. Exit status 0 once the
job's epochs are over; an exception's traceback goes to stderr (1).

Usage: resume_rank.py --dispatcher ADDR --pattern GLOB --job NAME
                      --out DIR [--every K] [--sleep-ms MS]
"""
import argparse
import hashlib
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dispatcher", required=True)
    ap.add_argument("--pattern", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ferry.torch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(a.out, "pid.%d" % rank), "w") as f:
        f.write("%d\n" % os.getpid())
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8 * 8 * 3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = ferry.torch.IterableDataset(
        a.dispatcher,
        'tfrecord("%s") | decode(raw, 8, 8, 3)' % a.pattern,
        job_name=a.job, batch_size=8, epochs=2, shuffle=True, seed=5,
        order="deterministic", timeout=60, num_real=True)
    ckpt = os.path.join(a.out, "ckpt.pt")
    step = 0
    if attempt > 0 and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        ds.load_state_dict(state["data"])
        step = state["step"]
    digests = open(os.path.join(a.out, "digests.%d.%d" % (rank, attempt)),
                   "a")
    progress = open(os.path.join(a.out, "progress.%d" % rank), "a")
    while True:
        got = 0
        for images, labels, ids, epoch, num_real in ds:
            got += 1
            sha = hashlib.sha256(images.numpy().tobytes() +
                                 ids.numpy().tobytes()).hexdigest()
            x = images.float().reshape(len(images), -1) / 255.0
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()  # DDP's all-reduce: the ranks in lockstep
            opt.step()
            step += 1
            real = ",".join(str(i) for i in ids[:num_real].tolist())
            digests.write("%d %d %d %s %s\n" % (step, int(epoch), num_real,
                                                sha, real or "-"))
            digests.flush()
            progress.write("%d\n" % step)
            progress.flush()
            if step % a.every == 0:
                if rank == 0:
                    torch.save({"step": step, "model": model.state_dict(),
                                "optimizer": opt.state_dict(),
                                "data": ds.state_dict()}, ckpt + ".tmp")
                    os.replace(ckpt + ".tmp", ckpt)
                dist.barrier()
            if a.sleep_ms:
                time.sleep(a.sleep_ms / 1000.0)
        if got == 0:
            break
    ds.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

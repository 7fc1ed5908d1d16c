"""The README's Python loop, run as written: the code block under
"## Python trainers" is executed against a local cluster with only the
dispatcher address, the file pattern and train_step substituted."""
import os
import re

import ferrytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def readme_loop():
    text = open(README, encoding="utf-8").read()
    section = text.split("## Python trainers", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "README's Python trainers section: %d blocks" % len(blocks)
    return blocks[0]


def test_readme_loop_runs_as_written(tmp_path, make_cluster):
    torch = ferrytest.torch_or_skip()
    data = ferrytest.Dataset(str(tmp_path / "data"), 2, 600, size=(32, 32))
    cluster = make_cluster(workers=1)
    code = readme_loop()
    for old, new in (('"10.0.0.1:5050"', repr(cluster.addr)),
                     ('"/data/train-*.tfrecord"', '"%s"' % data.pattern)):
        assert old in code, "README loop no longer contains %s" % old
        code = code.replace(old, new)
    seen = []

    def train_step(x, y):
        assert x.dtype == torch.float32 and tuple(x.shape[1:]) == (3, 32, 32)
        assert y.dtype == torch.int64 and y.shape[0] == x.shape[0]
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
        seen.append(x.shape[0])

    code = code.replace("epochs=10", "epochs=2")
    exec(compile(code, "<README.md's Python loop>", "exec"), {"train_step": train_step})
    assert sum(seen) == 2 * len(data), seen


def test_readme_ddp_loop_is_the_one_test_ddp_runs():
    """README's data-parallel loop is docs/PYTHON.md's, which
    test_ddp.py runs under torchrun."""
    def first_block(path, heading):
        text = open(path, encoding="utf-8").read()
        assert heading in text, "%s has no %r" % (path, heading)
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        blocks = re.findall(r"```python\n(.*?)```", section, re.S)
        assert blocks, "%s: no python block under %r" % (path, heading)
        return blocks[0]
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                       "PYTHON.md")
    assert (first_block(README, "## Data-parallel trainers") ==
            first_block(doc, "## Data-parallel training (ranks)"))

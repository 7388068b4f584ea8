#!/usr/bin/env python3
"""make_idx.py DIR TRAIN_COUNT TEST_COUNT TEST_ROWS TEST_COLS: a small Fashion-MNIST-shaped data
set in DIR (gzip IDX files as Debian's dataset-fashion-mnist ships them): TRAIN_COUNT random
28x28 training images, TEST_COUNT random TEST_ROWS x TEST_COLS test images, labels 0-9."""
import gzip
import random
import struct
import sys

out, n_train, n_test, rows, cols = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(7)


def write(prefix, count, r, c):
    with gzip.open(f"{out}/{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, count, r, c))
        f.write(bytes(rng.randrange(256) for _ in range(count * r * c)))
    with gzip.open(f"{out}/{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 0x801, count))
        f.write(bytes(rng.randrange(10) for _ in range(count)))


write("train", n_train, 28, 28)
write("t10k", n_test, rows, cols)

#!/usr/bin/env python3
"""Interop test (CTest label interop): hone's Megatron .bin/.idx pairs against megatron-core.

    megatron_interop.py <megatron_interop_helper> <work dir>

1. hone writes a uint16 corpus with documents; megatron-core's own IndexedDataset reads it and
   finds the same sequences and document indices (and the .idx bytes equal what megatron-core's
   _IndexWriter writes for the same lengths).
2. megatron-core's IndexedDatasetBuilder writes an int32 corpus; hone reads it (helper dump) and
   finds the same.
Without megatron-core (it needs torch), both directions are checked against the published layout
with numpy (an independent reader and writer written here from the documented format). The first
line printed says which one ran. Exits 77 (CTest: skipped) without numpy.
"""
import os
import struct
import subprocess
import sys

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"HONE_SKIPPED: {e}; install numpy (scripts/deps.sh)")
    sys.exit(77)

try:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    import megatron.core
    PEER = "megatron-core " + getattr(megatron.core, "__version__", "?")
except Exception as e:  # ImportError, or torch failing to load
    PEER = None
    WHY = str(e)


def corpus():
    """The Python twin of megatron_interop_helper.cpp's write()."""
    seqs, docs, j = [], [0], 0
    for k in range(40):
        for _ in range(k % 3 + 1):
            seqs.append([(j * 7 + t) % 65536 for t in range((j * 13) % 50)])
            j += 1
        docs.append(len(seqs))
    return seqs, docs


def numpy_read(prefix):
    """A reader of the published layout (independent of hone and of megatron-core)."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "magic"
    (version,) = struct.unpack_from("<Q", idx, 9)
    assert version == 1
    code = idx[17]
    dtype = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
             7: np.float32, 8: np.uint16}[code]
    n, d = struct.unpack_from("<QQ", idx, 18)
    lengths = np.frombuffer(idx, np.int32, n, 34)
    pointers = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    docs = np.frombuffer(idx, np.int64, d, 34 + 12 * n)
    assert len(idx) == 34 + 12 * n + 8 * d, "size"
    binary = np.memmap(prefix + ".bin", dtype=np.uint8, mode="r")
    seqs = [np.frombuffer(binary, dtype, int(lengths[i]), int(pointers[i])).tolist()
            for i in range(n)]
    return seqs, docs.tolist()


def numpy_write(prefix, seqs, docs, dtype, code):
    """A writer of the published layout, as megatron-core's _IndexWriter writes it."""
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            f.write(np.array(s, dtype=dtype).tobytes())
    lengths = [len(s) for s in seqs]
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * np.dtype(dtype).itemsize
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<QQ", len(seqs), len(docs)))
        f.write(np.array(lengths, np.int32).tobytes())
        f.write(np.array(pointers, np.int64).tobytes())
        f.write(np.array(docs, np.int64).tobytes())


def hone_dump(helper, prefix):
    out = subprocess.run([helper, "dump", prefix], check=True, capture_output=True, text=True)
    lines = out.stdout.split("\n")
    docs = [int(x) for x in lines[0].split()[1:]]
    seqs = [[int(x) for x in line.split()] for line in lines[1:-1]]
    return seqs, docs


def main():
    helper, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    print("checked with " + (PEER or f"numpy against the published layout (no megatron-core: {WHY})"))
    want_seqs, want_docs = corpus()

    # 1. hone writes, the peer reads.
    a = os.path.join(work, "hone_written")
    subprocess.run([helper, "write", a], check=True)
    if PEER:
        ds = IndexedDataset(a, mmap=True)
        got_seqs = [ds[i].tolist() for i in range(len(ds))]
        got_docs = ds.document_indices.tolist()
        assert ds[0].dtype == np.uint16, ds[0].dtype
        # The .idx bytes equal megatron-core's own writer for the same lengths and documents.
        b2 = os.path.join(work, "peer_rewritten")
        builder = IndexedDatasetBuilder(b2 + ".bin", dtype=np.uint16)
        start = 0
        for end in want_docs[1:]:
            for s in want_seqs[start:end]:
                builder.add_item(torch.tensor(s, dtype=torch.int64))
            builder.end_document()
            start = end
        builder.finalize(b2 + ".idx")
        for ext in (".idx", ".bin"):
            assert open(a + ext, "rb").read() == open(b2 + ext, "rb").read(), "bytes of " + ext
    else:
        got_seqs, got_docs = numpy_read(a)
    assert got_seqs == want_seqs, "sequences of the hone-written pair"
    assert got_docs == want_docs, f"document indices {got_docs} != {want_docs}"

    # 2. the peer writes int32, hone reads.
    b = os.path.join(work, "peer_written")
    seqs = [[(i * 1000003 + t) % 2**31 - 2**30 for t in range(i % 17)] for i in range(57)]
    docs = [0, 5, 5, 20, 56, 57]
    if PEER:
        builder = IndexedDatasetBuilder(b + ".bin", dtype=np.int32)
        start = 0
        for end in docs[1:]:
            for s in seqs[start:end]:
                builder.add_item(torch.tensor(s, dtype=torch.int64))
            builder.end_document()
            start = end
        builder.finalize(b + ".idx")
    else:
        numpy_write(b, seqs, docs, np.int32, 4)
    got_seqs, got_docs = hone_dump(helper, b)
    assert got_seqs == seqs, "sequences of the peer-written pair"
    assert got_docs == docs, f"document indices {got_docs} != {docs}"
    print("ok: " + str(len(want_seqs)) + " + " + str(len(seqs)) + " sequences agree")


if __name__ == "__main__":
    main()

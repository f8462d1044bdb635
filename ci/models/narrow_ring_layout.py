"""The narrow kernels' gather (produce() and RingValidity, kernels/sm90/narrow/ring.cuh) in Python: which
landing-tile bytes each producer lane's cp.async copies write, and which validity bit each consumer
thread tests. Checks that every 16-byte chunk of a tile's 64 rows is written once, where sw64_chunk
puts it (ldmatrix reads it there), and that each consumer thread's bits (heads_as_m.cuh's S slots,
heads_as_n.cuh's S^T rows) are its own slots' validity, at d_qk 512 and 576.
`python3 ci/models/narrow_ring_layout.py`"""
import random

from transpose_banks import sw64_chunk

SLOTS, PRODUCER_WARPS = 64, 2  # kSlotsPerTile, kProducerWarps
ROW_SETS = SLOTS // 8 // PRODUCER_WARPS  # kRowSets
ATOM_COLUMN_BYTES = SLOTS * 64  # kE4m3AtomColumnBytes


def lane_row(pw, lane, k):
    """produce(): lane / 4 + 8 (kProducerWarps k + pw)"""
    return lane // 4 + 8 * (PRODUCER_WARPS * k + pw)


def copies(d):
    """(landing offset, (row, chunk)) of every 16-byte copy of a tile: cp_async_row_share from
    landing0 = sw64_chunk(row0, part), plus 8 kProducerWarps k rows, one atom column a chunk"""
    out = []
    for pw in range(PRODUCER_WARPS):
        for lane in range(32):
            part = lane % 4
            landing0 = sw64_chunk(lane_row(pw, lane, 0), part, SLOTS)
            for k in range(ROW_SETS):
                dst = landing0 + 8 * PRODUCER_WARPS * k * 64
                for m in range(d // 64):
                    out.append((dst + m * ATOM_COLUMN_BYTES, (lane_row(pw, lane, k), part + 4 * m)))
    return out


for d in (512, 576):
    written = copies(d)
    assert len({dst for dst, _ in written}) == len(written) == SLOTS * d // 16, "every chunk once"
    assert all(dst == sw64_chunk(row, c, SLOTS) for dst, (row, c) in written), "where sw64_chunk puts it"

rng = random.Random(0)
for _ in range(100):
    valid = [int(rng.random() < 0.7) for _ in range(SLOTS)]
    # words[buffer][k][pw]: each producer warp's ballot, bit l for lane l's row
    words = [sum(valid[lane_row(pw, lane, k)] << lane for lane in range(32))
             for k in range(ROW_SETS) for pw in range(PRODUCER_WARPS)]
    for q in range(4):
        x, y = words[PRODUCER_WARPS * q], words[PRODUCER_WARPS * q + 1]  # RingValidity::rows(b, q)
        for lane in range(32):
            gid, tig = lane // 4, lane % 4
            # heads as M: slots 16 q + 8 j + 2 tig + e % 2 at bit 4 (e % 2) of (.x, .y)[j] >> 8 tig
            for j, word in enumerate((x, y)):
                for e in range(2):
                    assert (word >> 8 * tig >> 4 * e & 1) == valid[16 * q + 8 * j + 2 * tig + e]
            # heads as N: slots 16 q + gid + 8 r at bit 4 gid of (.x, .y)[r]
            assert (x >> 4 * gid & 1) == valid[16 * q + gid] and (y >> 4 * gid & 1) == valid[16 * q + gid + 8]
print("8 rows x 64 bytes a warp copy: every chunk once where ldmatrix reads it; the validity bits decode "
      "to each consumer thread's slots")

"""transpose_v_half (kernels/sm90/work.cuh) in Python: ldmatrix.trans, byte permutes and stmatrix as PTX
defines them, which landing byte each V^T byte receives, and how many shared-memory wavefronts each
warp-wide ldmatrix and stmatrix matrix takes (32 banks of 4 bytes; a matrix takes as many wavefronts as
its most used bank has distinct words). Checks that it writes the transposition (V^T (column n, K
position k) = the landing row of slot p_slot(k), byte n) with one wavefront a matrix.
`python3 ci/models/transpose_banks.py`"""
from collections import defaultdict

D_V, THREADS, WARPS = 512, 128, 4
CHUNKS = D_V // 16  # 16-byte chunks of a row of V


def p_slot(k):
    return 16 * (k // 16) + 2 * (k % 16 // 4) + k % 2 + 8 * (k % 4 // 2)


def sw64_chunk(row, c, rows):
    return (c // 4) * (rows * 64) + row * 64 + (((c % 4) ^ ((row // 2) % 4)) * 16)


def vt_offset(n, k):
    """VtTile: 32-byte rows of K, GMMA's 32-byte swizzle (address bit 4 ^= bit 7)."""
    o = 32 * n + k
    return o ^ (((o >> 7) & 1) << 4)


def byte_perm(x, y, selector):
    both = x + y
    return [both[(selector >> (4 * i)) & 7] for i in range(4)]


# the kernel's lane arithmetic (work.cuh), lane l of a warp
def load_row(l):
    """ldmatrix: the K position of the landing row whose address lane l gives."""
    m, rho = l // 8, l % 8
    return 16 * (m // 2) + 4 * (rho // 2) + 2 * (m % 2) + rho % 2


def store_row(l):
    """stmatrix: the V^T row (within the chunk's 16) and K half whose address lane l gives."""
    m, i = l // 8, l % 8
    return 2 * i + ((i // 4) ^ (m % 2)), 16 * (m // 2)


def selectors(l):
    """the byte permutes of lane l: its matrices 0 and 2 take V^T row 2 (l / 4) + (l / 16), 1 and 3 the other"""
    even, odd = 0x6420, 0x7531
    return (odd, even) if (l // 16) % 2 else (even, odd)


def transpose(rows, row0):
    """The V^T bytes written (offset -> landing offset) and each warp matrix's addresses."""
    written, loads, stores = {}, defaultdict(list), defaultdict(list)
    for warp in range(WARPS):
        for step, c in enumerate(range(warp, CHUNKS, WARPS)):
            load_addr = [sw64_chunk(row0 + p_slot(load_row(l)), c, rows) for l in range(32)]
            store_addr = [vt_offset(16 * c + store_row(l)[0], store_row(l)[1]) for l in range(32)]
            for l in range(32):
                loads[warp, step, l // 8].append(load_addr[l])
                stores[warp, step, l // 8].append(store_addr[l])
            for l in range(32):
                # ldmatrix .trans (b16): register j of lane l holds element (2 (l % 4) + e, l / 4) of
                # matrix j, e = 0 in the low half; element (row, col) = 2 bytes at row's address + 2 col
                regs = []
                for j in range(4):
                    reg = []
                    for e in range(2):
                        base = load_addr[8 * j + 2 * (l % 4) + e] + 2 * (l // 4)
                        reg += [base, base + 1]
                    regs.append(reg)
                first, second = selectors(l)
                out = [byte_perm(regs[0], regs[1], first), byte_perm(regs[0], regs[1], second),
                       byte_perm(regs[2], regs[3], first), byte_perm(regs[2], regs[3], second)]
                # stmatrix (b16): register j of lane l goes to matrix j's row l / 4, bytes 4 (l % 4) ..
                for j in range(4):
                    address = store_addr[8 * j + l // 4] + 4 * (l % 4)
                    for b in range(4):
                        assert address + b not in written
                        written[address + b] = out[j][b]
    return written, loads, stores


def wavefronts(matrices):
    total = 0
    for addresses in matrices.values():
        words = defaultdict(set)
        for a in addresses:
            for w in range(4):  # a row is 16 bytes: four banks
                words[(a // 4 + w) % 32].add(a // 4 + w)
        total += max(len(w) for w in words.values())
    return total


if __name__ == "__main__":
    for rows, row0 in [(32, 0), (64, 0), (64, 32)]:  # dual's half tiles; the two halves of wide's tiles
        expected = {vt_offset(n, k): sw64_chunk(row0 + p_slot(k), n // 16, rows) + n % 16
                    for n in range(D_V) for k in range(32)}
        written, loads, stores = transpose(rows, row0)
        assert written == expected, "not the transposition"
        figures = (wavefronts(loads), wavefronts(stores))
        print(f"landing tile of {rows} rows, rows {row0}..{row0 + 31}: wavefronts (ldmatrix, stmatrix) {figures}, "
              f"matrices {len(loads)} + {len(stores)}")
        assert figures == (len(loads), len(stores)), "a conflict left"

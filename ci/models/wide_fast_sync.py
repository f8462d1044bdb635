"""A model of the wide_fast kernel's synchronization, checked on the CPU: its producer (work.cuh's
produce() with two V^T tiles) and its two consumer warpgroups (wide_fast/prefill_kernel.cuh), one
warpgroup per process, as the sequences of named-barrier and mbarrier operations they run, under random
schedules over random items (0 to 5 tiles each). Every schedule must end (no deadlock), leave no named
barrier with arrivals that nobody waits for, and keep the data straight: QK^T reads the tile the
landing buffer holds, P.V the tile the V^T buffer holds, and no buffer is written again before both
warpgroups have read it. The model follows the kernel by hand: change both together.

Usage: python3 ci/models/wide_fast_sync.py [SCHEDULES]"""
import sys

from sync_model import WG, Mbarrier, check, expect_holds, simulate

LANDING_BUFFERS, VT_BUFFERS = 2, 2
# the kernel's named barriers (wide_fast/prefill_kernel.cuh): landing empty, V^T empty, the turns
LANDING_EMPTY0, VT_EMPTY0, PRODUCERS, TURN0 = 1, 3, 5, 8


def run(tiles_per_item, seed):
    """Runs one CTA whose items have these tile counts; returns (deadlock or None, errors)."""
    landing_full = [Mbarrier(WG) for _ in range(LANDING_BUFFERS)]
    vt_full = [Mbarrier(WG) for _ in range(VT_BUFFERS)]
    landing, vt = [None] * LANDING_BUFFERS, [None] * VT_BUFFERS  # the CTA tile each buffer holds
    qk_done, pv_done = {}, {}  # CTA tile -> warpgroups whose QK^T / P.V of it is done
    errors = []
    total = sum(tiles_per_item)

    def producer():
        def gather(tile):
            b = tile % LANDING_BUFFERS
            if landing[b] is not None and qk_done.get(landing[b], 0) < 2:
                errors.append(f"landing {b} gathered (tile {tile}) before both QK^T of tile {landing[b]}")
            landing[b] = tile

        def transpose(tile):
            b = tile % VT_BUFFERS
            if vt[b] is not None and pv_done.get(vt[b], 0) < 2:
                errors.append(f"V^T {b} written (tile {tile}) before both P.V of tile {vt[b]}")
            if landing[tile % LANDING_BUFFERS] != tile:
                errors.append(f"transpose of tile {tile} read tile {landing[tile % LANDING_BUFFERS]}")
            vt[b] = tile

        n_gathered = 0
        if total > 0:  # kBuffers - 1 tiles ahead
            yield ("do", lambda: gather(0))
            n_gathered = 1
        for tile in range(total):
            yield ("mbar_arrive", landing_full[tile % LANDING_BUFFERS])
            if tile >= 1:
                yield ("sync", LANDING_EMPTY0 + (tile - 1) % LANDING_BUFFERS, 3 * WG)
            if n_gathered < total:
                yield ("do", lambda t=n_gathered: gather(t))
                n_gathered += 1
            yield ("sync", PRODUCERS, WG)
            if tile >= VT_BUFFERS:  # wait_v16_free(tile, half 0)
                yield ("sync", VT_EMPTY0 + tile % VT_BUFFERS, 3 * WG)
            yield ("do", lambda t=tile: transpose(t))
            yield ("mbar_arrive", vt_full[tile % VT_BUFFERS])  # announce_converted(tile, half 1)
        if n_gathered >= 1:
            yield ("sync", LANDING_EMPTY0 + (n_gathered - 1) % LANDING_BUFFERS, 3 * WG)
            for tile in range(max(n_gathered, VT_BUFFERS), n_gathered + VT_BUFFERS):
                yield ("sync", VT_EMPTY0 + tile % VT_BUFFERS, 3 * WG)

    def consumer(wg):
        def read(kind, tile, held):
            return expect_holds(errors, f"warpgroup {wg}: {kind}", tile, held)

        def done(table, tile):
            return ("do", lambda: table.__setitem__(tile, table.get(tile, 0) + 1))

        if wg == 1:
            yield ("arrive", TURN0, 2 * WG)
        cta_tile = 0
        for n_tiles in tiles_per_item:
            for tile in range(n_tiles):
                c, with_pv = cta_tile, tile > 0
                yield ("mbar_wait", landing_full[c % LANDING_BUFFERS], (c // LANDING_BUFFERS) & 1)
                if with_pv:
                    yield ("mbar_wait", vt_full[(c - 1) % VT_BUFFERS], ((c - 1) // VT_BUFFERS) & 1)
                yield ("sync", TURN0 + wg, 2 * WG)
                yield read("QK^T", c, lambda c=c: landing[c % LANDING_BUFFERS])
                if with_pv:
                    yield read("P.V", c - 1, lambda c=c: vt[(c - 1) % VT_BUFFERS])
                yield ("arrive", TURN0 + (wg ^ 1), 2 * WG)
                yield done(qk_done, c)
                yield ("arrive", LANDING_EMPTY0 + c % LANDING_BUFFERS, 3 * WG)
                if with_pv:
                    yield done(pv_done, c - 1)
                    yield ("arrive", VT_EMPTY0 + (c - 1) % VT_BUFFERS, 3 * WG)
                cta_tile += 1
            if n_tiles > 0:  # the last tile's P.V, a turn of its own
                c = cta_tile - 1
                yield ("mbar_wait", vt_full[c % VT_BUFFERS], (c // VT_BUFFERS) & 1)
                yield ("sync", TURN0 + wg, 2 * WG)
                yield read("P.V", c, lambda c=c: vt[c % VT_BUFFERS])
                yield ("arrive", TURN0 + (wg ^ 1), 2 * WG)
                yield done(pv_done, c)
                yield ("arrive", VT_EMPTY0 + c % VT_BUFFERS, 3 * WG)
        if wg == 0:
            yield ("sync", TURN0, 2 * WG)

    procs = {"producer": producer(), "consumer 0": consumer(0), "consumer 1": consumer(1)}
    return simulate(procs, seed, errors), errors


def main():
    sys.exit(0 if check(run, int(sys.argv[1]) if len(sys.argv) > 1 else 3000) else 1)


if __name__ == "__main__":
    main()

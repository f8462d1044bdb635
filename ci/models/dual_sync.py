"""A model of the dual kernel's synchronization, checked on the CPU: its producer warpgroup
(dual/prefill_kernel.cuh's produce_half_tiles) and its consumer warpgroup (dual::prefill), one process
each, as the sequences of named-barrier operations they run, under random schedules over random items
(0 to 5 tiles, i.e. twice as many half tiles, each), in each configuration of landing half tiles and
gather lead (dual_fast: 3, the gather of c + 2 after QK^T of c - 1; the exact kernel: 3 at d_qk 512 and
2 at 576, the gather into c's buffer after QK^T of c), with the one V half tile of both precisions
(fp16 in the exact kernel, e4m3 V^T in dual_fast).
Every schedule must end (no deadlock), leave no named barrier with arrivals that nobody waits for, and
keep the data straight: QK^T reads the half tile its landing buffer holds, P.V the one its V buffer
holds, the producer converts or transposes V from the landing buffer that holds its half tile, and no
buffer is written again before its reader is done. The model follows the kernel by hand: change both
together.

Usage: python3 ci/models/dual_sync.py [SCHEDULES]"""
import sys

from sync_model import WG, check, expect_holds, simulate

# the kernel's named barriers (dual/prefill_kernel.cuh), for up to 3 landing buffers and the one V
LANDING_FULL0, LANDING_EMPTY0, V_FULL, V_EMPTY, PRODUCERS = 1, 4, 7, 8, 10
THREADS = 2 * WG  # Traits::kThreads: a consumer and a producer warpgroup
# (landing half tiles, the producer's kLead): dual_fast, the exact kernel at d_qk 512 and at 576
CONFIGS = [(3, 0), (3, 1), (2, 1)]


def run_config(tiles_per_item, seed, landing_buffers, lead):
    landing = [None] * landing_buffers  # the CTA half tile each landing buffer holds
    v = None  # the CTA half tile the V buffer holds
    qk_done, pv_done = set(), set()  # CTA half tiles whose QK^T / P.V is done
    errors = []
    units = 2 * sum(tiles_per_item)

    def producer():
        state = {"gathered": 0}

        def gather():
            u = state["gathered"]
            b = u % landing_buffers
            if landing[b] is not None and landing[b] not in qk_done:
                errors.append(f"landing {b} gathered (half tile {u}) before QK^T of {landing[b]}")
            landing[b] = u
            state["gathered"] += 1

        def transpose(c):
            nonlocal v
            if v is not None and v not in pv_done:
                errors.append(f"V written (half tile {c}) before P.V of {v}")
            if landing[c % landing_buffers] != c:
                errors.append(f"V of half tile {c} read from half tile {landing[c % landing_buffers]}")
            v = c

        def gather_next():
            if state["gathered"] < units:
                yield ("do", gather)

        def announce(c):
            if landing[c % landing_buffers] != c:
                errors.append(f"half tile {c} announced where the buffer holds {landing[c % landing_buffers]}")
            return ("arrive", LANDING_FULL0 + c % landing_buffers, THREADS)

        for _ in range(landing_buffers - 1 + lead):
            yield from gather_next()
        if landing_buffers >= 3 and state["gathered"] >= 1:
            yield announce(0)
        c = 0
        while c < state["gathered"]:
            if landing_buffers >= 3:
                if c + 1 < state["gathered"]:
                    yield announce(c + 1)
            else:
                yield announce(c)
            if c >= 1:  # P.V of c - 1 has read the V buffer
                yield ("sync", V_EMPTY, THREADS)
            yield ("sync", PRODUCERS, WG)  # dual_fast only (the producer's own barrier: no hazard either way)
            yield ("do", lambda c=c: transpose(c))
            yield ("arrive", V_FULL, THREADS)
            if c + lead >= 1:  # QK^T of c - 1 + lead done
                yield ("sync", LANDING_EMPTY0 + (c + lead - 1) % landing_buffers, THREADS)
            yield from gather_next()
            c += 1
        n = state["gathered"]
        if n >= 1:
            if lead == 0:
                yield ("sync", LANDING_EMPTY0 + (n - 1) % landing_buffers, THREADS)
            yield ("sync", V_EMPTY, THREADS)

    def consumer():
        cta_half = 0
        for n_tiles in tiles_per_item:
            for tile in range(n_tiles):
                for h in range(2):
                    c = cta_half
                    yield ("sync", LANDING_FULL0 + c % landing_buffers, THREADS)
                    yield expect_holds(errors, "QK^T", c, lambda c=c: landing[c % landing_buffers])
                    if tile > 0 or h > 0:  # inside QK^T: the P.V before it is done
                        yield ("do", lambda c=c: pv_done.add(c - 1))
                        yield ("arrive", V_EMPTY, THREADS)
                    yield ("do", lambda c=c: qk_done.add(c))
                    yield ("arrive", LANDING_EMPTY0 + c % landing_buffers, THREADS)
                    yield ("sync", V_FULL, THREADS)
                    yield expect_holds(errors, "P.V", c, lambda: v)
                    cta_half += 1
            if n_tiles > 0:  # the item's end waits for its last P.V
                yield ("do", lambda c=cta_half - 1: pv_done.add(c))
                yield ("arrive", V_EMPTY, THREADS)

    procs = {"producer": producer(), "consumer": consumer()}
    return simulate(procs, seed, errors), errors


def run(tiles_per_item, seed):
    """Runs one CTA whose items have these tile counts in each configuration; returns (the first
    deadlock or None, every configuration's errors)."""
    deadlock, errors = None, []
    for landing_buffers, lead in CONFIGS:
        name = f"{landing_buffers} landing, lead {lead}"
        d, e = run_config(tiles_per_item, seed, landing_buffers, lead)
        deadlock = deadlock or (d and f"{name}: {d}")
        errors += [f"{name}: {x}" for x in e]
    return deadlock, errors


def main():
    sys.exit(0 if check(run, int(sys.argv[1]) if len(sys.argv) > 1 else 3000) else 1)


if __name__ == "__main__":
    main()

"""What the synchronization models in ci/models/ (*_sync.py) share: named barriers and mbarriers at
warpgroup granularity, and a scheduler that runs processes (generators of operations) in a random
order until they end or none can go on.

Operations: ("sync", id, threads) and ("arrive", id, threads) on a named barrier (bar.sync, bar.arrive:
a phase completes once `threads` threads have arrived); ("mbar_arrive", mbarrier) and ("mbar_wait",
mbarrier, parity) (mbarrier.try_wait.parity: the phase of that parity has completed); ("do", f) runs
f, the model's check of the data."""
import random

WG = 128  # threads of a warpgroup: one process of a model


class Named:
    def __init__(self):
        self.arrived, self.threads, self.waiting, self.released = 0, None, [], set()


class Mbarrier:
    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0


def simulate(procs, seed, errors):
    """Runs the processes (name -> generator) under one random schedule; returns a deadlock's
    description or None, and adds to errors a named barrier left with arrivals nobody waits for."""
    rng = random.Random(seed)
    named = {}

    def step(name, op, seq):
        """Whether the process can take op now (and takes it)."""
        kind = op[0]
        if kind == "do":
            op[1]()
            return True
        if kind == "mbar_arrive":
            m = op[1]
            m.pending -= WG
            if m.pending == 0:
                m.phase, m.pending = m.phase + 1, m.count
            return True
        if kind == "mbar_wait":
            return (op[1].phase & 1) != op[2]
        bar = named.setdefault(op[1], Named())
        key = (name, seq)
        if key in bar.released:
            return True
        if key not in bar.waiting:
            if bar.threads is None:
                bar.threads = op[2]
            elif bar.threads != op[2]:
                errors.append(f"barrier {op[1]}: {op[2]} threads where its phase has {bar.threads}")
            bar.arrived += WG
            bar.waiting.append(key)
        if bar.arrived >= bar.threads:
            bar.released, bar.waiting, bar.arrived, bar.threads = set(bar.waiting), [], 0, None
            return True
        return kind == "arrive"

    pending, seq = {}, {name: 0 for name in procs}
    while True:
        for name, proc in procs.items():
            if name not in pending:
                op = next(proc, None)
                if op is not None:
                    pending[name], seq[name] = op, seq[name] + 1
        if not pending:
            break
        names = list(pending)
        rng.shuffle(names)
        for name in names:
            if step(name, pending[name], seq[name]):
                del pending[name]
                break
        else:
            return "deadlock: " + ", ".join(f"{n} at {pending[n][0]} {pending[n][1]}" for n in pending)
    for bid, bar in named.items():
        if bar.arrived:
            errors.append(f"barrier {bid} left with {bar.arrived} arrivals")
    return None


def expect_holds(errors, what, tile, held):
    """A ("do") operation: the buffer that `what` reads holds `tile` (held() says which it holds)."""
    def check_held():
        if held() != tile:
            errors.append(f"{what} of tile {tile} read tile {held()}")
    return ("do", check_held)


def check(run, schedules, item_choices=(0, 1, 2, 3, 5), max_items=5):
    """Runs `schedules` random item lists (up to max_items items, each of one of item_choices tiles)
    through run(items, seed); prints the first bad ones and how many were clean; returns whether all
    were."""
    bad = 0
    for seed in range(schedules):
        rng = random.Random(seed)
        items = [rng.choice(item_choices) for _ in range(rng.randint(0, max_items))]
        deadlock, errors = run(items, seed)
        if deadlock or errors:
            bad += 1
            if bad <= 5:
                print(items, deadlock, errors[:3])
    print(f"{schedules - bad} of {schedules} schedules clean")
    return bad == 0

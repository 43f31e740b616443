"""Interleaved A/B of the registry's client paths between two source trees (each with its extensions built).

    .venv/bin/python bench/ab_registry.py --compare BEFORE_ROOT AFTER_ROOT [--reps 3] [--twin]
    .venv/bin/python bench/ab_registry.py ROOT CASE N ROUNDS          # one measurement, one JSON line

Each measurement runs in a process of its own with ROOT first on sys.path (the tree's ``engine`` is asserted to be
the one imported), so the trees' compiled modules never meet. ``--compare`` alternates the trees case by case,
``--reps`` times, and prints every figure and, per case, the min over the repetitions (on a shared machine the min
is the figure of a run that was not preempted). Times are wall-clock per operation, min over ROUNDS batches of 1,000:

* ``new N``: 1,000 new clients (open_channel with an IPv4 address + the first heartbeat of a Java push consumer with
  its inner producer, 50 groups) join a registry of N registered clients; ``close_us``: the same 1,000 close
  (Java's log lines go through the registry's per-minute budget as in the broker; logging has a NullHandler);
* ``changed``: one client's heartbeat with its subVersion bumped every time (the full rules, no CHANGE);
* ``steady N``: the armed repeat of an unchanged decoded heartbeat among N clients;
* ``scan N``: ClientRegistry.scan_expired over N registered clients, none expired;
* ``memory N``: bench_registry.bytes_per_client(N) (tracemalloc of everything the registry allocates).

``--twin`` also runs new/changed/steady with ENGINE_NO_EXTENSIONS=1 (both trees' pure-Python twins).
"""
import gc
import json
import logging
import os
import subprocess
import sys
import time

B = 1000
CASES = [("new", 10_000, 10), ("new", 1_000_000, 5), ("changed", 0, 10), ("steady", 10_000, 20),
         ("scan", 100_000, 20), ("scan", 1_000_000, 10)]
TWIN_CASES = [("new", 10_000, 10), ("changed", 0, 10), ("steady", 10_000, 20)]


def measure(root, case, n, rounds):
    sys.path.insert(0, root)
    sys.path.insert(0, os.path.join(root, "bench"))
    logging.getLogger().addHandler(logging.NullHandler())
    logging.lastResort = None
    from bench_registry import address, java_heartbeat

    import engine
    from engine.codec.enums import LanguageCode
    from engine.registry.client_registry import ClientRegistry, RegistryConfig

    assert engine.__file__.startswith(os.path.abspath(root)), engine.__file__
    java = LanguageCode.JAVA
    if case == "new":
        reg = ClientRegistry(RegistryConfig(initial_capacity=max(n, 16) + B), clock=lambda: 0)
        for ch in range(n):
            reg.open_channel(ch, address(ch))
            reg.heartbeat(ch, java_heartbeat(ch), java, 479)
        hbs = [java_heartbeat(n + i) for i in range(B)]
        addrs = [address(n + i) for i in range(B)]
        best_new = best_close = float("inf")
        for _ in range(rounds):
            gc.collect()
            gc.disable()
            t0 = time.perf_counter()
            for i in range(B):
                reg.open_channel(n + i, addrs[i])
                reg.heartbeat(n + i, hbs[i], java, 479)
            t1 = time.perf_counter()
            for i in range(B):
                reg.close_channel(n + i)
            t2 = time.perf_counter()
            gc.enable()
            best_new = min(best_new, (t1 - t0) / B * 1e6)
            best_close = min(best_close, (t2 - t1) / B * 1e6)
        return {"new_us": round(best_new, 3), "close_us": round(best_close, 3)}
    if case == "changed":
        reg = ClientRegistry(clock=lambda: 0)

        def bumped(v):
            hb = java_heartbeat(0)
            cd = hb.consumers[0]
            subs = tuple(engine.SubscriptionData(s.topic, s.sub_string, s.tags, s.codes, s.sub_version + v)
                         for s in cd.subscriptions)
            return engine.HeartbeatData(hb.client_id, hb.producers, (engine.ConsumerData(
                cd.group, cd.consume_type, cd.message_model, cd.consume_from_where, cd.unit_mode, subs),))

        best = float("inf")
        for r in range(rounds):
            hbs = [bumped(r * B + v) for v in range(B)]  # versions keep growing across rounds
            t0 = time.perf_counter()
            for hb in hbs:
                reg.heartbeat(1, hb, java, 479)
            best = min(best, (time.perf_counter() - t0) / B * 1e6)
        return {"changed_us": round(best, 3)}
    if case == "steady":
        hbs = [java_heartbeat(i) for i in range(n)]
        reg = ClientRegistry(RegistryConfig(initial_capacity=n), clock=lambda: 0)
        for _ in range(2):  # register, then the no-op run that arms the fast path
            for ch, hb in enumerate(hbs):
                reg.heartbeat(ch, hb, java, 479)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for ch in range(B):
                reg.heartbeat(ch, hbs[ch], java, 479)
            best = min(best, (time.perf_counter() - t0) / B * 1e6)
        return {"steady_us": round(best, 3)}
    if case == "scan":
        reg = ClientRegistry(RegistryConfig(initial_capacity=n), clock=lambda: 0)
        for ch in range(n):
            reg.heartbeat(ch, java_heartbeat(ch), java, 479)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            assert reg.scan_expired(60_000) == []
            best = min(best, time.perf_counter() - t0)
        return {"scan_ms": round(best * 1e3, 3)}
    if case == "memory":
        import bench_registry

        per_client, arrays, _ = bench_registry.bytes_per_client(n)
        return {"bytes_per_client": round(per_client, 1), "array_bytes_per_client": round(arrays, 1)}
    raise SystemExit(f"unknown case {case!r}")


def compare(roots, reps, twin):
    best = {}
    runs = [(c, False) for c in CASES] + ([(c, True) for c in TWIN_CASES] if twin else [])
    for rep in range(reps):
        for (case, n, rounds), as_twin in runs:
            for root in roots:
                env = dict(os.environ)
                env.pop("ENGINE_NO_EXTENSIONS", None)
                if as_twin:
                    env["ENGINE_NO_EXTENSIONS"] = "1"
                out = subprocess.run([sys.executable, __file__, root, case, str(n), str(rounds)], env=env,
                                     capture_output=True, text=True, check=True).stdout
                figures = json.loads(out)
                impl = "twin" if as_twin else "native"
                print(impl, rep, root, case, n, json.dumps(figures), flush=True)
                for k, v in figures.items():
                    key = (impl, case, n, k, root)
                    best[key] = min(best.get(key, float("inf")), v)
    print("\nmin over repetitions (before -> after):")
    for impl, case, n, k, root in sorted({k[:4] + (None,) for k in best}, key=str):
        a, b = (best[(impl, case, n, k, r)] for r in roots)
        print(f"  {impl:6} {case:8} N={n:>9,} {k:16} {a:>10} -> {b}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--compare":
        reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 3
        compare([os.path.abspath(args[1]), os.path.abspath(args[2])], reps, "--twin" in args)
    else:
        root, case, n, rounds = args[0], args[1], int(args[2]), int(args[3])
        print(json.dumps(measure(os.path.abspath(root), case, n, rounds)))

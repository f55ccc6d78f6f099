import asyncio, time, numpy as np
from tests.test_workers import *
from tests.worker_models import Echo
async def main():
    ex = await started("Echo", 1)
    inproc = Echo(settings("Echo"))
    small = request(np.arange(4, dtype=np.float32))
    big = request(np.random.default_rng(0).random(1024*1024, dtype=np.float32))
    for name, req in (("small", small), ("4MiB", big)):
        for label, fn in (("inproc", inproc.predict), ("worker", ex.call_predict)):
            for _ in range(20): await fn(req)
            n = 300 if name == "small" else 100
            t = time.perf_counter()
            for _ in range(n): await fn(req)
            dt = (time.perf_counter() - t) / n
            print(f"{name:6} {label:7} {dt*1e6:9.1f} us/call (sequential)")
    # concurrency 8 small
    t = time.perf_counter()
    for _ in range(50): await asyncio.gather(*(ex.call_predict(small) for _ in range(8)))
    print("small worker conc8", (time.perf_counter()-t)/400*1e6, "us/req")
    await ex.stop()
import uvloop, sys
(uvloop.run if "uv" in sys.argv else asyncio.run)(main())
